"""The engine: continuous batching over one engine-graph session, served from its own thread.

    callers (any thread) --submit--> InputProcessor (runtime/request_input.py: checks, SequenceLimits, handles)
                                     --> Scheduler queue
    engine thread, per step:  schedule() -> ModelRunner.execute() -> Sampler -> update_from_output()   (this module)
                              -> OutputProcessor (runtime/request_output.py: detokenizer, stop strings, logprobs,
                                 pooled embeddings) -> each request's handle (text deltas, result)

This module is the core loop and the public API; the input and output sides are their own modules, and what a
sequence may hold is runtime/limits.py's (Engine.limits). Direct steps outside the loop (Engine.execute,
Engine.scorer) serve scoring and benchmarks while the engine is idle: nothing outside runtime/ reaches its runner.

Embedding requests (submit_embed, embed) are prefill-only rows of the same steps; the graph's hidden_states
give their final hidden states, pooled (runtime/pooling.py) when their last chunk has run.

A session.run that raises fails only the requests of that step (finish_reason "error", blocks freed);
the engine keeps serving. Anything else that escapes the loop is fatal: every pending request gets
EngineDeadError and later submits raise it.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .adapters import AdapterRegistry
from .artifact import load_artifact
from .config import EngineConfig
from .contract import TOKENIZER as TOKENIZER_JSON
from .errors import EngineDeadError, OrtllmError, RequestError
from .guided import GuidedDecoding, consume, forced_tokens, unpack_mask
from .model_runner import KVPoolLayout, ModelRunner
from .pooling import normalize as l2_normalize
from .sampler import RowState, Sampler, has_penalty
from .speculative import accept
from .sampling_params import SamplingParams, adapter_names
from .scheduler import Scheduler
from .scheduler_messages import ERROR, ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from .request_input import InputProcessor
from .request_output import CompletionOutput, OutputProcessor, RequestHandle
from .scoring import WindowScorer
from .tokenizer import Tokenizer


def engine_config(path: str | Path, **overrides) -> EngineConfig:
    """EngineConfig for an artifact: its KV block size and context length unless overridden."""
    manifest = load_artifact(path, verify=False).manifest
    overrides.setdefault("block_size", manifest["build"].get("kv_block_size", 16))
    overrides.setdefault("max_model_len", manifest["model"]["max_position_embeddings"])
    return EngineConfig.from_overrides(path, **overrides)


class _StepAbort:
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


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.artifact = load_artifact(config.artifact)
        self.tokenizer = Tokenizer.from_dir(self.artifact.path)
        gen = self.artifact.read_json("generation.json")
        self.eos_token_ids = tuple(gen["eos_token_ids"])
        self.context_length = gen["context_length"]
        self.runner = ModelRunner(self.artifact, config)
        self._abort = _StepAbort(self.runner.run_options)
        self.adapters = AdapterRegistry(self.artifact, config.adapters, self.runner)
        self.scheduler = Scheduler(config.scheduler, config.cache, num_blocks=self.runner.num_blocks,
                                   eos_token_ids=self.eos_token_ids,
                                   is_resident=self.adapters.is_resident,
                                   adapter_key=self.adapters.content_key, context_length=self.context_length)
        self.limits = self.scheduler.limits     # how many tokens a sequence may hold (runtime/limits.py)
        self.sampler = Sampler()
        self.guided = GuidedDecoding(self.artifact.path / TOKENIZER_JSON, self.runner.vocab_size, self.eos_token_ids)
        # the input side: prompts and params checked and made into handles before anything is queued
        self.input = InputProcessor(self, self.tokenizer, self.limits, self.adapters, self.guided, self.eos_token_ids,
                                    self.runner.vocab_size, self.runner.hidden_size, config.seed,
                                    config.scheduler.max_adapters_per_batch)
        self._masker = ThreadPoolExecutor(1, thread_name_prefix="ortllm-masks")   # masks while the model runs
        self._forks: dict[str, list[RequestHandle]] = {}   # parent req_id -> n-1 siblings waiting for its prefill
        # the output side: each request's handle by id, and what the steps' updates give them
        self.output = OutputProcessor(self.scheduler.finish_requests)
        self._handles = self.output.handles
        self._cv = threading.Condition()
        self._stop = False
        self._dead: BaseException | None = None
        self._steps = 0                 # model steps (a multi-step schedule runs several)
        self._chained_steps = 0
        self._failed_steps = 0
        self._aborted_steps = 0
        self._last_step_error: tuple[float, str] | None = None   # (time.monotonic(), message)
        self._step_time = 0.0
        self._run_time = 0.0
        self._stop_key: frozenset[int] | None = None     # _stop_table's cache: the stop ids and their [V] table
        self._stop_tab: np.ndarray | None = None
        self._thread = threading.Thread(target=self._loop, name="ortllm-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_artifact(cls, path: str | Path, **overrides) -> "Engine":
        """Load an engine-graph artifact; overrides are EngineConfig keys (max_batch_tokens=..., num_blocks=...)."""
        return cls(engine_config(path, **overrides))

    # ---------------------------------------------------------------- requests in
    def encode_prompt(self, prompt: str | Sequence[int], param: str = "prompt", special_tokens: bool = True,
                      whole: bool = True) -> list[int]:
        """Token ids of a prompt, checked as submit checks it (runtime/request_input.py): text encoded with the
        tokenizer's special tokens (special_tokens=False: a chat template's text), token ids as given."""
        return self.input.encode_prompt(prompt, param, special_tokens, whole)

    def submit(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
               request_id: str | None = None) -> RequestHandle:
        """Queue one request (text or token ids); thread-safe. Raises RequestError / Overloaded at once."""
        return self.submit_n(prompt, params, 1, request_id)[0]

    def submit_n(self, prompt: str | Sequence[int], params: SamplingParams | None = None, n: int = 1,
                 request_id: str | None = None) -> list[RequestHandle]:
        """n completions of one prompt (OpenAI's `n`): one prefill, then n continuations. The first runs at
        once; the others join when its prompt is in the KV cache, so they take its blocks from the prefix
        cache and compute only the last, partial block. Each has its own random stream: with a seed, the
        first is the same as an n = 1 request with that seed and the i-th draws from (seed, i).
        Ids: request_id, request_id-1, ..., request_id-(n-1)."""
        if self._dead is not None:
            raise EngineDeadError("the engine stopped after an internal error; restart it") from self._dead
        handles = self.input.generation(prompt, params, n, request_id)
        base, ids, params = handles[0].request_id, handles[0].prompt_ids, handles[0].params
        with self._cv:
            self.scheduler.add_request(base, ids, params)
            self._handles[base] = handles[0]
            if n > 1:
                self._forks[base] = handles[1:]
            self._cv.notify()
        if params.adapter_names:           # from disk to host RAM while it waits (no-op if in a slot or RAM)
            self.adapters.prefetch(list(params.adapter_names))
        return handles

    def _release_forks(self, parent_id: str) -> None:
        """The parent's prompt is computed (or the parent ended): queue its waiting siblings."""
        with self._cv:
            for h in self._forks.pop(parent_id, []):
                try:
                    self.scheduler.add_request(h.request_id, h.prompt_ids, h.params)
                except OrtllmError as e:
                    h._finish(ERROR, str(e))
                    continue
                self._handles[h.request_id] = h

    def generate(self, prompts: str | Sequence[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        """Run prompts concurrently; returns their completions in order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        handles = [self.submit(p, sp) for p, sp in zip(prompts, plist)]
        return [h.result() for h in handles]

    def submit_embed(self, prompt: str | Sequence[int], pooling: str = "mean", adapter: str | None = None,
                     priority: int = 0, request_id: str | None = None) -> RequestHandle:
        """Queue one embedding request (text or token ids); thread-safe. It runs as prefill-only rows in the same
        steps as generation; result().embedding is its pooled final hidden state [H] (runtime/pooling.py; not
        normalized). Raises RequestError (empty or longer than the context), Overloaded at once."""
        if self._dead is not None:
            raise EngineDeadError("the engine stopped after an internal error; restart it") from self._dead
        h = self.input.embedding(prompt, pooling, adapter, priority, request_id)
        with self._cv:
            self.scheduler.add_request(h.request_id, h.prompt_ids, h.params)
            self._handles[h.request_id] = h
            self._cv.notify()
        return h

    def embed(self, inputs: str | Sequence[str | Sequence[int]], pooling: str = "mean", adapter: str | None = None,
              normalize: bool = True) -> np.ndarray:
        """Embeddings of texts (or token id lists), run concurrently: [N, H] float32, L2-normalized unless
        normalize=False. pooling: "mean" over each input's tokens or its "last" token's final hidden state."""
        if isinstance(inputs, str) or (len(inputs) and isinstance(inputs[0], (int, np.integer))):
            inputs = [inputs]
        handles: list[RequestHandle] = []
        try:
            for x in inputs:
                handles.append(self.submit_embed(x, pooling, adapter))
            outs = [h.result() for h in handles]
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        bad = next((o for o in outs if o.embedding is None), None)
        if bad is not None:
            raise RequestError(f"embedding request {bad.request_id} ended with {bad.finish_reason}: {bad.error}")
        vecs = np.stack([o.embedding for o in outs]) if outs else np.zeros((0, self.runner.hidden_size), np.float32)
        return l2_normalize(vecs) if normalize else vecs

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Text deltas of one completion as they are produced."""
        return iter(self.submit(prompt, params))

    def add_adapter(self, name: str, entry: dict) -> None:
        """Serve an adapter just written into the artifact (runtime/adapter_files.py add_adapter's entry)."""
        self.adapters.add(name, entry)

    def retire_adapter(self, name: str) -> None:
        """Refcounted unload: refused for new requests now, dropped once no request in flight uses it."""
        self.adapters.retire(name)
        with self._cv:
            self._cv.notify()

    def cancel(self, request_id: str) -> None:
        with self._cv:
            for kids in self._forks.values():     # a sibling still waiting for its parent's prefill
                for h in kids:
                    if h.request_id == request_id:
                        kids.remove(h)
                        h._finish("cancelled")
                        return
        self.scheduler.finish_requests(request_id, "cancelled")
        self._abort.cancel(request_id)            # may end the model run in progress (_StepAbort)
        with self._cv:
            self._cv.notify()

    def stats(self) -> dict:
        s = self.scheduler.stats()
        return {
            "steps": self._steps, "running": s.num_running, "waiting": s.num_waiting,
            "preemptions": s.num_preemptions, "kv_blocks_total": s.num_usable_blocks,
            "kv_blocks_free": s.num_free_blocks, "kv_usage": s.kv_usage,
            "prefix_cache_hit_rate": s.prefix_cache_hit_rate, "tokens_generated": self.output.tokens_out,
            "kv_pool_bytes": self.runner.kv_pool_bytes(),
            # Python share of the step: its wall time outside session.run (building the run's inputs included)
            "python_overhead": (1 - self._run_time / self._step_time) if self._step_time else 0.0,
            "step_time_s": self._step_time, "run_time_s": self._run_time,
            "failed_steps": self._failed_steps,
            "aborted_steps": self._aborted_steps,    # model runs ended because most of their rows were cancelled
            # speculative decoding: draft tokens verified / accepted, decode rows that carried drafts
            "spec_drafted": s.spec_drafted, "spec_accepted": s.spec_accepted, "spec_rows": s.spec_rows,
            "spec_acceptance_rate": s.spec_acceptance_rate, "spec_propose_time_s": s.spec_propose_time_s,
            # guided requests: tokens their grammar forced, verified as drafts / accepted (runtime/guided.py)
            "forced_drafted": s.forced_drafted, "forced_accepted": s.forced_accepted,
            "tokens_per_step": self.output.tokens_out / self._steps if self._steps else 0.0,
            # model steps fed the previous step's argmax without a schedule (SchedulerConfig.decode_steps)
            "chained_steps": self._chained_steps,
            "last_step_error": self._last_step_error[1] if self._last_step_error else None,
            "last_step_error_age_s": (time.monotonic() - self._last_step_error[0]) if self._last_step_error else None,
        }

    @property
    def vocab_size(self) -> int:
        """Rows of the model's logits: every token id a request may name is below it."""
        return self.runner.vocab_size

    @property
    def hidden_size(self) -> int:
        """Width of the final hidden state (the embeddings' full dimension)."""
        return self.runner.hidden_size

    @property
    def kv_pool(self) -> KVPoolLayout:
        """The KV pool this engine's session holds: dtype, block size, blocks, bytes."""
        return self.runner.kv_layout()

    # ---------------------------------------------------------------- direct steps (scoring, benchmarks)
    # The model run the loop makes, called from outside it: only while the engine is idle (no request in flight),
    # since they write the KV pool's blocks the caller names and share the session's output buffers.
    def scorer(self) -> WindowScorer:
        """Logits of whole token windows through this engine's session (runtime/scoring.py; KV in blocks 1..)."""
        return WindowScorer(self.runner)

    def execute(self, seqs: list[ScheduledSeq], adapter_slots: dict[str | None, int] | None = None,
                all_logits: bool = False) -> np.ndarray:
        """One model step of these seqs, as the loop runs it (ModelRunner.execute): logits [R, V] of their
        needs_logits rows (a view the next step overwrites), or [T, V] of every row (all_logits). adapter_slots:
        from engine.adapters.activate(names), which loads the seqs' adapters into session slots."""
        return self.runner.execute(seqs, adapter_slots=adapter_slots, all_logits=all_logits)

    def end_profiling(self) -> str:
        """Stop ORT's per-node profile (ORTLLM_ORT_PROFILE set at load); the path of its JSON trace."""
        return self.runner.session.end_profiling()

    @property
    def dead(self) -> BaseException | None:
        """The fatal error that stopped the engine loop, or None while it serves."""
        return self._dead

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=30)
        self._masker.shutdown(wait=False)
        self.adapters.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- the loop
    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stop and not self.scheduler.has_unfinished_requests():
                        self.adapters.sweep(set())      # idle: no request uses a retired adapter
                        self._cv.wait()
                    if self._stop:
                        break
                    t0 = time.perf_counter()
                    out = self.scheduler.schedule()
                self._finish(out.finished)
                self.adapters.sweep({n for h in list(self._handles.values()) for n in h.params.adapter_names})
                if not out.seqs:
                    time.sleep(0.001)   # only finishes this step, or nothing admissible yet
                    continue
                self._step(out, t0)
        except BaseException as e:  # noqa: BLE001 - fatal: fail everyone, refuse new work
            self._dead = e
            waiting = [h for kids in self._forks.values() for h in kids]
            for h in list(self._handles.values()) + waiting:
                h._finish(ERROR, f"engine stopped: {type(e).__name__}: {e}")
            self._handles.clear()
            self._forks.clear()

    def _step(self, out: SchedulerOutput, t0: float) -> None:
        """t0: when schedule() began; the step's Python share is everything but session.run."""
        slots, failed = self.adapters.activate(out.adapters)
        if failed:   # damaged adapter files: only their requests fail
            bad = [s for s in out.seqs if failed.keys() & set(adapter_names(s.adapter))]
            self._fail([s.req_id for s in bad], lambda rid: "; ".join(
                str(failed[n]) for n in self._handles[rid].params.adapter_names if n in failed))
            out.seqs = [s for s in out.seqs if s not in bad]
            if not out.seqs:
                return
        self.adapters.prefetch(self.scheduler.queued_adapters())
        now = time.monotonic()
        for s in out.seqs:
            h = self._handles.get(s.req_id)
            if h is not None and h.scheduled_time is None:
                h.scheduled_time = now
                h.cached_tokens = s.start_pos          # admitted with this many prompt tokens from the cache
        run0 = self.runner.run_time_s
        self._abort.begin(out.seqs)
        try:
            got = self._run_steps(out, slots) if out.decode_steps > 1 else self._run_step(out, slots)
        finally:
            self._abort.end()
        if got is None:           # the model run failed (its requests failed) or was aborted; the engine goes on
            return
        tokens, forced, alive, lp, steps = got
        run = self.runner.run_time_s - run0       # session.run alone: building its inputs is the step's Python
        with self._cv:
            updates = self.scheduler.update_from_output(out, ModelRunnerOutput(tokens, forced))
        for u in updates:
            self.output.apply(u, lp.get(u.req_id, ()), alive.get(u.req_id, True))
            if u.req_id in self._forks:
                self._release_forks(u.req_id)
        self._steps += steps
        self._chained_steps += steps - 1
        self._run_time += run
        self._step_time += time.perf_counter() - t0

    def _run_step(self, out: SchedulerOutput, slots: dict[str | None, int]):
        """One model step and its sampling: (req_id -> new tokens, req_id -> forced tokens, req_id -> whether its
        grammar goes on, req_id -> logprobs, 1), or None when the model run failed."""
        rows = [s for s in out.seqs if s.needs_logits]
        states, first = [], []            # one state per logits row; first[i]: rows[i]'s first state
        for s in rows:
            first.append(len(states))
            states += self._row_states(s)
        # guided rows: a mask per state (their drafts are the grammar's forced tokens)
        guided = [i for i, s in enumerate(rows) if self._handles[s.req_id].matcher is not None]
        masks = (self._masker.submit(self.guided.fill_masks, [self._handles[rows[i].req_id].matcher for i in guided],
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
                    states[first[i] + j].mask = unpack_mask(words[row], logits.shape[1])
                    row += 1
        sampled = self.sampler.sample(logits, states, self.runner.argmax)      # None after all_logits
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
        if self._abort.fired:     # ended for its cancelled rows: the others run again from the next schedule()
            self._aborted_steps += 1
            return
        self._failed_steps += 1
        self._last_step_error = (time.monotonic(), f"{type(e).__name__}: {e}")
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
            h, toks = self._handles[rid], tokens[rid]
            n, more = 0, True
            while more and n < len(toks):
                more = consume(h.matcher, toks[n])
                n += 1
            tokens[rid], alive[rid] = toks[:n], more
            if more and h.params.speculative:
                forced[rid] = forced_tokens(h.matcher)
        return alive, forced

    def _fail(self, req_ids: list[str], message) -> None:
        """End these requests with "error" (their blocks are freed at the next schedule())."""
        self.scheduler.finish_requests(req_ids, ERROR)
        for rid in req_ids:
            if rid in self._handles:
                msg = message(rid)
                self._handles.pop(rid)._finish(ERROR, msg)
            if rid in self._forks:
                self._release_forks(rid)

    def _row_states(self, s) -> list[RowState]:
        """The sampler rows of one scheduled seq: one, or with k drafts k + 1 (row j sees drafts[:j] as output)."""
        h = self._handles[s.req_id]
        d = s.spec_token_ids
        if not has_penalty(h.params):   # the history only feeds penalties: not copied for the rest
            return [RowState(h.params, h.generator, draft=d[j] if j < len(d) else -1) for j in range(len(d) + 1)]
        req = self.scheduler.get_request(s.req_id)
        out = req.output_token_ids if req else []
        return [RowState(h.params, h.generator, out + d[:j] if j else out, h.prompt_ids,
                         draft=d[j] if j < len(d) else -1) for j in range(len(d) + 1)]

    def _finish(self, finished: dict[str, str]) -> None:
        for rid, reason in finished.items():
            h = self._handles.pop(rid, None)
            if h is not None:
                h._finish(reason)
            if rid in self._forks:
                self._release_forks(rid)
