"""Continuous-batching scheduler, vLLM v1 style: an interface, one implementation, plain messages
(runtime/scheduler_messages.py, which the runner and the engine import without this module; docs/architecture.md,
Conventions).

The engine loop, one step at a time:

    out = scheduler.schedule()                    # SchedulerOutput: who runs, which tokens, which blocks
    ... build the flattened batch from out.seqs, run the graph, sample the rows with needs_logits ...
    updates = scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids={req_id: token}))

A step is one flattened batch under `max_batch_tokens`: first one token for every running sequence that
is decoding, then the next chunk of running sequences that are still in prefill, then new (or preempted)
requests admitted from the queue while budget, sequence slots, KV blocks and the adapter cap allow. Long
prompts are cut into chunks, so decodes never wait behind a prefill.

Speculative decoding (runtime/speculative.py; SchedulerConfig.spec_max_tokens > 0): last, with the budget
and free KV blocks left after every decode, prefill chunk and admission, a decoding sequence may get draft
tokens proposed from its own prompt and output (its `spec` state; none for guided or speculative=False
requests) as extra query tokens of its row: ScheduledSeq.spec_token_ids, with logits for every row from the
last verified token on. A guided request's drafts are the tokens its grammar forces next, which the engine
reports with each step (ModelRunnerOutput.forced_token_ids; runtime/guided.py): they are verified the same
way, whether or not prompt-lookup drafts are on. Drafts never take budget or blocks that a prefill or
another sequence's token would use, and never preempt. update_from_output takes the accepted drafts plus
the target's next token, rolls num_computed_tokens back past the rejected ones and frees the blocks only they
used (the block table is truncated, nothing is copied). Drafts never enter token_ids, so the prefix cache
only ever hashes verified tokens.

Embedding requests (SamplingParams.pooling) are prefill-only: their chunks run in the same steps as everything
else, with ScheduledSeq.hidden_rows instead of logits, and the request finishes ("stop", no token) when its last
chunk has run, its KV blocks freed at once. Mean pooling needs every prompt row, so it takes no prefix-cache hits.

Finish reasons: "stop" (EOS / stop token id here; stop strings are found by the detokenizer and reported
by the engine through finish_requests), "length" (max_tokens), "cancelled", "error" (engine-reported),
"deadline" (still queued, no token out, deadline_s after submission).

Not thread-safe, except finish_requests and has_unfinished_requests, which may be called from any thread.
"""

from __future__ import annotations

import abc
import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Container, Iterable, Sequence

import numpy as np

from .block_pool import BlockPool, extend_block_hashes
from .config import CacheConfig, SchedulerConfig
from .errors import ConfigError, Overloaded, RequestError
from .limits import SequenceLimits
from .sampling_params import SamplingParams, adapter_cache_key, adapter_names
from .scheduler_messages import (CANCELLED, DEADLINE, ERROR, FINISH_REASONS, LENGTH, STOP,  # noqa: F401
                                 ModelRunnerOutput, RequestUpdate, ScheduledSeq, SchedulerOutput, SchedulerStats)
from .speculative import SpecState


# ---- the scheduler's own state (its messages: runtime/scheduler_messages.py) ------------------------------

class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    req_id: str
    params: SamplingParams
    token_ids: list[int]                   # prompt then output: [num_prompt_tokens + num_output_tokens]
    num_prompt_tokens: int
    arrival_time: float
    arrival_seq: int                       # FIFO order within a priority
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0           # leading tokens whose KV is in block_ids
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # of the full blocks of token_ids
    num_cached_blocks: int = 0             # leading blocks registered in (or taken from) the prefix cache
    admit_seq: int = -1                    # admission order; the largest is the youngest running
    preempted: bool = False
    num_preemptions: int = 0
    skipped_steps: int = 0                 # steps a later request was admitted instead (aging)
    finish_reason: str | None = None
    adapter_key: str | None = None         # the adapter's content key (prefix-cache hashes), fixed at arrival
    spec: SpecState | None = None          # prompt-lookup drafting state; None: never drafted that way
    forced_token_ids: list[int] = field(default_factory=list)   # what the grammar forces after token_ids:
                                                                 # the next decode step's drafts
    stop_ids: frozenset[int] = frozenset()  # ids that finish it with "stop" (SamplingParams.stop_ids), at arrival

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]


