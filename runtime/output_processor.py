"""The engine's output side: every request's engine state from submit to finish, and the one place a request ends.

    RequestUpdate (new token ids) --IncrementalDetokenizer: stop strings, whole UTF-8 characters--> text delta
                                  --> the request's RequestStream --> its RequestHandle (runtime/request_output.py)
    the step's logits            --> sampled tokens' logprobs, prompt_logprobs (a prefill's every row)
    the step's hidden_states     --> an embedding request's rows, pooled after its last chunk (runtime/pooling.py)

A request ends here and nowhere else (_finish): at the scheduler's finish_reason (length, a stop token, cancelled,
deadline), at a stop string or the end of its grammar (then the scheduler is told), when its model run or its
adapter failed, or when the engine stopped. The engine (runtime/engine.py) registers requests and runs the loop;
the step (runtime/engine_step.py) reads a request's params, random stream and grammar matcher from its RequestState.
Engine thread only, except register / the waiting siblings, which the engine calls under its lock.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import numpy as np

from .detokenizer import IncrementalDetokenizer
from .model_runner import logits_rows
from .pooling import pool
from .request_output import CompletionOutput, RequestHandle, RequestStats, RequestStream
from .sampler import TokenLogprobs, log_softmax
from .sampling_params import SamplingParams
from .scheduler_messages import ERROR, STOP, RequestUpdate


class RequestState:
    """One request as the engine holds it. Generation: detok, generator (None: greedy), matcher (llguidance
    LLMatcher for params.guide, else None). Embedding: hidden, its final hidden states by prompt position
    (mean pooling) or its last one, [n, H]; detok None."""

    def __init__(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                 detok: IncrementalDetokenizer | None, generator, matcher=None, hidden: np.ndarray | None = None,
                 cancel: Callable[[str], None] = lambda rid: None):
        self.request_id, self.prompt_ids, self.params = request_id, prompt_ids, params
        self.detok, self.generator, self.matcher, self.hidden = detok, generator, matcher, hidden
        self.logprobs: list[TokenLogprobs] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprobs | None] | None = [None] if params.prompt_logprobs else None
        self.embedding: np.ndarray | None = None
        self.stats = RequestStats()
        self.stream = RequestStream(with_logprobs=self.logprobs is not None)
        self.handle = RequestHandle(request_id, prompt_ids, params, self.stream, self.stats, cancel)


class OutputProcessor:
    """Each live request's state by id (states), the siblings of an n > 1 request waiting for their parent's
    prefill, and what the steps' outputs give them. finish: the scheduler's finish_requests, for requests this
    side ends (a stop string or grammar; a failed run)."""

    def __init__(self, finish: Callable[[str | Iterable[str], str], None]):
        self.states: dict[str, RequestState] = {}
        self._waiting: dict[str, list[RequestState]] = {}    # parent req_id -> its n-1 siblings
        self._finish_in_scheduler = finish
        self.tokens_out = 0                          # generated tokens handed to requests (stats)

    # ------------------------------------------------ requests in
    def register(self, st: RequestState, siblings: Sequence[RequestState] = ()) -> None:
        self.states[st.request_id] = st
        if siblings:
            self._waiting[st.request_id] = list(siblings)

    def has_waiting(self, parent_id: str) -> bool:
        return parent_id in self._waiting

    def release(self, parent_id: str) -> list[RequestState]:
        """The siblings waiting for parent_id (its prompt is computed, or it ended): the engine queues them."""
        return self._waiting.pop(parent_id, [])

    def cancel_waiting(self, req_id: str) -> bool:
        """Cancel a sibling still waiting for its parent's prefill; False: none by that id waits."""
        for kids in self._waiting.values():
            for st in kids:
                if st.request_id == req_id:
                    kids.remove(st)
                    self._finish(st, "cancelled")
                    return True
        return False

    def adapters_in_use(self) -> set[str]:
        return {n for st in list(self.states.values()) for n in st.params.adapter_names}

    def scheduled(self, seqs, now: float) -> None:
        """A step runs these seqs: the first one of each request is its scheduled time and prefix-cache hit."""
        for s in seqs:
            st = self.states.get(s.req_id)
            if st is not None and st.stats.scheduled_time is None:
                st.stats.scheduled_time = now
                st.stats.cached_tokens = s.start_pos          # admitted with this many prompt tokens from the cache

    # ------------------------------------------------ a step's outputs
    def apply(self, u: RequestUpdate, logprobs: Sequence[TokenLogprobs | None], more: bool = True) -> None:
        """One request's update: its new tokens through the detokenizer to its handle, with their logprobs; the
        request finishes here at its finish_reason, or at a stop string, or when its grammar ends (more=False)."""
        st = self.states.get(u.req_id)
        if st is None:
            return
        if st.hidden is not None:          # an embedding request: its last chunk ran
            if u.finish_reason is not None:
                st.embedding = pool(st.hidden, st.params.pooling)
                self._end(u.req_id, u.finish_reason)
            return
        n = len(u.new_token_ids)
        self.tokens_out += n
        detok, times = st.detok, st.stats
        before = len(detok.output_token_ids)
        t_detok = time.perf_counter()
        text = detok.step(u.new_token_ids)
        now = time.monotonic()
        times.token_times.extend([now] * n)
        if times.first_token_time is None:
            times.first_token_time = now
        times.detok_time_s += time.perf_counter() - t_detok
        new_lp: list[TokenLogprobs] = []
        if st.logprobs is not None:
            # the tokens the detokenizer took: up to a stop string or stop token id among several
            used = len(detok.output_token_ids) - before + isinstance(detok.stop_reason, int)
            new_lp = [x for x in logprobs[:max(1, used)] if x is not None]
            st.logprobs += new_lp
        st.stream.put(text, new_lp)
        if (detok.finished or not more) and u.finish_reason is None:   # a stop string or the grammar ended
            self._finish_in_scheduler(u.req_id, STOP)
            err = st.matcher.get_error() if st.matcher is not None and st.matcher.is_error() else None
            self._end(u.req_id, ERROR if err else STOP, err and f"grammar: {err}")
        elif u.finish_reason is not None:
            self._end(u.req_id, u.finish_reason)

    def ended(self, finished: dict[str, str]) -> None:
        """Requests the scheduler ended outside a step's update (cancelled, deadline, ...): req_id -> reason."""
        for rid, reason in finished.items():
            self._end(rid, reason)

    def fail(self, req_ids: Sequence[str], message: Callable[[str], str]) -> None:
        """End these requests with "error" (their blocks are freed at the next schedule()); message(req_id)."""
        self._finish_in_scheduler(list(req_ids), ERROR)
        for rid in req_ids:
            if rid in self.states:
                self._end(rid, ERROR, message(rid))

    def refused(self, st: RequestState, error: str) -> None:
        """A waiting sibling the scheduler would not take: it ends with "error"."""
        self._finish(st, ERROR, error)

    def fail_all(self, error: str) -> None:
        """The engine stopped: every request, running or waiting, ends with "error"."""
        waiting = [st for kids in self._waiting.values() for st in kids]
        for st in list(self.states.values()) + waiting:
            self._finish(st, ERROR, error)
        self.states.clear()
        self._waiting.clear()

    def keep_hidden(self, seqs, hidden: np.ndarray) -> None:
        """hidden: [E, H], the step's hidden_states rows (model_runner.hidden_rows order). Each embedding request
        keeps its rows by prompt position (mean pooling), or its last row (last-token pooling)."""
        row = 0
        for s in seqs:
            if not s.hidden_rows:
                continue
            st = self.states.get(s.req_id)
            if st is not None and st.hidden is not None:
                rows = hidden[row:row + s.hidden_rows]
                if st.params.pooling == "last":
                    st.hidden[0] = rows[-1]
                else:
                    end = s.start_pos + s.num_tokens
                    st.hidden[end - s.hidden_rows:end] = rows
            row += s.hidden_rows

    def wants_prompt_logprobs(self, s) -> bool:
        st = self.states.get(s.req_id)
        # the length check skips a prompt recomputed after preemption: its logprobs are already recorded
        return (st is not None and st.prompt_logprobs is not None and s.start_pos < len(st.prompt_ids) - 1
                and len(st.prompt_logprobs) == s.start_pos + 1)

    def record_prompt_logprobs(self, seqs, logits: np.ndarray) -> np.ndarray:
        """logits: [T, V], every row of the step. Appends the prompt tokens' logprobs (row j of a prefill chunk
        predicts the token after it) to the requests that asked; returns the [R, V] rows to sample from."""
        start = 0
        for s in seqs:
            if self.wants_prompt_logprobs(s):
                st = self.states[s.req_id]
                upto = min(s.num_tokens, len(st.prompt_ids) - 1 - s.start_pos)   # rows predicting prompt tokens
                lp = log_softmax(np.asarray(logits[start:start + upto], dtype=np.float32))
                n = st.params.logprobs or 0
                for j in range(upto):
                    tid = st.prompt_ids[s.start_pos + j + 1]
                    top = np.argsort(-lp[j], kind="stable")[:n] if n else np.zeros(0, np.int64)
                    st.prompt_logprobs.append(TokenLogprobs(tid, float(lp[j, tid]), top.tolist(), lp[j, top].tolist()))
            start += s.num_tokens
        return logits[logits_rows(seqs)]

    # ------------------------------------------------ the end of a request
    def _end(self, req_id: str, reason: str, error: str | None = None) -> None:
        st = self.states.pop(req_id, None)
        if st is not None:
            self._finish(st, reason, error)

    def _finish(self, st: RequestState, reason: str, error: str | None = None) -> None:
        """The request's CompletionOutput to its handle, once: the detokenizer's held-back tail unless it failed."""
        if st.stream.done.is_set():
            return
        detok = st.detok
        tail = detok.flush() if reason != ERROR and detok is not None else ""
        st.stream.finish(CompletionOutput(
            st.request_id, detok.text if detok else "", list(detok.output_token_ids) if detok else [], reason,
            len(st.prompt_ids), st.logprobs, error, st.stats.cached_tokens, st.prompt_logprobs, st.embedding,
            detok.stop_reason if detok else None), tail)
