"""The engine's output side: what each request gets back, made from the scheduler's updates on the engine thread
and read by the caller's thread through its RequestHandle.

    RequestUpdate (new token ids) --IncrementalDetokenizer: stop strings, whole UTF-8 characters--> text delta
                                  --> RequestHandle (deltas as they come; result(): the CompletionOutput)
    the step's logits            --> sampled tokens' logprobs, prompt_logprobs (a prefill's every row)
    the step's hidden_states     --> an embedding request's rows, pooled when its last chunk ran (runtime/pooling.py)

The engine (runtime/engine.py) owns the loop; it hands each step's outputs to its OutputProcessor, which finishes a
request whose stop string or grammar ended it and tells the scheduler so.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .detokenizer import IncrementalDetokenizer
from .model_runner import logits_rows
from .pooling import pool
from .sampler import TokenLogprobs, log_softmax
from .sampling_params import SamplingParams
from .scheduler_messages import ERROR, STOP, RequestUpdate


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

    def __init__(self, engine, req_id: str, prompt_ids: list[int], params: SamplingParams,
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


class OutputProcessor:
    """Each request's handle by id and what the steps give them (engine thread only, except handles' own reads).
    finish(req_id, reason): the scheduler's finish_requests, for requests a stop string or their grammar ended."""

    def __init__(self, finish: Callable[[str, str], None]):
        self.handles: dict[str, RequestHandle] = {}
        self._finish_in_scheduler = finish
        self.tokens_out = 0                          # generated tokens handed to requests (stats)

    def apply(self, u: RequestUpdate, logprobs: Sequence[TokenLogprobs | None], more: bool = True) -> None:
        """One request's update: its new tokens through the detokenizer to its handle, with their logprobs; the
        request finishes here at its finish_reason, or at a stop string, or when its grammar ends (more=False)."""
        h = self.handles.get(u.req_id)
        if h is None:
            return
        if h.hidden is not None:          # an embedding request: its last chunk ran
            if u.finish_reason is not None:
                h.embedding = pool(h.hidden, h.params.pooling)
                self.handles.pop(u.req_id)._finish(u.finish_reason)
            return
        self.tokens_out += len(u.new_token_ids)
        before = len(h.detok.output_token_ids)
        t_detok = time.perf_counter()
        h._push(h.detok.step(u.new_token_ids), len(u.new_token_ids))
        h.detok_time_s += time.perf_counter() - t_detok
        if h.logprobs is not None:
            # the tokens the detokenizer took: up to a stop string or stop token id among several
            used = len(h.detok.output_token_ids) - before + isinstance(h.detok.stop_reason, int)
            h.logprobs += [x for x in logprobs[:max(1, used)] if x is not None]
        if (h.detok.finished or not more) and u.finish_reason is None:   # a stop string or the grammar ended
            self._finish_in_scheduler(u.req_id, STOP)
            err = h.matcher.get_error() if h.matcher is not None and h.matcher.is_error() else None
            self.handles.pop(u.req_id)._finish(ERROR if err else STOP, err and f"grammar: {err}")
        elif u.finish_reason is not None:
            self.handles.pop(u.req_id)._finish(u.finish_reason)

    def keep_hidden(self, seqs, hidden: np.ndarray) -> None:
        """hidden: [E, H], the step's hidden_states rows (model_runner.hidden_rows order). Each embedding request
        keeps its rows by prompt position (mean pooling), or its last row (last-token pooling)."""
        row = 0
        for s in seqs:
            if not s.hidden_rows:
                continue
            h = self.handles.get(s.req_id)
            if h is not None and h.hidden is not None:
                rows = hidden[row:row + s.hidden_rows]
                if h.params.pooling == "last":
                    h.hidden[0] = rows[-1]
                else:
                    end = s.start_pos + s.num_tokens
                    h.hidden[end - s.hidden_rows:end] = rows
            row += s.hidden_rows

    def wants_prompt_logprobs(self, s) -> bool:
        h = self.handles.get(s.req_id)
        # the length check skips a prompt recomputed after preemption: its logprobs are already recorded
        return (h is not None and h.prompt_logprobs is not None and s.start_pos < len(h.prompt_ids) - 1
                and len(h.prompt_logprobs) == s.start_pos + 1)

    def record_prompt_logprobs(self, seqs, logits: np.ndarray) -> np.ndarray:
        """logits: [T, V], every row of the step. Appends the prompt tokens' logprobs (row j of a prefill chunk
        predicts the token after it) to the requests that asked; returns the [R, V] rows to sample from."""
        start = 0
        for s in seqs:
            if self.wants_prompt_logprobs(s):
                h = self.handles[s.req_id]
                upto = min(s.num_tokens, len(h.prompt_ids) - 1 - s.start_pos)   # rows predicting prompt tokens
                lp = log_softmax(np.asarray(logits[start:start + upto], dtype=np.float32))
                n = h.params.logprobs or 0
                for j in range(upto):
                    tid = h.prompt_ids[s.start_pos + j + 1]
                    top = np.argsort(-lp[j], kind="stable")[:n] if n else np.zeros(0, np.int64)
                    h.prompt_logprobs.append(TokenLogprobs(tid, float(lp[j, tid]), top.tolist(), lp[j, top].tolist()))
            start += s.num_tokens
        return logits[logits_rows(seqs)]
