"""The contract between the build pipeline and the runtime: artifact files, graph I/O names and shapes.

Imported by the graph builder and the runtime alike (docs/architecture.md, The artifact contract). An artifact
whose manifest carries another FORMAT_VERSION or CONTRACT_VERSION is refused at load, by name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import ConfigError

FORMAT_VERSION = 1          # layout of the artifact directory and manifest.json
CONTRACT_VERSION = 13       # graph input/output names, shapes and semantics below (what each version changed:
                            # docs/notes/contract.md)

# ---- artifact files
MANIFEST = "manifest.json"
MODEL = "model.onnx"
MODEL_DATA = "model.onnx.data"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION = "generation.json"
CONFIG = "config.json"      # the llama config (ModelConfig.to_dict)
QUALITY = "quality.json"    # measured quality of a quantized build against its fp32 reference
MODELFILE = "modelfile.json"   # a model Ollama's create made (runtime/model_create.py): the defaults its requests
# get, {from, adapter, system, parameters, template, license}
SMOOTHING = "smoothing.safetensors"   # a SmoothQuant'ed build's rescales (pipeline/smooth.py), float32, per
# smoothed projection smoothing_name(i, target, "in") [in] and/or (..., "out") [out]: the graph's weight is
# diag(out) W diag(in) (W [out, in] the model's), its input x / in and so its output y * out; adapters are mapped
# onto that when loaded (runtime/smoothing.py)


def smoothing_name(layer: int, target: str, side: str) -> str:
    return f"layers.{layer}.{target}.{side}"


GRAPH_KINDS = ("engine", "portable")


LAYER_TYPES = ("full", "sliding")           # ModelConfig.layer_types: attention over every past key, or a window
ACTIVATIONS = ("silu", "gelu_tanh")         # ModelConfig.hidden_act: the MLP gate's activation (SwiGLU, GeGLU)
ROPE_SCALINGS = ("linear", "llama3", "factors", "yarn")   # ModelConfig.rope_scaling["type"]
CLAMPED_SWIGLU_ALPHA = 1.702                # gpt-oss's clamped SwiGLU (ModelConfig.swiglu_limit): its sigmoid slope
# ModelConfig.moe_router: the router's weights from its logits [T, E]: softmax over all E then the top k (then
# renormalised to sum 1 with norm_topk_prob), or the top k logits then a softmax over those k
MOE_ROUTERS = ("softmax_topk", "topk_softmax")
# transformers' fused projections (Phi-3) -> the projections an artifact serves, in the fused rows' order: the build
# splits the weights (pipeline/families.split_fused), the adapter import a LoRA on them (runtime/adapter_files.py)
FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def rope_half_rows(n_rows: int, n_heads: int) -> list[int]:
    """The row order that takes a q or k projection whose RoPE pairs are rows (2i, 2i+1) of each head (llama.cpp's
    GGUFs, Helium) to transformers' llama pairs (i, i + d/2): llama_rows = rows[order]."""
    d = n_rows // n_heads
    return [h * d + 2 * i + half for h in range(n_heads) for half in (0, 1) for i in range(d // 2)]


@dataclass(frozen=True)
class ModelConfig:
    """The architecture: config.json and the manifest's "model", written by the pipeline, read by the runtime.

    One description for every family (pipeline/families.py reads it from a GGUF's general.architecture or a
    config.json's model_type): each feature is a field whose default means llama, and the graph builders switch
    on the fields, never on `arch`. Norm weights are the multipliers themselves (Gemma's 1 + w is folded in).
    """
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int                           # independent of hidden_size / num_heads (Qwen3, Gemma 3)
    max_position_embeddings: int
    rope_theta: float = 10000.0             # RoPE base of the full-attention layers
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)
    arch: str = "llama"                     # the source's family (reports; builders never switch on it)
    attention_bias: bool = False            # q/k/v projections carry biases (Qwen2)
    qk_norm: bool = False                   # RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
    qk_norm_whole: bool = False             # qk_norm over the whole projection [n * D] at once (OLMoE), not per head
    post_norms: bool = False                # RMSNorm on the attention and MLP outputs before each residual add,
                                            # the MLP's input norm then named pre_feedforward_layernorm (Gemma)
    hidden_act: str = "silu"                # ACTIVATIONS: act(gate) * up
    embedding_scale: float = 1.0            # embeddings times it (Gemma: sqrt(hidden_size))
    attention_scale: float | None = None    # softmax scale; None: 1 / sqrt(head_dim) (Gemma: query_pre_attn_scalar)
    sliding_window: int | None = None       # keys a sliding layer's query sees, itself included (Mistral, Gemma 3)
    layer_types: tuple[str, ...] = ()       # LAYER_TYPES per layer; (): all "sliding" with a window, else "full"
    rope_local_theta: float | None = None   # RoPE base of sliding layers, unscaled (Gemma 3: 10k; 1M global);
                                            # None: the full layers' RoPE
    rope_scaling: dict | None = None        # the full layers' RoPE scaling: {"type": "linear", "factor"} |
                                            # {"type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
                                            #  "original_max_position_embeddings"} | {"type": "factors", "factors":
                                            #  [D / 2] dividing each frequency (a GGUF's rope_freqs)} |
                                            # {"type": "yarn", "factor", "beta_fast", "beta_slow",
                                            #  "original_max_position_embeddings", "truncate", "attention_factor"}
                                            # (gpt-oss; attention_factor multiplies cos and sin)
    final_logit_softcap: float | None = None   # logits = c * tanh(logits / c)
    residual_multiplier: float = 1.0        # each block's output times it before the residual add (Granite)
    logits_scaling: float = 1.0             # logits divided by it, before any softcap (Granite)
    qk_rows_interleaved: bool = False       # the source model's q/k rows pair (2i, 2i+1) for RoPE (Helium): the build
                                            # stores them in llama's order (rope_half_rows), and adding an adapter
                                            # reorders its q/k lora_B rows (and DoRA magnitudes) the same way
    # Mixture of experts (num_experts 0: every MLP dense). A sparse layer's MLP: router logits h @ mlp.gate^T [T, E]
    # -> the top num_experts_per_tok experts' weights (moe_router) -> sum of weight * expert SwiGLU FFN of width
    # moe_intermediate_size (mlp.experts.{e}.gate_proj / up_proj / down_proj). LoRA stays on the attention.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_router: str = "softmax_topk"        # MOE_ROUTERS
    norm_topk_prob: bool = False            # softmax_topk: the k weights renormalised to sum 1 (Qwen3-MoE, Mixtral)
    dense_layers: tuple[int, ...] = ()      # with experts: the layers keeping the dense MLP (intermediate_size)
    # gpt-oss: biases on o_proj (self_attn.o_proj.bias), on the router (mlp.gate.bias) and the experts
    # (mlp.experts.{e}.gate_proj / up_proj / down_proj.bias); one learned logit per query head in each softmax's
    # denominator (self_attn.sinks [num_heads]); the experts' clamped SwiGLU: g = min(gate, limit),
    # u = clamp(up, -limit, limit), (u + 1) * g * sigmoid(CLAMPED_SWIGLU_ALPHA * g) (swiglu_limit None: SiLU(gate) * up)
    o_proj_bias: bool = False
    moe_bias: bool = False
    attention_sinks: bool = False
    swiglu_limit: float | None = None
    shared_expert_intermediate_size: int = 0    # a sparse layer's shared expert: a SwiGLU FFN of this width on every
                                            # token, added to the routed experts' sum (mlp.shared_expert.{gate,up,
                                            # down}_proj; Qwen2-MoE, Granite-MoE-shared); 0: none
    shared_expert_gate: bool = False        # the shared expert's output times sigmoid(h @ mlp.shared_expert_gate^T),
                                            # a [1, H] weight (Qwen2-MoE)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings; got {self.head_dim}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act must be one of {', '.join(ACTIVATIONS)}; got {self.hidden_act!r}")
        types = tuple(self.layer_types) or (("sliding" if self.sliding_window else "full"),) * self.num_layers
        object.__setattr__(self, "layer_types", types)
        if len(types) != self.num_layers or set(types) - set(LAYER_TYPES):
            raise ConfigError(f"layer_types must give one of {', '.join(LAYER_TYPES)} for each of the "
                              f"{self.num_layers} layers; got {list(types)}")
        if "sliding" in types and not (self.sliding_window and self.sliding_window > 0):
            raise ConfigError(f"sliding layers need sliding_window > 0; got {self.sliding_window}")
        kind = (self.rope_scaling or {}).get("type")
        if self.rope_scaling is not None and kind not in ROPE_SCALINGS:
            raise ConfigError(f"rope_scaling type must be one of {', '.join(ROPE_SCALINGS)}; got {kind!r}")
        if self.final_logit_softcap is not None and self.final_logit_softcap <= 0:
            raise ConfigError(f"final_logit_softcap must be > 0 (or absent); got {self.final_logit_softcap}")
        object.__setattr__(self, "dense_layers", tuple(int(i) for i in self.dense_layers))
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts or self.moe_intermediate_size <= 0:
                raise ConfigError(f"an MoE model needs 1 <= num_experts_per_tok <= num_experts and "
                                  f"moe_intermediate_size > 0; got {self.num_experts_per_tok} of {self.num_experts}, "
                                  f"{self.moe_intermediate_size}")
            if self.moe_router not in MOE_ROUTERS:
                raise ConfigError(f"moe_router must be one of {', '.join(MOE_ROUTERS)}; got {self.moe_router!r}")
            if self.hidden_act != "silu":
                raise ConfigError("MoE experts are SwiGLU FFNs (hidden_act silu)")
            if self.swiglu_limit is not None and not self.swiglu_limit > 0:
                raise ConfigError(f"swiglu_limit must be > 0 (or absent); got {self.swiglu_limit}")
            if set(self.dense_layers) - set(range(self.num_layers)):
                raise ConfigError(f"dense_layers must be layers in [0, {self.num_layers}); got {self.dense_layers}")
        if self.shared_expert_intermediate_size and not self.num_experts:
            raise ConfigError("shared_expert_intermediate_size is a mixture-of-experts field; set num_experts too")
        if self.shared_expert_gate and not self.shared_expert_intermediate_size:
            raise ConfigError("shared_expert_gate needs a shared expert (shared_expert_intermediate_size > 0)")
        if self.qk_norm_whole and not self.qk_norm:
            raise ConfigError("qk_norm_whole says how qk_norm norms q and k; set qk_norm too")
        for name in ("residual_multiplier", "logits_scaling"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 (1: none); got {getattr(self, name)}")

    def sparse_layer(self, i: int) -> bool:
        """Whether layer i's MLP is the mixture of experts (else the dense MLP)."""
        return self.num_experts > 0 and i not in self.dense_layers

    @property
    def softmax_scale(self) -> float:
        return self.attention_scale if self.attention_scale is not None else self.head_dim ** -0.5

    @property
    def llama_features(self) -> bool:
        """Whether every family feature is llama's (transformers' LlamaForCausalLM runs these weights)."""
        d = {f.name: f.default for f in dataclasses.fields(self) if f.name in _FEATURES}
        return all(getattr(self, k) == v for k, v in d.items()) and set(self.layer_types) == {"full"} and \
            (self.rope_scaling or {}).get("type") in (None, "linear", "llama3")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["layer_types"] = list(self.layer_types)
        d["dense_layers"] = list(self.dense_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        d["layer_types"] = tuple(d.get("layer_types", ()))
        d["dense_layers"] = tuple(d.get("dense_layers", ()))
        return cls(**d)

    def to_hf_config(self) -> dict:
        """config.json for transformers' LlamaForCausalLM (reference model, optimum export)."""
        if not self.llama_features:
            raise ConfigError(f"this {self.arch} model has features LlamaForCausalLM lacks; only llama-featured "
                              "models convert to a llama config")
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
            **({"rope_scaling": _hf_rope_scaling(self.rope_scaling)} if self.rope_scaling else {}),
        }


_FEATURES = ("attention_bias", "qk_norm", "post_norms", "hidden_act", "embedding_scale", "attention_scale",
             "sliding_window", "rope_local_theta", "final_logit_softcap", "num_experts", "o_proj_bias",
             "attention_sinks", "residual_multiplier", "logits_scaling")


def _hf_rope_scaling(r: dict) -> dict:
    out = {k: v for k, v in r.items() if k != "type"}
    return {"rope_type": r["type"], **out}



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
#   token_adapter   [T, M]              int32   each token's adapter mix: up to M <= 4 slots (MAX_ADAPTER_TERMS),
#                                               -1 after them (all -1: the base model), in the request's order
#                                               (fixed per request: the order its terms are added in)
#   token_adapter_weight [T, M]         float32 their weights (1 for a one-adapter request; padding's are unread)
#   hidden_indices  [E]                 int64   rows of the batch whose final hidden state is returned
#                                               (embedding requests' rows; E = 0 in generation steps: the Gather
#                                               and the norm after the last layer then run on no rows)
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
#   lora.dora [slots] int32            1 where the slot holds a DoRA adapter, else 0
#   lora.{target}.dora_scale  [layers, slots, out]  float32  a DoRA slot's per-output scale g = m / ||W + s B A||
#       (both QLinear and MultiLoRA projections read it, at their layer; rows of other slots never do)
# ->
#   logits          [R, vocab]          float32
#   logits_argmax   [R]                 int64   each logits row's first maximum (the LM head's op finds it on
#                                               the columns it just wrote: greedy rows need no pass over logits)
#   hidden_states   [E, hidden]         float32 the final RMSNorm's output on the hidden_indices rows (what
#                                               transformers calls the last hidden state), before any pooling
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
TOKEN_ADAPTER_WEIGHT = "token_adapter_weight"
MAX_ADAPTER_TERMS = 4       # adapters one request may mix (the ops' kQLinearMaxTerms)
HIDDEN_INDICES = "hidden_indices"
HIDDEN_STATES = "hidden_states"
ENGINE_INPUT_DTYPES = {ENGINE_INPUT_IDS: "int64", POSITIONS: "int32", CU_SEQLENS: "int32", CONTEXT_LENS: "int32",
                       BLOCK_TABLES: "int32", LOGITS_INDICES: "int64", TOKEN_ADAPTER: "int32",
                       TOKEN_ADAPTER_WEIGHT: "float32", HIDDEN_INDICES: "int64"}   # the step inputs'
LORA_SCALE = "lora.scale"
LORA_DORA = "lora.dora"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OPS_DOMAIN = "ortllm"          # the custom ops' domain (libortllm_ops.so registers its ops there)

# ---- the KV cache dtypes: the one table (build option, op attribute, config name, storage)
#   --kv option | PagedAttention kv_dtype / CacheConfig.kv_dtype | pool element | bytes a code | fp16 scale a row
#   fp32        | float32                                        | float32      | 4            | no
#   fp16        | float16                                        | float16      | 2            | no
#   int8        | int8                                           | uint8        | 1            | yes
#   fp8         | fp8_e4m3                                       | uint8        | 1            | yes
#   int4        | int4                                           | uint8        | 1/2 (packed) | yes
# (a row: one (token, kv head) of head_dim elements)
KV_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8", "fp8": "fp8_e4m3",
             "int4": "int4"}                                           # build option -> dtype name
KV_STORAGE = {"fp32": "float32", "fp16": "float16", "int8": "uint8", "fp8": "uint8",
              "int4": "uint8"}                                         # build option -> pool numpy dtype
KV_DTYPE_NAMES = tuple(KV_DTYPES.values())                             # what CacheConfig.kv_dtype accepts
KV_ALIASES = {"fp32": "float32", "fp16": "float16", "fp8": "fp8_e4m3",
              "float8_e4m3": "fp8_e4m3"}                               # other spellings accepted
UNSCALED_KV = ("float32", "float16")   # dtype names of the caches that hold values, not codes with fp16 scales


def kv_scaled(dtype_name: str) -> bool:
    """Whether a KV dtype name's cache holds codes with an fp16 scale a row (key_scales / value_scales inputs): int8,
    fp8, int4; the float caches (float32, float16) hold the values themselves and are never rotated."""
    return dtype_name not in UNSCALED_KV


def kv_row_elems(dtype_name: str, head_dim: int) -> int:
    """Elements of one cached (token, head) row in the pool, its last extent: head_dim, or head_dim / 2 for int4
    (two codes a byte)."""
    return head_dim // 2 if dtype_name == "int4" else head_dim


def kv_row_bytes(dtype_name: str, head_dim: int) -> int:
    """Bytes of one cached (token, head) row of a KV dtype name, its fp16 scale included for the quantized ones."""
    if dtype_name == "float32":
        return 4 * head_dim
    if dtype_name == "float16":
        return 2 * head_dim
    return kv_row_elems(dtype_name, head_dim) + 2


def cache_kinds(scaled: bool) -> tuple[str, ...]:
    """The kinds of KV cache an engine graph carries, in input order: key_cache and value_cache, then their fp16
    scales (key_scales, value_scales) for the scaled dtypes (kv_scaled)."""
    return ("key_cache", "value_cache") + (("key_scales", "value_scales") if scaled else ())


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
    """Every layer's stack of one target, [layers, ...]: which in a, a_scale, b, b_scale (QLinear's int8 stacks) or
    dora_scale (both projection forms)."""
    return f"lora.{target}.{which}"


def lora_rank_name(target: str) -> str:
    return f"lora.rank.{target}"
