"""A request's caller side: what Engine.submit returns, and what the request gives back.

    output processor (runtime/output_processor.py, engine thread)
        --RequestStream.put(text, logprobs) / .finish(CompletionOutput)-->
    RequestHandle (caller threads): the text deltas from its queue (or from a queue the caller shares between
        several handles: deliver_to), result(), cancel(), and its RequestStats as the engine records them

The handle holds no engine state: the detokenizer, grammar matcher, random stream and buffers of a request are its
RequestState's, which the output processor owns and alone finishes.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from .sampler import TokenLogprobs
from .sampling_params import SamplingParams


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
    stop_reason: str | int | None = None         # the stop string or stop token id that ended it (None: other)


@dataclass
class Delta:
    """One piece of a request's output: its next text (may be "" on the last), and its finish_reason on the last."""
    text: str
    finish_reason: str | None = None


@dataclass
class RequestStats:
    """A request's times (time.monotonic()) and cache use, written by the output processor as the engine serves
    it, read by the caller (metrics, tracing, benchmarks) while it runs or after."""
    submitted: float = field(default_factory=time.monotonic)
    scheduled_time: float | None = None          # first step that ran it (queue time = this - submitted)
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)   # each generated token's arrival (decode rates, ITL)
    detok_time_s: float = 0.0                    # time in the incremental detokenizer (tracing's detokenize)
    cached_tokens: int = 0                       # prompt tokens admitted from the prefix cache


class RequestStream:
    """The engine's end of one handle, written by the output processor alone: put() the deltas, finish() once.
    Deltas wait in the handle's own queue until the caller forwards them (forward: to a queue it shares with other
    handles, as (key, Delta)); a forwarded stream sends every later delta there too."""

    def __init__(self, with_logprobs: bool):
        self._lock = threading.Lock()
        self._own: queue.Queue[Delta] = queue.Queue()
        self._target: queue.Queue | None = None
        self._key = None
        self.logprobs: list[TokenLogprobs] | None = [] if with_logprobs else None   # those delivered so far
        self.output: CompletionOutput | None = None
        self.done = threading.Event()

    def put(self, text: str, logprobs: list[TokenLogprobs] = ()) -> None:
        """New output: its text (nothing is queued for "") and the logprobs of the tokens it came from."""
        if self.logprobs is not None:
            self.logprobs += logprobs
        if text:
            self._send(Delta(text))

    def finish(self, output: CompletionOutput, tail: str = "") -> None:
        """The request's end: its output, then the last delta (tail: text the detokenizer held back)."""
        self.output = output
        self._send(Delta(tail, output.finish_reason))
        self.done.set()

    def forward(self, target: queue.Queue, key) -> None:
        with self._lock:
            if self._target is not None:
                raise RuntimeError("this request's deltas already go to another queue")
            while True:
                try:
                    target.put((key, self._own.get_nowait()))
                except queue.Empty:
                    break
            self._target, self._key = target, key

    def next(self, timeout: float | None) -> Delta:
        if self._target is not None:
            raise RuntimeError("this request's deltas go to the queue given to deliver_to(); read them there")
        return self._own.get(timeout=timeout)

    def _send(self, d: Delta) -> None:
        with self._lock:
            if self._target is None:
                self._own.put(d)
            else:
                self._target.put((self._key, d))


class RequestHandle:
    """What submit() returns: iterate for text deltas, or result() for the whole completion. For submit_embed:
    result().embedding, and no deltas."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams, stream: RequestStream,
                 stats: RequestStats, cancel: Callable[[str], None]):
        self.request_id, self.prompt_ids, self.params = request_id, prompt_ids, params
        self._stream, self.stats, self._cancel = stream, stats, cancel

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
            d = self._stream.next(timeout)
        except queue.Empty:
            raise TimeoutError(f"no output from request {self.request_id} within {timeout} s") from None
        return d.text, d.finish_reason

    def deliver_to(self, target: queue.Queue, key) -> None:
        """From now on (and those not yet read) this request's deltas go to target as (key, Delta) instead of
        next_delta(): one queue a caller waits on for all its requests."""
        self._stream.forward(target, key)

    def result(self, timeout: float | None = None) -> CompletionOutput:
        if not self._stream.done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        return self._stream.output

    @property
    def done(self) -> bool:
        return self._stream.done.is_set()

    def cancel(self) -> None:
        self._cancel(self.request_id)

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        """The sampled tokens' logprobs delivered so far (params.logprobs set; else None)."""
        return self._stream.logprobs

    # the request's stats, as the attributes they always were
    submitted = property(lambda self: self.stats.submitted)
    scheduled_time = property(lambda self: self.stats.scheduled_time)
    first_token_time = property(lambda self: self.stats.first_token_time)
    token_times = property(lambda self: self.stats.token_times)
    detok_time_s = property(lambda self: self.stats.detok_time_s)
    cached_tokens = property(lambda self: self.stats.cached_tokens)
