"""One engine step, from a SchedulerOutput to the requests' updates (the engine loop, runtime/engine.py, calls run()):

    adapters activated (a damaged file fails only its requests)
    sampler rows per logits row (RowState; k drafts: k + 1 rows), grammar masks filled off-thread while the model runs
    ModelRunner.execute (or execute_steps: decode_steps chained greedy steps)   -- may be ended early (StepAbort)
    hidden_states and prompt logprobs to the output processor; Sampler.sample; speculative accept; grammars advanced
    Scheduler.update_from_output --> OutputProcessor.apply per request (runtime/output_processor.py)

A model run that raises fails only that step's requests (through the output processor); the engine goes on.
The step reads each request's params, random stream and matcher from its RequestState and ends none itself.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from .adapters import AdapterRegistry
from .guided import GuidedDecoding, consume, forced_tokens, unpack_mask
from .model_runner import ModelRunner
from .output_processor import OutputProcessor
from .sampler import RowState, Sampler, has_penalty
from .sampling_params import adapter_names
from .scheduler import Scheduler
from .scheduler_messages import ModelRunnerOutput, SchedulerOutput
from .speculative import accept


class StepAbort:
    """Ends the model run of a step whose rows were mostly cancelled, instead of finishing it.

    A prefill step of max_batch_tokens can take seconds on a busy CPU; a client that hung up would otherwise hold
    its KV blocks (and the engine) until that run ends. Engine.cancel() calls cancel(); once the cancelled rows
    hold at least half of the step's tokens, RunOptions.terminate makes ORT stop between two nodes and the run
    raises. Nothing of the step has been recorded then (the scheduler's update and the sampling come after the
    run; the KV it wrote is past every row's computed tokens), so the next schedule() frees the cancelled rows and
    plans the others again. The rule bounds the waste: each abort ends a run at least half of whose work was for
    requests that are gone, and a request cancels once."""

    def __init__(self, run_options):
        self._opts = run_options
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}          # req_id -> its tokens in the run now (not yet cancelled)
        self._tokens = self._cancelled = 0       # the run's tokens; of those, the cancelled rows'
        self.fired = False                       # terminate was set for the run now

    def begin(self, seqs) -> None:
        with self._lock:
            self._rows = {s.req_id: s.num_tokens for s in seqs}
            self._tokens, self._cancelled, self.fired = sum(self._rows.values()), 0, False

    def cancel(self, req_id: str) -> None:
        with self._lock:
            self._cancelled += self._rows.pop(req_id, 0)
            if not self.fired and self._tokens and 2 * self._cancelled >= self._tokens:
                self.fired = True
                self._opts.terminate = True

    def end(self) -> None:
        with self._lock:
            self._rows, self.fired = {}, False
            self._opts.terminate = False


class EngineStep:
    """The step of one engine (engine thread only). lock: the engine's, held around the scheduler's update;
    release_forks(req_id): queue the siblings waiting for a request that computed its prompt or ended."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, adapters: AdapterRegistry,
                 guided: GuidedDecoding, output: OutputProcessor, lock: threading.Condition,
                 release_forks: Callable[[str], None]):
        self.runner, self.scheduler, self.adapters, self.guided = runner, scheduler, adapters, guided
        self.output, self._lock, self._release_forks = output, lock, release_forks
        self.sampler = Sampler()
        self.abort = StepAbort(runner.run_options)
        self._masker = ThreadPoolExecutor(1, thread_name_prefix="ortllm-masks")   # masks while the model runs
        self.steps = 0                  # model steps (a multi-step schedule runs several)
        self.chained_steps = 0
        self.failed_steps = 0
        self.aborted_steps = 0          # model runs ended because most of their rows were cancelled
        self.last_error: tuple[float, str] | None = None   # (time.monotonic(), message)
        self.step_time = 0.0
        self.run_time = 0.0
        self._stop_key: frozenset[int] | None = None     # _stop_table's cache: the stop ids and their [V] table
        self._stop_tab: np.ndarray | None = None

    def close(self) -> None:
        self._masker.shutdown(wait=False)

    def stats(self, tokens_out: int) -> dict:
        """The steps' part of Engine.stats(); tokens_out: the tokens handed to requests so far."""
        err = self.last_error
        return {
            "steps": self.steps,
            # Python share of the step: its wall time outside session.run (building the run's inputs included)
            "python_overhead": (1 - self.run_time / self.step_time) if self.step_time else 0.0,
            "step_time_s": self.step_time, "run_time_s": self.run_time,
            "failed_steps": self.failed_steps,
            "aborted_steps": self.aborted_steps,    # model runs ended because most of their rows were cancelled
            "tokens_per_step": tokens_out / self.steps if self.steps else 0.0,
            # model steps fed the previous step's argmax without a schedule (SchedulerConfig.decode_steps)
            "chained_steps": self.chained_steps,
            "last_step_error": err[1] if err else None,
            "last_step_error_age_s": (time.monotonic() - err[0]) if err else None,
        }

    def run(self, out: SchedulerOutput, t0: float) -> None:
        """t0: when schedule() began; the step's Python share is everything but session.run."""
        slots, failed = self.adapters.activate(out.adapters)
        if failed:   # damaged adapter files: only their requests fail
            bad = [s for s in out.seqs if failed.keys() & set(adapter_names(s.adapter))]
            self._fail([s.req_id for s in bad], lambda rid: "; ".join(
                str(failed[n]) for n in self.output.states[rid].params.adapter_names if n in failed))
            out.seqs = [s for s in out.seqs if s not in bad]
            if not out.seqs:
                return
        self.adapters.prefetch(self.scheduler.queued_adapters())
        self.output.scheduled(out.seqs, time.monotonic())
        run0 = self.runner.run_time_s
        self.abort.begin(out.seqs)
        try:
            got = self._run_steps(out, slots) if out.decode_steps > 1 else self._run_step(out, slots)
        finally:
            self.abort.end()
        if got is None:           # the model run failed (its requests failed) or was aborted; the engine goes on
            return
        tokens, forced, alive, lp, steps = got
        run = self.runner.run_time_s - run0       # session.run alone: building its inputs is the step's Python
        with self._lock:
            updates = self.scheduler.update_from_output(out, ModelRunnerOutput(tokens, forced))
        for u in updates:
            self.output.apply(u, lp.get(u.req_id, ()), alive.get(u.req_id, True))
            if self.output.has_waiting(u.req_id):
                self._release_forks(u.req_id)
        self.steps += steps
        self.chained_steps += steps - 1
        self.run_time += run
        self.step_time += time.perf_counter() - t0

    def _run_step(self, out: SchedulerOutput, slots: dict[str | None, int]):
        """One model step and its sampling: (req_id -> new tokens, req_id -> forced tokens, req_id -> whether its
        grammar goes on, req_id -> logprobs, 1), or None when the model run failed."""
        states = self.output.states
        rows = [s for s in out.seqs if s.needs_logits]
        row_states, first = [], []        # one sampler state per logits row; first[i]: rows[i]'s first state
        for s in rows:
            first.append(len(row_states))
            row_states += self._row_states(s)
        # guided rows: a mask per state (their drafts are the grammar's forced tokens)
        guided = [i for i, s in enumerate(rows) if states[s.req_id].matcher is not None]
        masks = (self._masker.submit(self.guided.fill_masks, [states[rows[i].req_id].matcher for i in guided],
                                     [rows[i].spec_token_ids for i in guided]) if guided else None)
        scored = [s for s in out.seqs if self.output.wants_prompt_logprobs(s)]
        try:
            logits = self.runner.execute(out.seqs, adapter_slots=slots, all_logits=bool(scored))
        except Exception as e:  # noqa: BLE001 - this step's requests fail; the engine goes on
            if masks is not None:
                masks.result()
            self._run_failed(out, e)
            return None
        if len(self.runner.hidden):
            self.output.keep_hidden(out.seqs, self.runner.hidden)
        if scored:
            logits = self.output.record_prompt_logprobs(out.seqs, logits)
        if masks is not None:
            words = masks.result()
            row = 0
            for i in guided:
                for j in range(1 + len(rows[i].spec_token_ids)):
                    row_states[first[i] + j].mask = unpack_mask(words[row], logits.shape[1])
                    row += 1
        sampled = self.sampler.sample(logits, row_states, self.runner.argmax)      # None after all_logits
        ids = sampled.token_ids.tolist()
        tokens = {s.req_id: accept(s.spec_token_ids, ids[o:o + 1 + len(s.spec_token_ids)]) for s, o in zip(rows, first)}
        alive, forced = self._advance_grammars([rows[i].req_id for i in guided], tokens)
        lp = {s.req_id: sampled.logprobs[o:o + len(tokens[s.req_id])] for s, o in zip(rows, first)}
        return tokens, forced, alive, lp, 1

    def _run_steps(self, out: SchedulerOutput, slots: dict[str | None, int]):
        """out.decode_steps greedy model steps, each fed the previous one's argmax (SchedulerConfig.decode_steps),
        ending after a step that gave a stop token: as _run_step, with up to decode_steps tokens a request."""
        try:
            toks = self.runner.execute_steps(out.seqs, slots, out.decode_steps, self._stop_table(out.seqs))
        except Exception as e:  # noqa: BLE001 - this step's requests fail; the engine goes on
            self._run_failed(out, e)
            return None
        tokens = {s.req_id: col for s, col in zip(out.seqs, toks.T.tolist())}
        return tokens, {}, {}, {}, len(toks)

    def _stop_table(self, seqs) -> np.ndarray | None:
        """bool [V]: the token ids that end one of these seqs (each request's stop_ids, which the scheduler keeps
        from its arrival); None: none. Kept while the set stays the same (a decode batch keeps its requests for
        many steps)."""
        ids: set[int] = set()
        for s in seqs:
            req = self.scheduler.get_request(s.req_id)
            if req is not None:
                ids |= req.stop_ids
        if not ids:
            return None
        key = frozenset(ids)
        if key != self._stop_key:
            table = np.zeros(self.runner.vocab_size, bool)
            table[[i for i in key if 0 <= i < len(table)]] = True
            self._stop_key, self._stop_tab = key, table
        return self._stop_tab

    def _run_failed(self, out: SchedulerOutput, e: Exception) -> None:
        if self.abort.fired:     # ended for its cancelled rows: the others run again from the next schedule()
            self.aborted_steps += 1
            return
        self.failed_steps += 1
        self.last_error = (time.monotonic(), f"{type(e).__name__}: {e}")
        reason = f"model run failed: {e}"
        self._fail([s.req_id for s in out.seqs], lambda rid: reason)

    def _advance_grammars(self, req_ids: list[str], tokens: dict[str, list[int]]
                          ) -> tuple[dict[str, bool], dict[str, list[int]]]:
        """Consume each guided request's new tokens; those after the one that completes the grammar are dropped
        from tokens[req_id] (a row verified after its last draft: plain decoding ends there). Returns req_id ->
        whether more may follow (False: the grammar is complete or broken), and req_id -> the tokens its grammar
        forces next (the scheduler's drafts for it; none for speculative=False)."""
        alive, forced = {}, {}
        for rid in req_ids:
            st, toks = self.output.states[rid], tokens[rid]
            n, more = 0, True
            while more and n < len(toks):
                more = consume(st.matcher, toks[n])
                n += 1
            tokens[rid], alive[rid] = toks[:n], more
            if more and st.params.speculative:
                forced[rid] = forced_tokens(st.matcher)
        return alive, forced

    def _fail(self, req_ids: list[str], message: Callable[[str], str]) -> None:
        self.output.fail(req_ids, message)
        for rid in req_ids:
            if self.output.has_waiting(rid):
                self._release_forks(rid)

    def _row_states(self, s) -> list[RowState]:
        """The sampler rows of one scheduled seq: one, or with k drafts k + 1 (row j sees drafts[:j] as output)."""
        st = self.output.states[s.req_id]
        d = s.spec_token_ids
        if not has_penalty(st.params):   # the history only feeds penalties: not copied for the rest
            return [RowState(st.params, st.generator, draft=d[j] if j < len(d) else -1) for j in range(len(d) + 1)]
        req = self.scheduler.get_request(s.req_id)
        out = req.output_token_ids if req else []
        return [RowState(st.params, st.generator, out + d[:j] if j else out, st.prompt_ids,
                         draft=d[j] if j < len(d) else -1) for j in range(len(d) + 1)]
