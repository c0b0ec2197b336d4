"""The contract between the build pipeline and the runtime: artifact files, graph I/O names and shapes.

Imported by the graph builder and the runtime alike (STYLE.md 2). An artifact whose manifest carries
another FORMAT_VERSION or CONTRACT_VERSION is refused at load, by name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import ConfigError

FORMAT_VERSION = 1          # layout of the artifact directory and manifest.json
CONTRACT_VERSION = 7        # graph input/output names, shapes and semantics below
                            # (2: float16 lora.* stacks, lora.rank per target;
                            #  3: lora.*.a slots packed [in, rank] (MultiLoRA packed_a = 1);
                            #  4: key_scales / value_scales float16 (ops ABI 4);
                            #  5: quantized projections are ortllm::QLinear (ops ABI 5);
                            #  6: QLinear's lora stacks int8 with fp16 scales (ops ABI 6);
                            #  7: QLinear's lora stacks one input per target and kind and the KV caches
                            #     one input per kind, all layers stacked (ORT's run costs ~0.6 us a bound
                            #     input: 848 LoRA inputs were ~0.5 ms of a ~4.6 ms decode step), and
                            #     logits_argmax (ops ABI 8))

# ---- artifact files
MANIFEST = "manifest.json"
MODEL = "model.onnx"
MODEL_DATA = "model.onnx.data"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION = "generation.json"
CONFIG = "config.json"      # the llama config (ModelConfig.to_dict)
QUALITY = "quality.json"    # measured quality of a quantized build against its fp32 reference

GRAPH_KINDS = ("engine", "portable")


@dataclass(frozen=True)
class ModelConfig:
    """The llama architecture: config.json and the manifest's "model", written by the pipeline, read by the runtime."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings; got {self.head_dim}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)

    def to_hf_config(self) -> dict:
        """config.json for transformers' LlamaForCausalLM (reference model, optimum export)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_ids[0],
            "torch_dtype": "float32",
        }



# ---- the portable graph (stock ONNX ops, plain KV cache; any ONNX Runtime client can run it)
# Same convention as optimum / onnxruntime-genai decoder exports:
#   input_ids       [batch, seq]              int64
#   attention_mask  [batch, past + seq]       int64  (1 = attend, 0 = padding)
#   position_ids    [batch, seq]              int64
#   past_key_values.{i}.key|value  [batch, kv_heads, past, head_dim]  float32
# ->
#   logits          [batch, seq, vocab]       float32
#   present.{i}.key|value          [batch, kv_heads, past + seq, head_dim]  float32
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"


def past_key(layer: int) -> str:
    return f"past_key_values.{layer}.key"


def past_value(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key(layer: int) -> str:
    return f"present.{layer}.key"


def present_value(layer: int) -> str:
    return f"present.{layer}.value"


# ---- the engine graph (ortllm ops: PagedAttention, QLinear, MultiLoRA; needs libortllm_ops.so)
# One flattened ragged batch per step: T tokens from S sequences.
#   input_ids       [T]                 int64
#   positions       [T]                 int32   position of each token in its sequence
#   cu_seqlens      [S + 1]             int32   token offsets of the sequences in the batch
#   context_lens    [S]                 int32   tokens already cached per sequence
#   block_tables    [S, max_blocks]     int32   KV block ids of each sequence
#   logits_indices  [R]                 int64   rows of the batch that get logits (never prefill rows): one
#                                               per sampling sequence, several for a row with drafts
#                                               (speculative decoding); the graph gathers any R rows
#   token_adapter   [T]                 int32   adapter slot of each token, -1 = base model
#   key_cache / value_cache     [layers, num_blocks, kv_heads, block_size, head_dim]  float32 | uint8
#                               (int4: [..., head_dim / 2], two codes a byte); every layer in one input
#                               (PagedAttention's layer attribute picks a node's slice)
#   key_scales / value_scales   [layers, num_blocks, kv_heads, block_size]  float16 (quantized caches only)
#   lora.{i}.{target}.a  [slots, in, r_max]   lora.{i}.{target}.b  [slots, r_max, out]   float16
#       (the slot stacks; adapter files stay float32, converted when written into a slot). Slot s of .a
#       holds a row-major [in, rank] matrix in its first in * rank elements (MultiLoRA packed_a = 1), so
#       a rank below r_max streams only its own bytes; .b uses its first rank rows.
#   QLinear projections (quantized artifacts) take int8 stacks instead (runtime/lora_stacks.py writes them), one
#   input per target and kind holding every layer (QLinear's lora_layer attribute picks a node's layer):
#   lora.{target}.a        [layers, slots, in, r_max]         int8, slot s: [in, rank] codes in k-quads
#   lora.{target}.a_scale  [layers, slots, ceil(in / 32), r_max]  float16, slot s: [ceil(in / 32), rank]
#   lora.{target}.b        [layers, slots, r_max, out]        int8, slot s: [rank, out] codes in rank quads
#   lora.{target}.b_scale  [layers, slots, out]               float16, per output column
#       (layouts: custom_ops/src/kernels/qlinear.h; r_max a multiple of 4). A build may have both forms (`--keep` holds
#       some projections back from QLinear); each layer's projection reads one of them.
#   lora.scale [slots] float32
#   lora.rank.{target} [slots] int32   the slot's adapter rank on that target, 0 where the adapter does not
#       adapt it: MultiLoRA then skips the slot there instead of streaming its zero stacks
# ->
#   logits          [R, vocab]          float32
#   logits_argmax   [R]                 int64   each logits row's first maximum (the LM head's op finds it on
#                                               the columns it just wrote: greedy rows need no pass over logits)
#   key_cache_out.{i} ...  one layer's [num_blocks, ...] per kind and layer: the runtime binds each to layer i's
#                          slice of the input's buffer, so the pool is written in place (PagedAttention copies
#                          only when given another buffer). Outputs stay per layer: bound outputs cost ORT's Run
#                          next to nothing, bound inputs ~0.6 us each (contract 7 history above)
ENGINE_INPUT_IDS = "input_ids"
POSITIONS = "positions"
CU_SEQLENS = "cu_seqlens"
CONTEXT_LENS = "context_lens"
BLOCK_TABLES = "block_tables"
LOGITS_INDICES = "logits_indices"
LOGITS_ARGMAX = "logits_argmax"
TOKEN_ADAPTER = "token_adapter"
ENGINE_INPUT_DTYPES = {ENGINE_INPUT_IDS: "int64", POSITIONS: "int32", CU_SEQLENS: "int32", CONTEXT_LENS: "int32",
                       BLOCK_TABLES: "int32", LOGITS_INDICES: "int64", TOKEN_ADAPTER: "int32"}   # the step inputs'
LORA_SCALE = "lora.scale"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OPS_DOMAIN = "ortllm"          # the custom ops' domain (libortllm_ops.so registers its ops there)

# ---- the KV cache dtypes: the one table (build option, op attribute, config name, storage)
#   --kv option | PagedAttention kv_dtype / CacheConfig.kv_dtype | pool element | bytes a code | fp16 scale a row
#   fp32        | float32                                        | float32      | 4            | no
#   int8        | int8                                           | uint8        | 1            | yes
#   fp8         | fp8_e4m3                                       | uint8        | 1            | yes
#   int4        | int4                                           | uint8        | 1/2 (packed) | yes
# (a row: one (token, kv head) of head_dim elements)
KV_DTYPES = {"fp32": "float32", "int8": "int8", "fp8": "fp8_e4m3", "int4": "int4"}   # build option -> dtype name
KV_STORAGE = {"fp32": "float32", "int8": "uint8", "fp8": "uint8", "int4": "uint8"}   # build option -> pool numpy dtype
KV_DTYPE_NAMES = tuple(KV_DTYPES.values())                             # what CacheConfig.kv_dtype accepts
KV_ALIASES = {"fp32": "float32", "fp8": "fp8_e4m3", "float8_e4m3": "fp8_e4m3"}   # other spellings accepted


def kv_row_elems(dtype_name: str, head_dim: int) -> int:
    """Elements of one cached (token, head) row in the pool, its last extent: head_dim, or head_dim / 2 for int4
    (two codes a byte)."""
    return head_dim // 2 if dtype_name == "int4" else head_dim


def kv_row_bytes(dtype_name: str, head_dim: int) -> int:
    """Bytes of one cached (token, head) row of a KV dtype name, its fp16 scale included for the quantized ones."""
    if dtype_name == "float32":
        return 4 * head_dim
    return kv_row_elems(dtype_name, head_dim) + 2


def cache_kinds(quantized: bool) -> tuple[str, ...]:
    """The kinds of KV cache an engine graph carries, in input order: key_cache and value_cache, then their fp16
    scales (key_scales, value_scales) for the quantized dtypes."""
    return ("key_cache", "value_cache") + (("key_scales", "value_scales") if quantized else ())


def cache_name(kind: str) -> str:
    """The input holding every layer's cache of a kind (key_cache, value_cache, key_scales, value_scales)."""
    return kind


def cache_out_name(kind: str, layer: int) -> str:
    """One layer's cache output of a kind: bound to that layer's slice of the input's buffer."""
    return f"{kind}_out.{layer}"


LORA_CHUNK = 32    # elements of `in` per float16 scale of an int8 lora .a stack (QLinear's kLoraChunk)


def lora_name(layer: int, target: str, which: str) -> str:
    """One layer's float16 stack of a MultiLoRA projection; which in a, b."""
    return f"lora.{layer}.{target}.{which}"


def lora_stack_name(target: str, which: str) -> str:
    """Every layer's int8 stack of QLinear projections, [layers, ...]; which in a, a_scale, b, b_scale."""
    return f"lora.{target}.{which}"


def lora_rank_name(target: str) -> str:
    return f"lora.rank.{target}"
