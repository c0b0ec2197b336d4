"""One config tree for the engine (docs/architecture.md, Conventions), built once at the entry point and handed down.

    EngineConfig
    ├── scheduler: SchedulerConfig   token budget, queue, adapter cap per step, aging
    ├── cache:     CacheConfig       KV block size / count / dtype, prefix cache
    └── adapters:  AdapterConfig     adapter slots in the session, host-RAM budget

Every dataclass is frozen and validated in __post_init__; change one with `dataclasses.replace`, which
validates again. `EngineConfig.from_overrides(artifact, max_batch_tokens=64, kv_dtype="int8")` routes flat
keyword overrides to the sub-config that owns them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path

from .contract import KV_ALIASES, KV_DTYPE_NAMES, kv_row_bytes
from .errors import ConfigError

# Default KV budget when neither num_blocks nor memory_budget_bytes is set.
DEFAULT_KV_BUDGET_BYTES = 512 << 20
AUTO = "auto"      # CacheConfig.memory_budget_bytes = "auto": sized from the memory available (runtime/memory_plan.py)


def physical_cores() -> int:
    """Physical cores this process may run on (hyper-threads counted once)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu, phys, core = None, "0", None
            for line in f.read().splitlines() + [""]:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    cpu = int(value)
                elif key == "physical id":
                    phys = value
                elif key == "core id":
                    core = value
                elif not line.strip():
                    if cpu is not None and core is not None and cpu in allowed:
                        cores.add((phys, core))
                    cpu, phys, core = None, "0", None
    except OSError:
        pass
    return max(1, len(cores) or len(allowed))


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(name: str, v: object) -> None:
    _require(_is_int(v) and v >= 1, f"{name} must be a positive integer; got {v!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_tokens: int = 512        # tokens in one flattened step (decodes + prefill chunks)
    max_num_seqs: int = 32             # running sequences; each decodes one token per step
    max_queued: int = 256              # waiting requests before add_request raises Overloaded
    # distinct adapters in one step (the base model does not count). 16: on a saturated Zipf trace over 16 adapters
    # a cap of 4 held requests back (+39% time against the base model), 8 or 16 cost +11-12% (docs/notes/adapters.md)
    max_adapters_per_batch: int = 16
    long_prefill_chunk: int | None = None  # max prefill tokens of one sequence per step; None: max_batch_tokens
    aging_steps: int = 16              # steps a waiting request may be bypassed before it goes first
    max_model_len: int | None = None   # prompt + max_tokens cap; None: only the KV pool limits it
    # a request's max_tokens: the default when it sends none and the cap of one it sends (a larger one is clamped
    # to it, as llama-server's --n-predict; finish_reason "length" says so); None: the room the context leaves
    max_tokens: int | None = None
    # speculative decoding (runtime/speculative.py): prompt-lookup drafts verified in the decode row
    # drafted tokens per decode row at most; 0: speculative decoding off. Verified rows give bitwise the
    # logits of single decode steps at every context length (tests/runtime/test_long_context_invariance.py),
    # so drafts never change the tokens. On by default: on a quiet machine it gains at B = 1 on both grounded
    # and open-ended chat (docs/benchmarks.md; the runs: docs/notes/benchmarks.md, "Speculative decoding").
    spec_max_tokens: int = 8
    # shortest suffix n-gram looked up in the sequence's own tokens: 3 since multi-step decoding made plain greedy
    # steps cheaper; 2-token matches drafted often enough on open chat to cost 3.6% there (docs/notes/benchmarks.md)
    spec_ngram_min: int = 3
    spec_ngram_max: int = 4            # longest (tried first)
    # prompt-lookup drafts only in steps with at most this many decode rows: a drafted token costs about what
    # a decode row costs, so it pays while a step's fixed cost (streaming the weights, per-node overhead)
    # dominates, not once the rows' own arithmetic is most of the step: open-ended chat measured 0.96x at
    # B = 4 with drafts on, 1.00x at B = 2 (docs/notes/benchmarks.md). Forced tokens of a grammar are drafted at any
    # batch size (they are always accepted).
    spec_max_batch: int = 2
    # multi-step decoding (vLLM's num_scheduler_steps): a step in which every row decodes one token by the raw
    # argmax (greedy, no logprobs, penalties, logit_bias or guide) runs up to this many model steps from one
    # schedule(), each step's input ids bound to the previous one's logits_argmax, so scheduling, sampling and
    # detokenizing run once per decode_steps tokens. The tokens are those of single steps (the same graph per
    # step); a stop token ends the steps early; streamed text arrives decode_steps tokens at a time. 1: off.
    decode_steps: int = 4

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_num_seqs", "max_queued", "max_adapters_per_batch", "aging_steps",
                     "spec_ngram_min", "spec_ngram_max", "spec_max_batch", "decode_steps"):
            _positive_int(name, getattr(self, name))
        _require(_is_int(self.spec_max_tokens) and self.spec_max_tokens >= 0,
                 f"spec_max_tokens must be an integer >= 0 (0 turns speculative decoding off); "
                 f"got {self.spec_max_tokens!r}")
        _require(self.spec_ngram_min <= self.spec_ngram_max,
                 f"spec_ngram_min ({self.spec_ngram_min}) must be <= spec_ngram_max ({self.spec_ngram_max})")
        _require(self.max_num_seqs <= self.max_batch_tokens,
                 f"max_num_seqs ({self.max_num_seqs}) must be <= max_batch_tokens ({self.max_batch_tokens}) "
                 "so every running sequence can decode each step; lower max_num_seqs or raise max_batch_tokens")
        if self.long_prefill_chunk is not None:
            _positive_int("long_prefill_chunk", self.long_prefill_chunk)
            _require(self.long_prefill_chunk <= self.max_batch_tokens,
                     f"long_prefill_chunk must be <= max_batch_tokens ({self.max_batch_tokens}); "
                     f"got {self.long_prefill_chunk}")
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        if self.max_tokens is not None:
            _positive_int("max_tokens", self.max_tokens)

    @property
    def prefill_chunk(self) -> int:
        """Derived: the most prefill tokens one sequence takes in one step."""
        return self.long_prefill_chunk or self.max_batch_tokens


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16                    # tokens per KV block (a power of two)
    num_blocks: int | None = None           # blocks in the pool, block 0 included (reserved as the null block)
    # alternative to num_blocks: size the pool from a byte budget; "auto": auto_share of the memory available after
    # the weights, adapter slots and headroom, at most what max_num_seqs sequences of max_model_len tokens fill
    memory_budget_bytes: int | str | None = None
    kv_dtype: str | None = None             # float32 | int8 | fp8_e4m3; None: the artifact's build option
    enable_prefix_cache: bool = True
    auto_share: float = 0.5                 # memory_budget_bytes="auto": the share of the free memory the KV pool takes

    def __post_init__(self) -> None:
        _positive_int("block_size", self.block_size)
        _require(self.block_size & (self.block_size - 1) == 0 and self.block_size <= 1024,
                 f"block_size must be a power of two <= 1024 (e.g. 16); got {self.block_size}")
        _require(self.num_blocks is None or self.memory_budget_bytes is None,
                 "set num_blocks or memory_budget_bytes, not both")
        if self.num_blocks is not None:
            _require(_is_int(self.num_blocks) and self.num_blocks >= 2,
                     f"num_blocks must be >= 2 (block 0 is the reserved null block); got {self.num_blocks!r}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes != AUTO:
            _require(_is_int(self.memory_budget_bytes) and self.memory_budget_bytes >= 1,
                     f"memory_budget_bytes must be a positive integer or {AUTO!r}; got {self.memory_budget_bytes!r}")
        _require(isinstance(self.auto_share, (int, float)) and not isinstance(self.auto_share, bool)
                 and 0 < self.auto_share <= 1,
                 f"auto_share must be in (0, 1] (the share of the free memory an auto-sized KV pool takes); "
                 f"got {self.auto_share!r}")
        if self.kv_dtype is not None:
            dtype = KV_ALIASES.get(self.kv_dtype, self.kv_dtype)
            _require(dtype in KV_DTYPE_NAMES,
                     f"kv_dtype must be one of {', '.join(KV_DTYPE_NAMES)}; got {self.kv_dtype!r}")
            object.__setattr__(self, "kv_dtype", dtype)
        _require(isinstance(self.enable_prefix_cache, bool),
                 f"enable_prefix_cache must be True or False; got {self.enable_prefix_cache!r}")

    def bytes_per_block(self, num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str | None = None) -> int:
        """K and V of one block over all layers: [2, layers, block_size, kv_heads] rows of head_dim elements (int4:
        two a byte), plus one fp16 scale per (token, head) for the quantized dtypes."""
        dtype = kv_dtype or self.kv_dtype or "float32"
        return 2 * num_layers * self.block_size * num_kv_heads * kv_row_bytes(dtype, head_dim)

    def resolve_num_blocks(self, bytes_per_block: int) -> int:
        """num_blocks if set, else as many blocks as the byte budget holds (default DEFAULT_KV_BUDGET_BYTES). An
        "auto" budget is resolved against the machine first (runtime/memory_plan.py: plan_memory)."""
        if self.num_blocks is not None:
            return self.num_blocks
        _require(self.memory_budget_bytes != AUTO, 'memory_budget_bytes="auto" is resolved by '
                 "memory_plan.plan_memory (it needs the artifact and the free memory); pass its num_blocks")
        budget = self.memory_budget_bytes or DEFAULT_KV_BUDGET_BYTES
        n = budget // bytes_per_block
        _require(n >= 2, f"memory_budget_bytes ({budget}) holds {n} KV blocks of {bytes_per_block} bytes; "
                         "at least 2 are needed: raise memory_budget_bytes")
        return n


@dataclass(frozen=True)
class AdapterConfig:
    max_slots: int = 16                      # adapters resident in the session at once (>= the per-step cap)
    max_rank: int = 64                       # LoRA rank of a slot
    host_budget_bytes: int = 1 << 30         # host-RAM LRU of loaded adapter weights

    def __post_init__(self) -> None:
        for name in ("max_slots", "max_rank", "host_budget_bytes"):
            _positive_int(name, getattr(self, name))


@dataclass(frozen=True)
class EngineConfig:
    artifact: Path
    threads: int | None = None               # None: physical cores available to this process
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    adapters: AdapterConfig = field(default_factory=AdapterConfig)
    seed: int = 0                            # engine seed; requests without a seed draw from it
    # the ops' kernel path for this engine's session ("avx2", "scalar", ...: ops_library.ops_isas()); None: the
    # default (ORTLLM_OPS_ISA, else the best this CPU runs). Every path gives the same tokens.
    ops_isa: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifact", Path(self.artifact))
        if self.threads is None:
            object.__setattr__(self, "threads", physical_cores())
        _positive_int("threads", self.threads)
        _require(_is_int(self.seed) and self.seed >= 0, f"seed must be a non-negative integer; got {self.seed!r}")
        _require(self.ops_isa is None or (isinstance(self.ops_isa, str) and self.ops_isa != ""),
                 f"ops_isa must be a kernel path's name (e.g. 'avx2') or None; got {self.ops_isa!r}")
        s, c, a = self.scheduler, self.cache, self.adapters
        _require(s.max_batch_tokens >= c.block_size,
                 f"max_batch_tokens must be >= block_size ({c.block_size}); got {s.max_batch_tokens}")
        _require(s.max_adapters_per_batch <= a.max_slots,
                 f"max_adapters_per_batch ({s.max_adapters_per_batch}) must be <= max_slots ({a.max_slots}); "
                 "lower max_adapters_per_batch or raise max_slots")

    @classmethod
    def from_overrides(cls, artifact: str | os.PathLike, **overrides: object) -> EngineConfig:
        """Build from flat keyword overrides, each routed to the sub-config that owns the field.

        Sub-configs themselves may be passed too (scheduler=SchedulerConfig(...)); flat keys apply on top.
        """
        top = {k: overrides.pop(k) for k in list(overrides) if k in _TOP_KEYS}
        parts: dict[str, dict[str, object]] = {name: {} for name in _SUB_CONFIGS}
        for key, value in overrides.items():
            owner = _OWNER.get(key)
            if owner is None:
                close = difflib.get_close_matches(key, _VALID_KEYS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(sorted(_VALID_KEYS))}")
            parts[owner][key] = value
        for name, sub_cls in _SUB_CONFIGS.items():
            base = top.get(name) or sub_cls()
            if not isinstance(base, sub_cls):
                raise ConfigError(f"{name} must be a {sub_cls.__name__}; got {type(base).__name__}")
            top[name] = dataclasses.replace(base, **parts[name]) if parts[name] else base
        return cls(artifact=artifact, **top)


_SUB_CONFIGS = {"scheduler": SchedulerConfig, "cache": CacheConfig, "adapters": AdapterConfig}
_TOP_KEYS = {f.name for f in dataclasses.fields(EngineConfig)} - {"artifact"}
_OWNER = {f.name: name for name, sub in _SUB_CONFIGS.items() for f in dataclasses.fields(sub)}
assert len(_OWNER) == sum(len(dataclasses.fields(s)) for s in _SUB_CONFIGS.values()), "sub-config keys collide"
_VALID_KEYS = sorted(set(_OWNER) | _TOP_KEYS)
