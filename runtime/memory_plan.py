"""What an engine will hold in memory, worked out from its config and artifact before it loads.

    weights    model.onnx.data (mapped or copied by ONNX Runtime: counted whole)
    KV pool    num_blocks x bytes_per_block; memory_budget_bytes="auto": auto_share of what is free after the
               other parts, at most what max_num_seqs sequences of max_model_len tokens fill
    adapters   the session's adapter slot stacks (max_slots x max_rank), plus the artifact's adapter files up to
               the host-RAM LRU budget
    headroom   activations of one step of max_batch_tokens tokens, and the runtime itself (an estimate)

`kv_pool_size` sizes every engine's pool from it. `ortllm serve` prints `MemoryPlan.lines()` at start and refuses a
plan with `problems()` (it does not fit the free memory, or cannot hold one sequence of the context it promises),
each problem saying what to lower. Names in the text are config keys; a caller maps them to its own (flags) with
`names`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from . import contract as C
from .config import AUTO, DEFAULT_KV_BUDGET_BYTES, EngineConfig
from .errors import ConfigError
from .host_memory import available_memory
from .limits import configured_sequence_tokens

GIB = 1 << 30
RUNTIME_BYTES = 256 << 20       # ONNX Runtime, the tokenizer, Python and the server around the session


@dataclass(frozen=True)
class MemoryPlan:
    weights: int                 # bytes of each part
    kv: int
    adapters: int
    headroom: int
    available: int | None        # free memory when planned (MemAvailable, the cgroup's limit); None: unknown
    num_blocks: int              # KV blocks in the pool, block 0 (the null block) included
    block_size: int
    bytes_per_block: int
    kv_dtype: str
    seq_tokens: int              # the most tokens one sequence holds (prompt + generated): max_model_len
    model_context: int           # the model's own context length
    max_num_seqs: int
    max_batch_tokens: int
    auto: bool                   # the KV pool was sized by memory_budget_bytes="auto"
    auto_share: float

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.adapters + self.headroom

    @property
    def kv_tokens(self) -> int:
        return (self.num_blocks - 1) * self.block_size

    @property
    def full_sequences(self) -> int:
        """Sequences of max_model_len tokens the KV pool holds at once."""
        return self.kv_tokens // max(1, self.seq_tokens)

    def limits(self) -> dict:
        """The serving limits this plan gives (what /v1/models and /health report)."""
        return {"max_model_len": self.seq_tokens, "max_num_seqs": self.max_num_seqs,
                "max_batch_tokens": self.max_batch_tokens, "kv_cache_tokens": self.kv_tokens,
                "kv_cache_bytes": self.kv}

    def lines(self, names: dict[str, str] | None = None) -> list[str]:
        n = _namer(names)
        kv_how = (f"; auto: {self.auto_share:.0%} of the free memory, at most {n('max_num_seqs')} full sequences"
                  if self.auto else "")
        out = [f"weights   {_gib(self.weights)}",
               f"KV cache  {_gib(self.kv)}  {self.kv_dtype}, {self.num_blocks - 1} blocks x {self.block_size} = "
               f"{self.kv_tokens} tokens: {self.full_sequences} sequences of {self.seq_tokens} "
               f"({n('max_model_len')}) at once, {self.max_num_seqs} running ({n('max_num_seqs')}){kv_how}",
               f"adapters  {_gib(self.adapters)}  slot stacks + adapter weights in host RAM",
               f"headroom  {_gib(self.headroom)}  activations of {self.max_batch_tokens} batch tokens "
               f"({n('max_batch_tokens')}) + runtime",
               f"total     {_gib(self.total)}" + (f" of {_gib(self.available)} available" if self.available else "")]
        if self.full_sequences < self.max_num_seqs and self.full_sequences >= 1:
            out.append(f"note: at full context {self.full_sequences} of {self.max_num_seqs} sequences fit the KV pool "
                       "at once; the others wait or are preempted and resumed")
        if self.kv_tokens < self.seq_tokens:
            out.append(f"note: one sequence holds at most {self.kv_tokens} tokens (the KV pool), fewer than "
                       f"{n('max_model_len')} {self.seq_tokens}")
        return out

    def problems(self, names: dict[str, str] | None = None, context_given: bool = True) -> list[str]:
        """Why this plan cannot be served, each with what to change; [] when it fits. context_given: the
        context was asked for (a pool too small for one such sequence is then refused, else only noted)."""
        n = _namer(names)
        out = []
        if self.seq_tokens > self.model_context:
            out.append(f"{n('max_model_len')} {self.seq_tokens} is more than the model's context length "
                       f"({self.model_context}); lower {n('max_model_len')} to at most {self.model_context}")
        if context_given and self.kv_tokens < self.seq_tokens:
            out.append(f"the KV pool holds {self.kv_tokens} tokens, fewer than one sequence of {n('max_model_len')} "
                       f"{self.seq_tokens}; raise {n('memory_budget_bytes')} (or use {AUTO}) or lower "
                       f"{n('max_model_len')}")
        if self.available is not None and self.total > self.available:
            biggest = max((("KV cache", self.kv), ("weights", self.weights), ("adapters", self.adapters)),
                          key=lambda p: p[1])[0]
            what = {"KV cache": f"lower {n('memory_budget_bytes')} (now {_gib(self.kv)}; {AUTO} fits the free "
                                f"memory), {n('max_num_seqs')} or {n('max_model_len')}",
                    "weights": "serve a smaller or more quantized build (ortllm build --quant int4)",
                    "adapters": f"lower {n('max_slots')} or {n('max_rank')}"}[biggest]
            out.append(f"the memory plan needs {_gib(self.total)} but {_gib(self.available)} are available; "
                       f"{what}")
        return out

    def check(self, names: dict[str, str] | None = None, context_given: bool = True) -> None:
        problems = self.problems(names, context_given)
        if problems:
            raise ConfigError("; and ".join(problems))


def plan_memory(config: EngineConfig, artifact, available: int | None = None) -> MemoryPlan:
    """The plan of an engine with this config on this artifact (runtime.artifact.Artifact). available: the free
    memory (default: read now, only needed for an "auto" KV pool and for problems())."""
    cfg, cache, sched = artifact.model_config, config.cache, config.scheduler
    dtype = cache.kv_dtype or C.KV_DTYPES[artifact.manifest["build"]["kv"]]
    per_block = cache.bytes_per_block(cfg["num_layers"], cfg["num_kv_heads"], cfg["head_dim"], dtype)
    model_context = int(cfg["max_position_embeddings"])
    seq_tokens = configured_sequence_tokens(sched, model_context)
    weights = artifact.file(C.MODEL_DATA).stat().st_size
    adapters = adapter_slot_bytes(cfg, config, artifact.manifest["build"].get("quant", "fp32")) + min(
        config.adapters.host_budget_bytes, _adapter_file_bytes(artifact.path))
    headroom = RUNTIME_BYTES + sched.max_batch_tokens * _activation_bytes_per_token(cfg)
    if available is None:
        available = available_memory()
    auto = cache.num_blocks is None and cache.memory_budget_bytes == AUTO
    if auto:
        free = (available or 2 * DEFAULT_KV_BUDGET_BYTES) - weights - adapters - headroom
        wanted = sched.max_num_seqs * -(-seq_tokens // cache.block_size) + 1
        num_blocks = max(2, min(int(cache.auto_share * max(free, 0)) // per_block, wanted))
    else:
        num_blocks = cache.resolve_num_blocks(per_block)
    return MemoryPlan(weights=weights, kv=num_blocks * per_block, adapters=adapters, headroom=headroom,
                      available=available, num_blocks=num_blocks, block_size=cache.block_size,
                      bytes_per_block=per_block, kv_dtype=dtype, seq_tokens=seq_tokens,
                      model_context=model_context, max_num_seqs=sched.max_num_seqs,
                      max_batch_tokens=sched.max_batch_tokens, auto=auto, auto_share=cache.auto_share)


def kv_pool_size(config: EngineConfig, artifact) -> tuple[int, int]:
    """(bytes per KV block over all layers, blocks in the pool) for this config and artifact."""
    plan = plan_memory(config, artifact)
    return plan.bytes_per_block, plan.num_blocks


def fixed_pool(config: EngineConfig, plan: MemoryPlan) -> EngineConfig:
    """config with the plan's pool size pinned (num_blocks), so the engine allocates what the plan printed."""
    return dataclasses.replace(config, cache=dataclasses.replace(config.cache, num_blocks=plan.num_blocks,
                                                                 memory_budget_bytes=None))


