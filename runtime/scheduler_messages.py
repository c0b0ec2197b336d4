"""The scheduler's messages: plain dataclasses that the scheduler, the model runner and the engine pass each other
(vLLM v1 keeps them apart in sched/output.py for the same reason). They live apart from the scheduler so that the
runner, the engine and the direct-step callers (scoring, benchmarks) read them without importing the
implementation (runtime/scheduler.py).

    Scheduler.schedule() -> SchedulerOutput [ScheduledSeq, ...] -> ModelRunner.execute() -> logits
    sampled tokens -> ModelRunnerOutput -> Scheduler.update_from_output() -> [RequestUpdate, ...]
    Scheduler.stats() -> SchedulerStats
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .sampling_params import AdapterSpec

STOP, LENGTH, CANCELLED, ERROR, DEADLINE = "stop", "length", "cancelled", "error", "deadline"
FINISH_REASONS = (STOP, LENGTH, CANCELLED, ERROR, DEADLINE)


@dataclass
class ScheduledSeq:
    """One sequence's share of a step. Its tokens occupy positions start_pos .. start_pos + len(token_ids) - 1."""
    req_id: str
    token_ids: list[int]       # [n] tokens fed this step: a prefill chunk, or the last sampled token (decode)
    start_pos: int             # = tokens already in the KV cache (context_lens[s])
    block_ids: list[int]       # block table covering start_pos + n tokens; pad with block 0 (null)
    needs_logits: bool         # last prefill chunk or decode: sample a token from this seq's last row
    adapter: AdapterSpec       # None: base model; an adapter's name; or a mix ((name, weight), ...) (sampling_params)
    spec_token_ids: list[int] = field(default_factory=list)   # [k] drafts: the last k of token_ids; logits
                                                               # for the last k + 1 rows (needs_logits)
    hidden_rows: int = 0       # embedding requests: the last hidden_rows rows return their final hidden state
                               # (mean pooling: every row; last-token pooling: the last row of the last chunk)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    step: int
    seqs: list[ScheduledSeq]               # batch order: decodes, then running prefill chunks, then admissions
    num_scheduled_tokens: dict[str, int]   # req_id -> tokens this step
    total_num_scheduled_tokens: int        # <= max_batch_tokens
    adapters: list[str]                    # distinct adapters this step (<= max_adapters_per_batch): load first
    preempted_req_ids: list[str]           # lost their KV this step; queued again, recomputed later
    finished: dict[str, str]               # req_id -> reason, ended since the last step outside
                                           # update_from_output (finish_requests, deadline); KV now free
    # model steps this output covers (SchedulerConfig.decode_steps): > 1 only when every seq decodes one token by
    # the raw argmax; each seq's block_ids then cover decode_steps more tokens, and step j + 1 feeds step j's
    # token. The runner output gives each seq 1..decode_steps tokens (fewer: the steps ended early).
    decode_steps: int = 1


@dataclass
class ModelRunnerOutput:
    # req_id -> token, for every scheduled seq with needs_logits; a seq with drafts gets a list: the drafts
    # the target accepted, then its own next token (speculative.accept)
    sampled_token_ids: dict[str, int | list[int]]
    # req_id -> the tokens its grammar forces after those (guided requests): next step's drafts for it
    forced_token_ids: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class RequestUpdate:
    req_id: str
    new_token_ids: list[int]               # appended this step (the stop token included)
    finish_reason: str | None              # None: still running


@dataclass
class SchedulerStats:
    step: int
    num_running: int
    num_waiting: int
    num_preemptions: int                   # total since start
    num_free_blocks: int                   # free + cached-but-unreferenced
    num_usable_blocks: int                 # pool size minus the null block
    num_cached_blocks: int
    prefix_cache_queries: int              # prompt tokens looked up at admission
    prefix_cache_hits: int                 # of those, found cached
    spec_rows: int = 0                     # decode rows that carried drafts
    spec_drafted: int = 0                  # draft tokens verified
    spec_accepted: int = 0                 # of those, accepted
    spec_propose_time_s: float = 0.0       # spent proposing drafts (inside schedule())
    forced_drafted: int = 0                # grammar-forced draft tokens verified (guided requests)
    forced_accepted: int = 0               # of those, accepted

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks
