"""The engine's public API and its loop: continuous batching over one engine-graph session, served from its own
thread.

    callers (any thread) --submit--> InputProcessor (runtime/request_input.py: checks, SequenceLimits, RequestStates)
                                     --> Scheduler queue; the caller keeps the state's RequestHandle
                                         (runtime/request_output.py: deltas, result, cancel)
    engine thread (this module's loop): schedule() -> the requests it ended -> OutputProcessor
                                        -> EngineStep.run (runtime/engine_step.py: adapters, sampler rows, masks,
                                           ModelRunner.execute, sampling, speculative accept, grammars,
                                           update_from_output)
                                        -> OutputProcessor (runtime/output_processor.py: detokenizer, stop strings,
                                           logprobs, pooled embeddings; the one place a request ends)

What a sequence may hold is runtime/limits.py's (Engine.limits). Direct steps outside the loop (Engine.execute,
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
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from .adapters import AdapterRegistry
from .artifact import load_artifact
from .config import EngineConfig
from .contract import TOKENIZER as TOKENIZER_JSON
from .engine_step import EngineStep
from .errors import EngineDeadError, OrtllmError, RequestError
from .guided import GuidedDecoding
from .model_runner import KVPoolLayout, ModelRunner
from .output_processor import OutputProcessor
from .pooling import normalize as l2_normalize
from .request_input import InputProcessor
from .request_output import CompletionOutput, RequestHandle
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .scheduler_messages import ScheduledSeq
from .scoring import WindowScorer
from .tokenizer import Tokenizer


def engine_config(path: str | Path, **overrides) -> EngineConfig:
    """EngineConfig for an artifact: its KV block size and context length unless overridden."""
    manifest = load_artifact(path, verify=False).manifest
    overrides.setdefault("block_size", manifest["build"].get("kv_block_size", 16))
    overrides.setdefault("max_model_len", manifest["model"]["max_position_embeddings"])
    return EngineConfig.from_overrides(path, **overrides)


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.artifact = load_artifact(config.artifact)
        self.tokenizer = Tokenizer.from_dir(self.artifact.path)
        gen = self.artifact.read_json("generation.json")
        self.eos_token_ids = tuple(gen["eos_token_ids"])
        self.context_length = gen["context_length"]
        self.runner = ModelRunner(self.artifact, config)
        self.adapters = AdapterRegistry(self.artifact, config.adapters, self.runner)
        self.scheduler = Scheduler(config.scheduler, config.cache, num_blocks=self.runner.num_blocks,
                                   eos_token_ids=self.eos_token_ids,
                                   is_resident=self.adapters.is_resident,
                                   adapter_key=self.adapters.content_key, context_length=self.context_length)
        self.limits = self.scheduler.limits     # how many tokens a sequence may hold (runtime/limits.py)
        self.guided = GuidedDecoding(self.artifact.path / TOKENIZER_JSON, self.runner.vocab_size, self.eos_token_ids)
        # the input side: prompts and params checked and made into handles before anything is queued
        self.input = InputProcessor(self, self.tokenizer, self.limits, self.adapters, self.guided, self.eos_token_ids,
                                    self.runner.vocab_size, self.runner.hidden_size, config.seed,
                                    config.scheduler.max_adapters_per_batch)
        # the output side: each request's state by id, what the steps give them, and the one place they end
        self.output = OutputProcessor(self.scheduler.finish_requests)
        self._cv = threading.Condition()
        self.step = EngineStep(self.runner, self.scheduler, self.adapters, self.guided, self.output, self._cv,
                               self._release_forks)
        self.sampler = self.step.sampler
        self._stop = False
        self._dead: BaseException | None = None
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
        states = self.input.generation(prompt, params, n, request_id)
        first, params = states[0], states[0].params
        with self._cv:
            self.scheduler.add_request(first.request_id, first.prompt_ids, params)
            self.output.register(first, states[1:])     # the siblings wait for its prefill
            self._cv.notify()
        if params.adapter_names:           # from disk to host RAM while it waits (no-op if in a slot or RAM)
            self.adapters.prefetch(list(params.adapter_names))
        return [st.handle for st in states]

    def _release_forks(self, parent_id: str) -> None:
        """The parent's prompt is computed (or the parent ended): queue its waiting siblings."""
        with self._cv:
            for st in self.output.release(parent_id):
                try:
                    self.scheduler.add_request(st.request_id, st.prompt_ids, st.params)
                except OrtllmError as e:
                    self.output.refused(st, str(e))
                    continue
                self.output.register(st)

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
        st = self.input.embedding(prompt, pooling, adapter, priority, request_id)
        with self._cv:
            self.scheduler.add_request(st.request_id, st.prompt_ids, st.params)
            self.output.register(st)
            self._cv.notify()
        return st.handle

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
            if self.output.cancel_waiting(request_id):    # a sibling still waiting for its parent's prefill
                return
        self.scheduler.finish_requests(request_id, "cancelled")
        self.step.abort.cancel(request_id)        # may end the model run in progress (engine_step.StepAbort)
        with self._cv:
            self._cv.notify()

    def stats(self) -> dict:
        s = self.scheduler.stats()
        return {
            "running": s.num_running, "waiting": s.num_waiting,
            "preemptions": s.num_preemptions, "kv_blocks_total": s.num_usable_blocks,
            "kv_blocks_free": s.num_free_blocks, "kv_usage": s.kv_usage,
            "prefix_cache_hit_rate": s.prefix_cache_hit_rate, "tokens_generated": self.output.tokens_out,
            "kv_pool_bytes": self.runner.kv_pool_bytes(),
            # speculative decoding: draft tokens verified / accepted, decode rows that carried drafts
            "spec_drafted": s.spec_drafted, "spec_accepted": s.spec_accepted, "spec_rows": s.spec_rows,
            "spec_acceptance_rate": s.spec_acceptance_rate, "spec_propose_time_s": s.spec_propose_time_s,
            # guided requests: tokens their grammar forced, verified as drafts / accepted (runtime/guided.py)
            "forced_drafted": s.forced_drafted, "forced_accepted": s.forced_accepted,
            **self.step.stats(self.output.tokens_out),    # steps, their time and Python share, failures, aborts
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
        self.step.close()
        self.adapters.close()
        self.runner.close()         # the session and KV pool go now, whoever still holds the engine

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
                self.output.ended(out.finished)
                for rid in out.finished:
                    if self.output.has_waiting(rid):
                        self._release_forks(rid)
                self.adapters.sweep(self.output.adapters_in_use())
                if not out.seqs:
                    time.sleep(0.001)   # only finishes this step, or nothing admissible yet
                    continue
                self.step.run(out, t0)
        except BaseException as e:  # noqa: BLE001 - fatal: fail everyone, refuse new work
            self._dead = e
            self.output.fail_all(f"engine stopped: {type(e).__name__}: {e}")