# ---- interface -----------------------------------------------------------------------------------------

class SchedulerInterface(abc.ABC):
    @abc.abstractmethod
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int],
                    params: SamplingParams | None = None) -> Request:
        """Queue a request; it runs from a later schedule().

        The request was checked by the engine's input processor (runtime/request_input.py: parameters, token ids,
        max_tokens fitted); here only what the scheduler alone knows. Raises at once, queueing nothing:
        PromptTooLong (prompt + max_tokens can never fit the KV pool: self.limits, runtime/limits.py),
        RequestError (id in use), Overloaded (max_queued requests already waiting).
        """

    @abc.abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Plan the next step: free what finish_requests marked, expire deadlines, then pick tokens.

        Allocates the KV blocks the step writes. When blocks run out, the lowest-priority youngest running
        sequence is preempted (KV freed, requeued at the front, recomputed from prompt + output later);
        a step that preempted admits nothing new. Waiting requests are tried by priority (higher first),
        then preempted, aged, resident adapter, arrival; one that would add an adapter beyond
        max_adapters_per_batch is skipped, unless it is preempted or aged, in which case nothing behind it
        is admitted until running adapters drain. All running sequences together use at most
        max_adapters_per_batch adapters. Call update_from_output once for each output before the next
        schedule().
        """

    @abc.abstractmethod
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[RequestUpdate]:
        """Record a finished step: advance computed tokens, cache blocks that filled, append sampled
        tokens, finish on EOS / stop token ids / max_tokens (their KV freed at once). A row with drafts
        takes its accepted drafts plus one token; computed tokens and the block table roll back past the
        rejected ones; a stop among the accepted tokens drops those after it. runner_output.forced_token_ids
        become the sequence's drafts for its next decode step (replacing any it had).

        Returns one update per sequence that got a token, and one (no tokens, "stop") per embedding request
        whose last chunk ran. Sequences finished through finish_requests after schedule() are skipped.
        """

    @abc.abstractmethod
    def finish_requests(self, req_ids: str | Iterable[str], reason: str = CANCELLED) -> None:
        """Mark requests finished (cancel, stop string, error). Thread-safe and cheap: their KV blocks are
        freed at the start of the next schedule(), which reports them in SchedulerOutput.finished.
        Unknown or already finished ids are ignored."""

    @abc.abstractmethod
    def has_unfinished_requests(self) -> bool:
        """True while anything is waiting, running, or marked finished but not yet reported."""

    @abc.abstractmethod
    def stats(self) -> SchedulerStats:
        """Counters for metrics: queue lengths, preemptions, KV usage, prefix cache hit rate."""


# ---- implementation ------------------------------------------------------------------------------------

def _decodes(req: Request, n: int) -> bool:
    """req's n tokens this step are a decode: its last sampled token, the one token it has left to compute."""
    return n == 1 and req.num_tokens - req.num_computed_tokens == 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler(SchedulerInterface):
    def __init__(self, config: SchedulerConfig, cache: CacheConfig, *, num_blocks: int | None = None,
                 eos_token_ids: Collection[int] = (),
                 is_resident: Callable[[str], bool] | Container[str] | None = None,
                 adapter_key: Callable[[str], str] | None = None,
                 context_length: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """num_blocks: the pool size (block 0 included) if cache.num_blocks was left to a memory budget.
        is_resident: adapter name -> already in a session slot (a callable or a set); None: all are.
        adapter_key: adapter name -> its content key (the engine passes the manifest's sha256), read once per
        request for the prefix-cache hashes; None: the name itself (only for tests without a model).
        context_length: the model's positions, one of the limits (self.limits); None: the pool and max_model_len."""
        num_blocks = num_blocks or cache.num_blocks
        if num_blocks is None:
            raise ConfigError("Scheduler needs num_blocks: set CacheConfig.num_blocks or pass "
                              "num_blocks=cache.resolve_num_blocks(bytes_per_block)")
        if config.max_batch_tokens < cache.block_size:
            raise ConfigError(f"max_batch_tokens must be >= block_size ({cache.block_size}); "
                              f"got {config.max_batch_tokens}")
        self.config = config
        self.block_size = cache.block_size
        self.pool = BlockPool(num_blocks, cache.block_size, cache.enable_prefix_cache)
        self.eos_token_ids = frozenset(eos_token_ids)
        if is_resident is None:
            self._is_resident: Callable[[str], bool] = lambda name: True
        elif callable(is_resident):
            self._is_resident = is_resident
        else:
            self._is_resident = is_resident.__contains__
        self._adapter_key = adapter_key or (lambda name: name)
        # how many tokens a sequence may hold: the one place that decides it (runtime/limits.py)
        self.limits = SequenceLimits.of(config, self.pool.num_usable, self.block_size, context_length)
        self.clock = clock
        self.requests: dict[str, Request] = {}   # unfinished requests by id
        self.waiting: list[Request] = []           # unordered; ordered by _waiting_key in schedule()
        self.running: list[Request] = []           # admission order, oldest first
        self._pending_finish: dict[str, str] = {}
        self._lock = threading.Lock()
        self._step = 0
        self._arrivals = 0
        self._admissions = 0
        self.num_preemptions = 0
        self._watermark = self.pool.num_usable // 100   # blocks kept back from admissions for decodes
        self.spec_rows = self.spec_drafted = self.spec_accepted = 0
        self.forced_drafted = self.forced_accepted = 0
        self.spec_propose_time = 0.0

    # ---- requests in ----
    def add_request(self, req_id: str, prompt_token_ids: Sequence[int],
                    params: SamplingParams | None = None) -> Request:
        params = params or SamplingParams()
        if req_id in self.requests:
            raise RequestError(f"request id {req_id!r} is already in use; give each request a unique id")
        prompt = list(prompt_token_ids)
        self.limits.admit(len(prompt), 0 if params.pooling else params.max_tokens)   # an embedding generates nothing
        if len(self.waiting) >= self.config.max_queued:
            raise Overloaded(len(self.waiting), self.config.max_queued)
        key = adapter_cache_key(params.adapter_mix, self._adapter_key)   # a mix: each adapter's key and weight
        req = Request(req_id, params, prompt, len(prompt), self.clock(), self._arrivals, adapter_key=key,
                      stop_ids=params.stop_ids(self.eos_token_ids))
        self._arrivals += 1
        c = self.config
        if c.spec_max_tokens and params.speculative and params.guide is None and params.pooling is None:
            req.spec = SpecState.create(c.spec_ngram_min, c.spec_ngram_max, c.spec_max_tokens)
        if self.pool.enable_prefix_cache:
            extend_block_hashes(req.block_hashes, req.token_ids, self.block_size, key)
        self.requests[req_id] = req
        self.waiting.append(req)
        return req

    def finish_requests(self, req_ids: str | Iterable[str], reason: str = CANCELLED) -> None:
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}; got {reason!r}")
        ids = [req_ids] if isinstance(req_ids, str) else list(req_ids)
        with self._lock:
            for rid in ids:
                self._pending_finish.setdefault(rid, reason)

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return bool(self.requests) or bool(self._pending_finish)

    def get_request(self, req_id: str) -> Request | None:
        return self.requests.get(req_id)

    def queued_adapters(self) -> list[str]:
        """Adapters of waiting requests, most wanted first: what to prefetch while the step runs."""
        out: dict[str, None] = {}
        for r in sorted(self.waiting, key=self._waiting_key):
            for name in r.params.adapter_names:
                out.setdefault(name)
        return list(out)

    # ---- one step ----
    def schedule(self) -> SchedulerOutput:
        self._step += 1
        finished = self._apply_pending_finish()
        self._expire_deadlines(finished)
        sched: dict[str, int] = {}       # req_id -> tokens this step, in batch order
        preempted: list[str] = []
        chunk = self.config.prefill_chunk

        def budget() -> int:        # tokens left this step (preemption may hand some back)
            return self.config.max_batch_tokens - sum(sched.values())

        for decoding in (True, False):
            for req in list(self.running):
                if req.status is not RequestStatus.RUNNING or req.req_id in sched:
                    continue
                remaining = req.num_tokens - req.num_computed_tokens
                if (remaining == 1) != decoding:
                    continue
                n = min(remaining, budget(), chunk)
                if n > 0 and self._grow(req, n, sched, preempted):
                    sched[req.req_id] = n

        if not preempted:   # memory is tight: admitting now would only thrash (as vLLM v1)
            self._admit(sched, chunk, budget)
        drafts = self._draft(sched, budget)
        steps = self._decode_steps(sched) if not drafts and not preempted else 1
        seqs = [self._scheduled_seq(self.requests[rid], n, drafts.get(rid, [])) for rid, n in sched.items()]
        adapters = sorted({name for s in seqs for name in adapter_names(s.adapter)})
        return SchedulerOutput(self._step, seqs, dict(sched), sum(sched.values()), adapters, preempted, finished,
                               steps)

    def _decode_steps(self, sched: dict[str, int]) -> int:
        """Model steps for this schedule (SchedulerConfig.decode_steps): k > 1 when every scheduled seq decodes
        one token by the raw argmax, k at most each one's tokens left (max_tokens) and what the free blocks hold
        (never preempting for it); their blocks for k tokens are allocated here."""
        k = self.config.decode_steps
        if k == 1 or not sched:
            return 1
        reqs = [self.requests[rid] for rid in sched]
        for req in reqs:
            p = req.params
            if not _decodes(req, sched[req.req_id]) or not p.raw_argmax or p.guide is not None or p.pooling:
                return 1
            k = min(k, p.max_tokens - (req.num_tokens - req.num_prompt_tokens))
        need = [_cdiv(r.num_computed_tokens + k, self.block_size) - len(r.block_ids) for r in reqs]
        if k <= 1 or sum(need) > self.pool.num_free:
            return 1
        for req, n in zip(reqs, need):
            if n > 0:
                req.block_ids += self.pool.allocate(n)
        return k

    def _grow(self, req: Request, n: int, sched: dict[str, int], preempted: list[str]) -> bool:
        """Give req the blocks for n more tokens, preempting others if needed; False if req itself went."""
        need = _cdiv(req.num_computed_tokens + n, self.block_size) - len(req.block_ids)
        while need > self.pool.num_free:
            victim = max(self.running, key=lambda r: (-r.params.priority, r.admit_seq))
            self._preempt(victim)
            preempted.append(victim.req_id)
            sched.pop(victim.req_id, None)
            if victim is req:
                return False
        if need > 0:
            req.block_ids += self.pool.allocate(need)
        return True

    def _admit(self, sched: dict[str, int], chunk: int, budget: Callable[[], int]) -> None:
        if not self.waiting:     # the common decode step: nothing to admit, no one to age
            return
        adapters = {name for r in self.running for name in r.params.adapter_names}   # distinct, mixes' each
        cap = self.config.max_adapters_per_batch
        admitted: list[Request] = []
        for req in sorted(self.waiting, key=self._waiting_key):
            if budget() <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            urgent = req.preempted or req.skipped_steps >= self.config.aging_steps
            names = req.params.adapter_names
            if len(adapters.union(names)) > cap:
                if urgent:
                    break       # hold later requests back so running adapters drain and this one gets a slot
                continue
            hits: list[int] = []
            # the last token is always recomputed so logits exist; prompt_logprobs and mean pooling need every
            # prompt row
            if self.pool.enable_prefix_cache and not req.params.prompt_logprobs and req.params.pooling != "mean":
                hits = self.pool.match_prefix(req.block_hashes[:(req.num_tokens - 1) // self.block_size])
            computed = len(hits) * self.block_size
            n = min(req.num_tokens - computed, budget(), chunk)
            need = _cdiv(computed + n, self.block_size) - len(hits)
            free_after = self.pool.num_free - sum(self.pool.is_evictable(b) for b in hits) - need
            if free_after < (self._watermark if self.running else 0):
                break
            self.pool.touch(hits)
            if self.pool.enable_prefix_cache:
                self.pool.record_lookup(req.num_tokens, computed)
            req.block_ids = hits + self.pool.allocate(need)
            req.num_computed_tokens = computed
            req.num_cached_blocks = len(hits)
            req.status = RequestStatus.RUNNING
            req.admit_seq = self._admissions
            self._admissions += 1
            self.waiting.remove(req)
            self.running.append(req)
            adapters.update(names)
            sched[req.req_id] = n
            admitted.append(req)
        for w in self.waiting:
            if any(a.arrival_seq > w.arrival_seq and a.params.priority <= w.params.priority for a in admitted):
                w.skipped_steps += 1

    def _draft(self, sched: dict[str, int], budget: Callable[[], int]) -> dict[str, list[int]]:
        """Drafts for the decode rows of this step, from what budget and free blocks are left (added to sched):
        the grammar's forced tokens, else prompt-lookup proposals."""
        drafts: dict[str, list[int]] = {}
        t0 = time.perf_counter()
        decoding = [rid for rid, n in sched.items() if _decodes(self.requests[rid], n)]
        lookup = len(decoding) <= self.config.spec_max_batch    # prompt-lookup drafts pay in small steps only
        for rid in decoding:
            req = self.requests[rid]
            if not req.forced_token_ids and (req.spec is None or not lookup):
                continue
            start = req.num_computed_tokens
            room = (len(req.block_ids) + self.pool.num_free) * self.block_size - start - 1
            # the accepted drafts and the bonus token must fit max_tokens
            left = req.params.max_tokens - (req.num_tokens - req.num_prompt_tokens) - 1
            limit = min(budget(), left, room)
            d = (req.forced_token_ids[:max(limit, 0)] if req.forced_token_ids
                 else req.spec.propose(req.token_ids, limit))
            if not d:
                continue
            need = _cdiv(start + 1 + len(d), self.block_size) - len(req.block_ids)
            if need > 0:
                req.block_ids += self.pool.allocate(need)
            sched[rid] = 1 + len(d)
            drafts[rid] = d
        self.spec_propose_time += time.perf_counter() - t0
        return drafts

    def _waiting_key(self, req: Request) -> tuple:
        """Priority first; then preempted, aged, resident adapter; then arrival."""
        aged = req.skipped_steps >= self.config.aging_steps
        resident = all(self._is_resident(name) for name in req.params.adapter_names)
        return (-req.params.priority, not req.preempted, not aged, not resident, req.arrival_seq)

    def _scheduled_seq(self, req: Request, n: int, drafts: list[int]) -> ScheduledSeq:
        start, n = req.num_computed_tokens, n - len(drafts)
        last, pooling = start + n == req.num_tokens, req.params.pooling
        hidden = n if pooling == "mean" else int(last) if pooling == "last" else 0
        return ScheduledSeq(req.req_id, req.token_ids[start:start + n] + drafts, start, list(req.block_ids),
                            last and pooling is None, req.params.adapter_mix, drafts, hidden)

    # ---- step results ----
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[RequestUpdate]:
        with self._lock:
            pending = set(self._pending_finish)
        updates = []
        for s in scheduler_output.seqs:
            req = self.requests.get(s.req_id)
            if req is None or req.status is not RequestStatus.RUNNING or s.req_id in pending:
                continue
            req.num_computed_tokens += s.num_tokens
            if not s.needs_logits:
                self._cache_full_blocks(req)
                if req.params.pooling and req.num_computed_tokens == req.num_tokens:   # an embedding's last chunk
                    self._remove(req, STOP)
                    updates.append(RequestUpdate(s.req_id, [], STOP))
                continue
            toks = self._sampled(s, runner_output, scheduler_output.decode_steps)
            if s.spec_token_ids:
                self._roll_back(req, s, len(toks) - 1)
            elif scheduler_output.decode_steps > 1:   # step j fed token j - 1; the blocks of steps not run freed
                req.num_computed_tokens += len(toks) - 1
                self._trim_blocks(req)
            req.forced_token_ids = list(runner_output.forced_token_ids.get(s.req_id, ()))
            reason, new = None, []
            for tok in toks:            # a stop inside the accepted drafts drops the tokens after it
                req.token_ids.append(tok)
                new.append(tok)
                reason = self._check_stop(req, tok)
                if reason is not None:
                    break
            if self.pool.enable_prefix_cache:
                extend_block_hashes(req.block_hashes, req.token_ids, self.block_size, req.adapter_key)
            self._cache_full_blocks(req)
            if reason is not None:
                self._remove(req, reason)
            updates.append(RequestUpdate(s.req_id, new, reason))
        return updates

    @staticmethod
    def _sampled(s: ScheduledSeq, runner_output: ModelRunnerOutput, steps: int = 1) -> list[int]:
        try:
            got = runner_output.sampled_token_ids[s.req_id]
        except KeyError:
            raise ValueError(f"runner output has no sampled token for {s.req_id!r}, which needed logits") from None
        toks = [int(got)] if isinstance(got, (int, np.integer)) else [int(t) for t in got]
        if steps > 1:
            if not 1 <= len(toks) <= steps:
                raise ValueError(f"runner output for {s.req_id!r} must be 1 to {steps} tokens (one a decode step); "
                                 f"got {toks}")
            return toks
        k = len(s.spec_token_ids)
        if not 1 <= len(toks) <= k + 1 or toks[:-1] != s.spec_token_ids[:len(toks) - 1]:
            raise ValueError(f"runner output for {s.req_id!r} must be its accepted drafts (of {s.spec_token_ids}) "
                             f"then one token; got {toks}")
        return toks

    def _roll_back(self, req: Request, s: ScheduledSeq, accepted: int) -> None:
        """Forget the KV of the rejected drafts: computed tokens end after the last accepted one; blocks past
        the one the next token goes into are freed (tail first)."""
        k = len(s.spec_token_ids)
        req.num_computed_tokens -= k - accepted
        self._trim_blocks(req)
        if req.forced_token_ids:     # the drafts were the grammar's (still those of the step's schedule())
            self.forced_drafted += k
            self.forced_accepted += accepted
            return
        req.spec.record(k, accepted)
        self.spec_rows += 1
        self.spec_drafted += k
        self.spec_accepted += accepted

    def _trim_blocks(self, req: Request) -> None:
        """Free the blocks past the one the next token goes into (tail first): rejected drafts, steps not run."""
        keep = _cdiv(req.num_computed_tokens + 1, self.block_size)
        if len(req.block_ids) > keep:
            self.pool.free(reversed(req.block_ids[keep:]))
            del req.block_ids[keep:]

    def _cache_full_blocks(self, req: Request) -> None:
        if not self.pool.enable_prefix_cache:
            return
        full = min(req.num_computed_tokens, req.num_tokens) // self.block_size   # (a stop inside accepted drafts)
        for i in range(req.num_cached_blocks, full):
            self.pool.register(req.block_ids[i], req.block_hashes[i])
        req.num_cached_blocks = max(req.num_cached_blocks, full)

    def _check_stop(self, req: Request, tok: int) -> str | None:
        if tok in req.stop_ids:
            return STOP
        if req.num_tokens - req.num_prompt_tokens >= req.params.max_tokens:
            return LENGTH
        return None

    # ---- leaving ----
    def _apply_pending_finish(self) -> dict[str, str]:
        with self._lock:
            pending, self._pending_finish = self._pending_finish, {}
        finished = {}
        for rid, reason in pending.items():
            req = self.requests.get(rid)
            if req is not None:
                self._remove(req, reason)
                finished[rid] = reason
        return finished

    def _expire_deadlines(self, finished: dict[str, str]) -> None:
        now = self.clock()
        for req in list(self.waiting):
            d = req.params.deadline_s
            if d is not None and req.num_tokens == req.num_prompt_tokens and now - req.arrival_time > d:
                self._remove(req, DEADLINE)
                finished[req.req_id] = DEADLINE

    def _free_blocks(self, req: Request) -> None:
        self.pool.free(reversed(req.block_ids))   # tail first: evicted before the shared prefix
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_cached_blocks = 0

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free_blocks(req)
        req.status = RequestStatus.WAITING
        req.preempted = True
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(req)

    def _remove(self, req: Request, reason: str) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        self._free_blocks(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        del self.requests[req.req_id]

    def stats(self) -> SchedulerStats:
        return SchedulerStats(self._step, len(self.running), len(self.waiting), self.num_preemptions,
                              self.pool.num_free, self.pool.num_usable, self.pool.num_cached,
                              self.pool.queries, self.pool.hits, self.spec_rows, self.spec_drafted,
                              self.spec_accepted, self.spec_propose_time, self.forced_drafted,
                              self.forced_accepted)
