"""The engine: continuous batching over one engine-graph session, served from its own thread.

    callers (any thread) --submit--> Scheduler queue
    engine thread, per step:  schedule() -> ModelRunner.execute() -> Sampler -> update_from_output()
                              -> IncrementalDetokenizer -> each request's handle (text deltas, result)

Embedding requests (submit_embed, embed) are prefill-only rows of the same steps; the graph's hidden_states
give their final hidden states, pooled (runtime/pooling.py) when their last chunk has run.

A session.run that raises fails only the requests of that step (finish_reason "error", blocks freed);
the engine keeps serving. Anything else that escapes the loop is fatal: every pending request gets
EngineDeadError and later submits raise it.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .adapters import AdapterRegistry
from .artifact import load_artifact
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .contract import TOKENIZER as TOKENIZER_JSON
from .errors import EmptyPrompt, EngineDeadError, InvalidTokenIds, OrtllmError, RequestError
from .guided import GuidedDecoding, consume, forced_tokens, unpack_mask
from .model_runner import KVPoolLayout, ModelRunner, logits_rows
from .pooling import normalize as l2_normalize, pool
from .sampler import RowState, Sampler, TokenLogprobs, has_penalty, log_softmax, request_generator
from .speculative import accept
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .scheduler_messages import ERROR, ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from .scoring import WindowScorer
from .tokenizer import Tokenizer


def engine_config(path: str | Path, **overrides) -> EngineConfig:
    """EngineConfig for an artifact: its KV block size and context length unless overridden."""
    manifest = load_artifact(path, verify=False).manifest
    overrides.setdefault("block_size", manifest["build"].get("kv_block_size", 16))
    overrides.setdefault("max_model_len", manifest["model"]["max_position_embeddings"])
    return EngineConfig.from_overrides(path, **overrides)


@dataclass
class CompletionOutput:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    prompt_tokens: int
    logprobs: list[TokenLogprobs] | None = None
    error: str | None = None
    cached_tokens: int = 0                       # prompt tokens whose KV came from the prefix cache
    prompt_logprobs: list[TokenLogprobs | None] | None = None   # params.prompt_logprobs: one per prompt token
    embedding: np.ndarray | None = None          # embedding requests: the pooled final hidden state [H] float32
                                                 # (not normalized; runtime/pooling.py)


@dataclass
class _Event:
    delta: str
    finish_reason: str | None = None


class RequestHandle:
    """What submit() returns: iterate for text deltas, or result() for the whole completion. For submit_embed
    (detok None): result().embedding, and no deltas."""

    def __init__(self, engine: "Engine", req_id: str, prompt_ids: list[int], params: SamplingParams,
                 detok: IncrementalDetokenizer | None, generator, matcher=None):
        self.engine, self.request_id, self.params = engine, req_id, params
        self.prompt_ids = prompt_ids
        self.detok = detok
        self.generator = generator
        self.matcher = matcher                        # llguidance LLMatcher (params.guide), else None
        self.logprobs: list[TokenLogprobs] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprobs | None] | None = [None] if params.prompt_logprobs else None
        self.cached_tokens = 0
        # an embedding request's final hidden states by prompt position (mean pooling; last: one row), [n, H]
        self.hidden: np.ndarray | None = None
        self.embedding: np.ndarray | None = None
        self.submitted = time.monotonic()
        self.scheduled_time: float | None = None      # first step that ran it (queue time = this - submitted)
        self.first_token_time: float | None = None
        self.token_times: list[float] = []            # time.monotonic() of each generated token (decode rates, ITL)
        self.detok_time_s = 0.0                       # time in the incremental detokenizer (tracing's detokenize)
        self._events: queue.Queue[_Event] = queue.Queue()
        self._done = threading.Event()
        self._output: CompletionOutput | None = None

    # engine thread
    def _push(self, delta: str, n_tokens: int = 1) -> None:
        now = time.monotonic()
        self.token_times.extend([now] * n_tokens)
        if self.first_token_time is None:
            self.first_token_time = now
        if delta:
            self._events.put(_Event(delta))

    def _finish(self, reason: str, error: str | None = None) -> None:
        if self._done.is_set():
            return
        detok = self.detok
        tail = detok.flush() if reason != ERROR and detok is not None else ""
        self._output = CompletionOutput(self.request_id, detok.text if detok else "",
                                        list(detok.output_token_ids) if detok else [], reason, len(self.prompt_ids),
                                        self.logprobs, error, self.cached_tokens, self.prompt_logprobs,
                                        self.embedding)
        self._events.put(_Event(tail, reason))
        self._done.set()

    # caller threads
    def __iter__(self) -> Iterator[str]:
        while True:
            delta, finish = self.next_delta()
            if delta:
                yield delta
            if finish is not None:
                return

    def next_delta(self, timeout: float | None = None) -> tuple[str, str | None]:
        """The next (text delta, finish_reason or None); raises TimeoutError if none comes within `timeout` s,
        so a server can check its client and deadline between deltas."""
        try:
            ev = self._events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no output from request {self.request_id} within {timeout} s") from None
        return ev.delta, ev.finish_reason

    def result(self, timeout: float | None = None) -> CompletionOutput:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        return self._output

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self.engine.cancel(self.request_id)


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
                                   eos_token_ids=self.eos_token_ids, vocab_size=self.runner.vocab_size,
                                   is_resident=self.adapters.is_resident,
                                   adapter_key=self.adapters.content_key, context_length=self.context_length)
        self.limits = self.scheduler.limits     # how many tokens a sequence may hold (runtime/limits.py)
        self.sampler = Sampler()
        self.guided = GuidedDecoding(self.artifact.path / TOKENIZER_JSON, self.runner.vocab_size, self.eos_token_ids)
        self._masker = ThreadPoolExecutor(1, thread_name_prefix="ortllm-masks")   # masks while the model runs
        self._forks: dict[str, list[RequestHandle]] = {}   # parent req_id -> n-1 siblings waiting for its prefill
        self._entropy = np.random.SeedSequence(config.seed)
        self._handles: dict[str, RequestHandle] = {}
        self._ids = itertools.count()
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
        self._tokens_out = 0
        self._stop_key: frozenset[int] | None = None     # _stop_table's cache: the stop ids and their [V] table
        self._stop_tab: np.ndarray | None = None
        self._thread = threading.Thread(target=self._loop, name="ortllm-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_artifact(cls, path: str | Path, **overrides) -> "Engine":
        """Load an engine-graph artifact; overrides are EngineConfig keys (max_batch_tokens=..., num_blocks=...)."""
        return cls(engine_config(path, **overrides))

    # ---------------------------------------------------------------- requests in
    def encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return [int(t) for t in prompt]

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
        params = (params or SamplingParams()).validate()
        if params.adapter is not None:
            self.adapters.check(params.adapter)
        if params.logit_bias:
            bad = [t for t in params.logit_bias if t >= self.runner.vocab_size]
            if bad:
                raise InvalidTokenIds(f"logit_bias token ids must be in [0, {self.runner.vocab_size}); got {bad[:5]}")
        ids = self.encode_prompt(prompt)
        max_tokens = self.limits.fit_max_tokens(len(ids), params.max_tokens)   # the one context rule
        if max_tokens != params.max_tokens:
            params = SamplingParams(**{**params.__dict__, "max_tokens": max_tokens})
        base = request_id or f"req-{next(self._ids)}"
        matcher = self.guided.compile(params.guide) if params.guide is not None else None   # InvalidGrammar: 400
        handles = []
        for i in range(n):
            detok = IncrementalDetokenizer(lambda t: self.tokenizer.decode(t, skip_special_tokens=True), ids,
                                           stop=params.stop, stop_token_ids=params.stop_ids(self.eos_token_ids),
                                           stream=self.tokenizer.decode_stream)
            if params.greedy:
                gen = None
            elif i and params.seed is not None:
                gen = np.random.Generator(np.random.Philox(np.random.SeedSequence([params.seed, i])))
            else:
                gen = request_generator(params.seed, self._entropy)
            m = None if matcher is None else (matcher if i == 0 else matcher.deep_copy())
            handles.append(RequestHandle(self, base if i == 0 else f"{base}-{i}", ids, params, detok, gen, m))
        with self._cv:
            self.scheduler.add_request(base, ids, params)
            self._handles[base] = handles[0]
            if n > 1:
                self._forks[base] = handles[1:]
            self._cv.notify()
        if params.adapter is not None:     # from disk to host RAM while it waits (no-op if in a slot or RAM)
            self.adapters.prefetch([params.adapter])
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
        params = SamplingParams(max_tokens=1, adapter=adapter, priority=priority, pooling=pooling).validate()
        if adapter is not None:
            self.adapters.check(adapter)
        ids = self.encode_prompt(prompt)
        if not ids:
            raise EmptyPrompt("the input is empty; send at least one token")
        self.limits.check_prompt(len(ids))
        rid = request_id or f"emb-{next(self._ids)}"
        h = RequestHandle(self, rid, ids, params, None, None)
        h.hidden = np.empty((len(ids) if pooling == "mean" else 1, self.runner.hidden_size), np.float32)
        with self._cv:
            self.scheduler.add_request(rid, ids, params)
            self._handles[rid] = h
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
            "prefix_cache_hit_rate": s.prefix_cache_hit_rate, "tokens_generated": self._tokens_out,
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
            "tokens_per_step": self._tokens_out / self._steps if self._steps else 0.0,
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
                self.adapters.sweep({h.params.adapter for h in list(self._handles.values())})
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
            bad = [s for s in out.seqs if s.adapter in failed]
            self._fail([s.req_id for s in bad], lambda rid: str(failed[self._handles[rid].params.adapter]))
            out.seqs = [s for s in out.seqs if s.adapter not in failed]
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
            h = self._handles.get(u.req_id)
            if h is None:
                continue
            if h.hidden is not None:          # an embedding request: its last chunk ran
                if u.finish_reason is not None:
                    h.embedding = pool(h.hidden, h.params.pooling)
                    self._handles.pop(u.req_id)._finish(u.finish_reason)
                continue
            self._tokens_out += len(u.new_token_ids)
            before = len(h.detok.output_token_ids)
            t_detok = time.perf_counter()
            h._push(h.detok.step(u.new_token_ids), len(u.new_token_ids))
            h.detok_time_s += time.perf_counter() - t_detok
            if h.logprobs is not None:
                # the tokens the detokenizer took: up to a stop string or stop token id among several
                used = len(h.detok.output_token_ids) - before + isinstance(h.detok.stop_reason, int)
                h.logprobs += [x for x in lp[u.req_id][:max(1, used)] if x is not None]
            more = alive.get(u.req_id, True)
            if (h.detok.finished or not more) and u.finish_reason is None:   # a stop string or the grammar ended
                self.scheduler.finish_requests(u.req_id, "stop")
                err = h.matcher.get_error() if h.matcher is not None and h.matcher.is_error() else None
                self._handles.pop(u.req_id)._finish(ERROR if err else "stop", err and f"grammar: {err}")
            elif u.finish_reason is not None:
                self._handles.pop(u.req_id)._finish(u.finish_reason)
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
        scored = [s for s in out.seqs if self._wants_prompt_logprobs(s)]
        try:
            logits = self.runner.execute(out.seqs, adapter_slots=slots, all_logits=bool(scored))
        except Exception as e:  # noqa: BLE001 - this step's requests fail; the engine goes on
            if masks is not None:
                masks.result()
            self._run_failed(out, e)
            return None
        if len(self.runner.hidden):
            self._keep_hidden(out.seqs, self.runner.hidden)
        if scored:
            logits = self._record_prompt_logprobs(out.seqs, logits)
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

    def _keep_hidden(self, seqs, hidden: np.ndarray) -> None:
        """hidden: [E, H], the step's hidden_states rows (model_runner.hidden_rows order). Each embedding request
        keeps its rows by prompt position (mean pooling), or its last row (last-token pooling)."""
        row = 0
        for s in seqs:
            if not s.hidden_rows:
                continue
            h = self._handles.get(s.req_id)
            if h is not None and h.hidden is not None:
                rows = hidden[row:row + s.hidden_rows]
                if h.params.pooling == "last":
                    h.hidden[0] = rows[-1]
                else:
                    end = s.start_pos + s.num_tokens
                    h.hidden[end - s.hidden_rows:end] = rows
            row += s.hidden_rows

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

    def _wants_prompt_logprobs(self, s) -> bool:
        h = self._handles.get(s.req_id)
        # the length check skips a prompt recomputed after preemption: its logprobs are already recorded
        return (h is not None and h.prompt_logprobs is not None and s.start_pos < len(h.prompt_ids) - 1
                and len(h.prompt_logprobs) == s.start_pos + 1)

    def _record_prompt_logprobs(self, seqs, logits: np.ndarray) -> np.ndarray:
        """logits: [T, V], every row of the step. Appends the prompt tokens' logprobs (row j of a prefill chunk
        predicts the token after it) to the requests that asked; returns the [R, V] rows to sample from."""
        start = 0
        for s in seqs:
            if self._wants_prompt_logprobs(s):
                h = self._handles[s.req_id]
                upto = min(s.num_tokens, len(h.prompt_ids) - 1 - s.start_pos)   # rows predicting prompt tokens
                lp = log_softmax(np.asarray(logits[start:start + upto], dtype=np.float32))
                n = h.params.logprobs or 0
                for j in range(upto):
                    tid = h.prompt_ids[s.start_pos + j + 1]
                    top = np.argsort(-lp[j], kind="stable")[:n] if n else np.zeros(0, np.int64)
                    h.prompt_logprobs.append(TokenLogprobs(tid, float(lp[j, tid]), top.tolist(), lp[j, top].tolist()))
            start += s.num_tokens
        return logits[logits_rows(seqs)]

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