def adapter_slot_bytes(cfg: dict, config: EngineConfig, quant: str) -> int:
    """The adapter slot stacks ModelRunner.resize_adapter_slots allocates: per layer, slot and rank, each LoRA
    target's A [in, r] and B [r, out]: int8 codes (+ scales) for quantized projections, else float16. On a mixture
    of experts the MLP targets exist only where a layer keeps its dense MLP: per such layer in float16 (MultiLoRA),
    in every layer's int8 stack (QLinear) when there is one, none when every layer is sparse (Qwen3-MoE, gpt-oss)."""
    h, hd, layers = cfg["hidden_size"], cfg["head_dim"], cfg["num_layers"]
    q, kv, inter = cfg["num_heads"] * hd, cfg["num_kv_heads"] * hd, cfg["intermediate_size"]
    attention = (h + q) + 2 * (h + kv) + (q + h)           # q, k, v, o: per rank
    mlp = 2 * (h + inter) + (inter + h)                    # gate, up, down
    dense = layers if not cfg.get("num_experts") else len(cfg.get("dense_layers") or ())
    mlp_layers = dense if quant == "fp32" or not dense else layers
    rank = -(-config.adapters.max_rank // 4) * 4
    elem = 1.0625 if quant != "fp32" else 2.0          # int8 + an fp16 scale per 32 of A; float16
    return int(config.adapters.max_slots * rank * elem * (layers * attention + mlp_layers * mlp))


def _activation_bytes_per_token(cfg: dict) -> int:
    """float32 activations one token of a step keeps alive at once (residual, norms, q/k/v, the MLP's two
    intermediate halves, attention output): an estimate, not a measurement."""
    return 4 * (6 * cfg["hidden_size"] + 3 * cfg["intermediate_size"])


def _adapter_file_bytes(path: Path) -> int:
    d = Path(path) / "adapters"
    try:
        return sum(f.stat().st_size for f in d.iterdir() if f.is_file())
    except OSError:
        return 0


def _gib(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / GIB:.2f} GiB" if n >= GIB // 2 else f"{n / (1 << 20):.1f} MiB"


def _namer(names: dict[str, str] | None):
    names = names or {}
    return lambda key: names.get(key, key)
