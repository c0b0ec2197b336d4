"""The model families: a config.json's `model_type` or a GGUF's `general.architecture` -> one ModelConfig, and each
family's tensors brought into the layout the graph builders read (transformers' names, pipeline/weights.py).

The only module that knows family names (the builders switch on ModelConfig's fields). A family is a row of
FAMILIES: its features from config.json, its features from the GGUF's `<arch>.*` keys, and its tensor fix-ups.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ortllm.runtime.contract import FUSED_PROJECTIONS, rope_half_rows

from .errors import BuildError
from .weights import LazyTensors, ModelConfig, expected_shapes, tensor_shape


@dataclass(frozen=True)
class Family:
    hf: Callable[[dict], dict]                        # config.json -> ModelConfig feature fields
    gguf: Callable[[object, str], dict] | None        # (GGUF reader, "<arch>.") -> feature fields (None: no GGUF arch)
    fix_hf: tuple[Callable[[ModelConfig, dict], None], ...] = ()     # tensor fix-ups of a HF directory, in place
    fix_gguf: tuple[Callable[[ModelConfig, dict], None], ...] = ()   # ... of a GGUF
    gguf_names: dict = field(default_factory=dict)    # llama.cpp layer tensor -> HF suffix, over GGUF_LAYER_NAMES
                                                      # (None: the family's GGUFs have no such tensor)
    act16: tuple[str, ...] = ()                       # int8 builds: the projection groups on int16 activation codes
                                                      # (quantize.ACT16_GROUPS; the default of --act16)
    int4_smooth: float = 0.0                          # int4 builds: the SmoothQuant alpha when --smooth is not given
                                                      # (pipeline/smooth.py; 0: none, the int4 rule of BuildOptions)


# ---------------------------------------------------------------- config.json

def _hf_rope_scaling(cfg: dict) -> dict | None:
    r = cfg.get("rope_scaling")
    kind = (r or {}).get("rope_type", (r or {}).get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(r["factor"])}
    if kind == "llama3":
        return {"type": "llama3", "factor": float(r["factor"]), "low_freq_factor": float(r["low_freq_factor"]),
                "high_freq_factor": float(r["high_freq_factor"]),
                "original_max_position_embeddings": int(r["original_max_position_embeddings"])}
    if kind == "yarn":
        return _hf_yarn(cfg, r)
    raise BuildError(f"rope_scaling type '{kind}' is not supported; supported: default, linear, llama3, yarn")


def _hf_yarn(cfg: dict, r: dict) -> dict:
    """YaRN's fields with transformers' defaults resolved (_compute_yarn_parameters): beta_fast 32, beta_slow 1,
    original_max_position_embeddings the model's, truncate true, and the attention factor cos and sin carry
    (0.1 ln(factor) + 1, or the mscale / mscale_all_dim ratio)."""
    factor = float(r["factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    att = r.get("attention_factor")
    if att is None:
        m, m_all = r.get("mscale"), r.get("mscale_all_dim")
        att = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return {"type": "yarn", "factor": factor, "beta_fast": float(r.get("beta_fast") or 32),
            "beta_slow": float(r.get("beta_slow") or 1),
            "original_max_position_embeddings": int(r.get("original_max_position_embeddings")
                                                    or cfg.get("max_position_embeddings", 2048)),
            "truncate": bool(r.get("truncate", True)), "attention_factor": float(att)}


def _hf_layers(cfg: dict, all_sliding: bool = False) -> dict:
    """layer_types (transformers' "sliding_attention" / "full_attention") and the window; all_sliding: a family
    whose sliding_window, when set, applies to every layer (Mistral, Phi-3)."""
    window = cfg.get("sliding_window")
    if cfg.get("layer_types"):
        types = tuple("sliding" if t == "sliding_attention" else "full" for t in cfg["layer_types"])
    else:
        types = (("sliding" if all_sliding and window else "full"),) * cfg["num_hidden_layers"]
    return {"layer_types": types, "sliding_window": int(window) if "sliding" in types else None}


def _no_o_bias(cfg: dict) -> None:
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise BuildError("attention_bias / mlp_bias on o_proj or the MLP are not supported (only q/k/v biases, as "
                         "Qwen2 has them)")


def _hf_llama(cfg: dict) -> dict:
    _no_o_bias(cfg)
    return {"rope_scaling": _hf_rope_scaling(cfg)}


def _hf_helium(cfg: dict) -> dict:
    return {**_hf_llama(cfg), "qk_rows_interleaved": True}


def _hf_mistral(cfg: dict) -> dict:
    return {**_hf_layers(cfg, all_sliding=True), "rope_scaling": _hf_rope_scaling(cfg)}


def _hf_qwen2(cfg: dict) -> dict:
    if not cfg.get("use_sliding_window"):
        cfg = {**cfg, "sliding_window": None, "layer_types": None}
    return {"attention_bias": True, **_hf_layers(cfg), "rope_scaling": _hf_rope_scaling(cfg)}


def _hf_qwen3(cfg: dict) -> dict:
    _no_o_bias(cfg)
    return {**_hf_qwen2({**cfg}), "attention_bias": False, "qk_norm": True}


def _hf_moe(cfg: dict) -> dict:
    """The mixture-of-experts fields (Qwen3-MoE's and Qwen2-MoE's names): the router softmax over all experts then
    top-k (renormalised with norm_topk_prob), the dense layers mlp_only_layers and those off decoder_sparse_step, and
    Qwen2-MoE's shared expert of width shared_expert_intermediate_size with its sigmoid gate."""
    n, step = cfg["num_hidden_layers"], int(cfg.get("decoder_sparse_step", 1) or 1)
    only = set(cfg.get("mlp_only_layers") or ())
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    return {"num_experts": int(cfg["num_experts"]), "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["moe_intermediate_size"]), "moe_router": "softmax_topk",
            "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
            "dense_layers": tuple(i for i in range(n) if i in only or (i + 1) % step),
            "shared_expert_intermediate_size": shared, "shared_expert_gate": shared > 0}


def _hf_mixtral(cfg: dict) -> dict:
    """Mistral's blocks, every MLP a mixture of num_local_experts of width intermediate_size, the top k
    renormalised."""
    return {**_hf_mistral(cfg), "num_experts": int(cfg["num_local_experts"]),
            "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["intermediate_size"]), "moe_router": "softmax_topk",
            "norm_topk_prob": True}


def _hf_qwen3_moe(cfg: dict) -> dict:
    return {**_hf_qwen3(cfg), **_hf_moe(cfg)}


def _hf_qwen2_moe(cfg: dict) -> dict:
    """Qwen2's blocks (q/k/v biases unless qkv_bias is false) with the mixture of _hf_moe: Qwen1.5-MoE's softmax then
    top-k not renormalised, and its shared expert."""
    if cfg.get("use_sliding_window"):
        raise BuildError("Qwen2-MoE with use_sliding_window (a window from max_window_layers on) is not supported; "
                         "set use_sliding_window false in config.json if the model was trained without it")
    return {**_hf_qwen2(cfg), "attention_bias": bool(cfg.get("qkv_bias", True)), **_hf_moe(cfg)}


def _hf_olmoe(cfg: dict) -> dict:
    """OLMoE: llama's blocks with q/k RMSNorms over the whole projection (q_norm [Hq * D], k_norm [Hkv * D]) and every
    MLP a mixture of num_experts of width intermediate_size, softmax then top-k (renormalised with norm_topk_prob)."""
    _no_o_bias(cfg)
    if cfg.get("clip_qkv") is not None:
        raise BuildError("OLMoE with clip_qkv (q/k/v clamped) is not supported; the released OLMoE models have none")
    return {"qk_norm": True, "qk_norm_whole": True, "rope_scaling": _hf_rope_scaling(cfg),
            **_hf_moe({**cfg, "moe_intermediate_size": cfg["intermediate_size"], "mlp_only_layers": None,
                       "decoder_sparse_step": 1, "shared_expert_intermediate_size": 0})}


def _hf_granite(cfg: dict) -> dict:
    """Granite: llama's blocks with Granite's multipliers: embedding_multiplier on the embeddings,
    attention_multiplier the softmax scale, residual_multiplier on each block's output, logits / logits_scaling."""
    _no_o_bias(cfg)
    return {"rope_scaling": _hf_rope_scaling(cfg), "embedding_scale": float(cfg.get("embedding_multiplier", 1.0)),
            "attention_scale": float(cfg.get("attention_multiplier", 1.0)),
            "residual_multiplier": float(cfg.get("residual_multiplier", 1.0)),
            "logits_scaling": float(cfg.get("logits_scaling", 1.0))}


def _hf_granitemoe(cfg: dict) -> dict:
    """Granite-MoE: Granite's blocks with every MLP a mixture of num_local_experts of width intermediate_size, the
    top k logits then a softmax over them; granitemoeshared adds a shared expert of width shared_intermediate_size
    (no gate)."""
    return {**_hf_granite(cfg), "num_experts": int(cfg["num_local_experts"]),
            "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["intermediate_size"]), "moe_router": "topk_softmax",
            "shared_expert_intermediate_size": int(cfg.get("shared_intermediate_size") or 0)}


def _hf_gpt_oss(cfg: dict) -> dict:
    """gpt-oss: q/k/v/o biases, attention sinks, sliding layers alternating with full ones (layer_types), YaRN,
    every MLP a mixture of num_local_experts (width intermediate_size) routed top-k then softmax over the k, with
    router and expert biases and the clamped SwiGLU. Its hub checkpoints keep the experts in MXFP4
    (mxfp4_experts dequantizes them exactly)."""
    q = cfg.get("quantization_config") or {}
    if q.get("quant_method") not in (None, "mxfp4"):
        raise BuildError(f"gpt-oss quantization_config.quant_method '{q['quant_method']}' is not read; supported: "
                         "none (bf16 / fp32 weights) and mxfp4 (the experts dequantized exactly)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise BuildError(f"gpt-oss hidden_act '{cfg['hidden_act']}' is not supported; supported: silu")
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    return {**_hf_layers({**cfg, "layer_types": types}), "rope_scaling": _hf_rope_scaling(cfg),
            "attention_bias": True, "o_proj_bias": True, "attention_sinks": True,
            "num_experts": int(cfg["num_local_experts"]), "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["intermediate_size"]), "moe_router": "topk_softmax",
            "moe_bias": True, "swiglu_limit": float(cfg.get("swiglu_limit", 7.0))}


def _hf_phi3(cfg: dict) -> dict:
    if float(cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise BuildError("Phi-3 with partial_rotary_factor != 1 (Phi-4-mini) is not supported yet")
    return {**_hf_layers(cfg, all_sliding=True), "rope_scaling": _hf_rope_scaling(cfg)}


def _hf_gemma3(cfg: dict) -> dict:
    if cfg.get("attn_logit_softcapping") is not None:
        raise BuildError("Gemma attention logit softcapping (Gemma 2) is not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise BuildError(f"Gemma 3 activation '{act}' is not supported; supported: gelu_pytorch_tanh")
    return {"post_norms": True, "qk_norm": True, "hidden_act": "gelu_tanh",
            "embedding_scale": math.sqrt(cfg["hidden_size"]),
            "attention_scale": float(cfg.get("query_pre_attn_scalar", cfg.get("head_dim", 256))) ** -0.5,
            **_hf_layers(cfg), "rope_local_theta": float(cfg.get("rope_local_base_freq", 10000.0)),
            "rope_scaling": _hf_rope_scaling(cfg), "final_logit_softcap": cfg.get("final_logit_softcapping"),
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True))}


def hf_config(cfg: dict) -> ModelConfig:
    """config.json (transformers) -> ModelConfig; an unknown model_type names the supported ones."""
    mt = cfg.get("model_type") or ("llama" if "LlamaForCausalLM" in cfg.get("architectures", []) else None)
    name = HF_MODEL_TYPES.get(mt)
    if name is None:
        raise BuildError(f"model_type '{mt}' is not supported; supported: {', '.join(sorted(HF_MODEL_TYPES))}")
    heads = cfg["num_attention_heads"]
    eos = cfg.get("eos_token_id", 2)
    base = dict(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        rope_theta=float(cfg.get("rope_theta", 10000.0)), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
    )
    return ModelConfig(**(base | FAMILIES[name].hf(cfg)), arch=name)


# ---------------------------------------------------------------- GGUF

def _key(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _gguf_common(reader, p: str) -> dict:
    """ModelConfig's base fields from `<arch>.*` keys."""
    hidden = int(_key(reader, p + "embedding_length"))
    heads = int(_key(reader, p + "attention.head_count"))
    eos = _key(reader, "tokenizer.ggml.eos_token_id")
    vocab = _key(reader, p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return dict(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(_key(reader, p + "feed_forward_length")),
        num_layers=int(_key(reader, p + "block_count")), num_heads=heads,
        num_kv_heads=int(_key(reader, p + "attention.head_count_kv", heads)),
        head_dim=int(_key(reader, p + "attention.key_length", hidden // heads)),
        max_position_embeddings=int(_key(reader, p + "context_length", 2048)),
        rope_theta=float(_key(reader, p + "rope.freq_base", 10000.0)),
        rms_norm_eps=float(_key(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=_key(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
    )


def _gguf_rope(reader, p: str) -> dict:
    """RoPE scaling: `<arch>.rope.scaling.type` linear, or llama.cpp's rope_freqs tensor (Llama 3's scaling, as
    the converter precomputed it: a divisor per frequency)."""
    freqs = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    if freqs:
        return {"rope_scaling": {"type": "factors", "factors": [float(v) for v in np.asarray(freqs[0].data).ravel()]}}
    kind = _key(reader, p + "rope.scaling.type")
    if kind in (None, "none"):
        return {}
    if kind == "linear":
        return {"rope_scaling": {"type": "linear", "factor": float(_key(reader, p + "rope.scaling.factor"))}}
    raise BuildError(f"GGUF rope scaling '{kind}' is not supported; supported: linear, llama3 (rope_freqs)")


def _gguf_window(reader, p: str, n_layers: int) -> dict:
    window = _key(reader, p + "attention.sliding_window")
    return {"sliding_window": int(window), "layer_types": ("sliding",) * n_layers} if window else {}


def _gguf_llama(reader, p: str) -> dict:
    """llama, and Mixtral's GGUFs (arch llama with <arch>.expert_count: the top k renormalised, as llama.cpp does)."""
    if _key(reader, p + "expert_count"):
        return {**_gguf_rope(reader, p), **_gguf_moe(reader, p, norm_topk_prob=True)}
    return _gguf_rope(reader, p)


def _gguf_qwen2(reader, p: str) -> dict:
    return {"attention_bias": True, **_gguf_rope(reader, p)}


def _gguf_qwen3(reader, p: str) -> dict:
    return {"qk_norm": True, **_gguf_rope(reader, p)}


def _gguf_phi3(reader, p: str) -> dict:
    if any(t.name.startswith("rope_factors_") for t in reader.tensors):
        raise BuildError("Phi-3 long-context RoPE (rope_factors_long/short, 128k models) is not supported yet")
    d = int(_key(reader, p + "rope.dimension_count", 0) or 0)
    if d and d != int(_key(reader, p + "attention.key_length", 0) or d):
        raise BuildError("Phi-3 with partial rotary embeddings (Phi-4-mini) is not supported yet")
    return {**_gguf_window(reader, p, int(_key(reader, p + "block_count"))), **_gguf_rope(reader, p)}


def _gguf_gemma3(reader, p: str) -> dict:
    """llama.cpp's Gemma 3 constants (llama-model.cpp): every 6th layer global, local RoPE base 10k, the
    attention scale 1/sqrt(head_dim) (1/sqrt(hidden / heads) on the 62-layer 27B)."""
    hidden, heads = int(_key(reader, p + "embedding_length")), int(_key(reader, p + "attention.head_count"))
    n, d = int(_key(reader, p + "block_count")), int(_key(reader, p + "attention.key_length", 256))
    window = _key(reader, p + "attention.sliding_window")
    softcap = _key(reader, p + "final_logit_softcapping")
    return {"post_norms": True, "qk_norm": True, "hidden_act": "gelu_tanh", "embedding_scale": math.sqrt(hidden),
            "attention_scale": (hidden / heads if n == 62 else d) ** -0.5,
            "sliding_window": int(window) if window else None,
            "layer_types": tuple("sliding" if window and (i + 1) % 6 else "full" for i in range(n)),
            "rope_local_theta": 10000.0, "final_logit_softcap": float(softcap) if softcap else None,
            **_gguf_rope(reader, p)}


def _gguf_moe(reader, p: str, norm_topk_prob: bool) -> dict:
    """The mixture-of-experts fields from `<arch>.expert_*` keys (llama.cpp's): expert_count, expert_used_count,
    expert_feed_forward_length, a shared expert's expert_shared_feed_forward_length (its sigmoid gate: the
    ffn_gate_inp_shexp tensor), expert_weights_norm where the GGUF says it (else the family's `norm_topk_prob`); the
    dense layers are the blocks without a router (ffn_gate_inp)."""
    n = int(_key(reader, p + "block_count"))
    names = {t.name for t in reader.tensors}
    shared = int(_key(reader, p + "expert_shared_feed_forward_length", 0) or 0)
    if shared and int(_key(reader, p + "expert_shared_count", 1) or 1) != 1:
        raise BuildError(f"GGUF {p}expert_shared_count {_key(reader, p + 'expert_shared_count')}: one shared expert "
                         "a layer is supported")
    norm = _key(reader, p + "expert_weights_norm")
    return {"num_experts": int(_key(reader, p + "expert_count")),
            "num_experts_per_tok": int(_key(reader, p + "expert_used_count")),
            "moe_intermediate_size": int(_key(reader, p + "expert_feed_forward_length")),
            "moe_router": "softmax_topk", "norm_topk_prob": bool(norm_topk_prob if norm is None else norm),
            "dense_layers": tuple(i for i in range(n) if f"blk.{i}.ffn_gate_inp.weight" not in names),
            "shared_expert_intermediate_size": shared,
            "shared_expert_gate": any(name.endswith(".ffn_gate_inp_shexp.weight") for name in names)}


def _gguf_qwen3_moe(reader, p: str) -> dict:
    """llama.cpp's qwen3moe: Qwen3's blocks, the top k renormalised (Qwen3-MoE's norm_topk_prob)."""
    return {**_gguf_qwen3(reader, p), **_gguf_moe(reader, p, norm_topk_prob=True)}


def _gguf_qwen2_moe(reader, p: str) -> dict:
    """llama.cpp's qwen2moe: Qwen2's blocks, the top k as the softmax gave them, a gated shared expert."""
    return {**_gguf_qwen2(reader, p), **_gguf_moe(reader, p, norm_topk_prob=False)}


def _gguf_olmoe(reader, p: str) -> dict:
    """llama.cpp's olmoe: q/k norms over the whole projection, softmax then top-k not renormalised (OLMoE's)."""
    return {"qk_norm": True, "qk_norm_whole": True, **_gguf_rope(reader, p),
            **_gguf_moe(reader, p, norm_topk_prob=False)}


def _gguf_granite(reader, p: str) -> dict:
    """llama.cpp's granite: Granite's multipliers as embedding_scale, attention.scale, residual_scale and
    logit_scale."""
    scale = _key(reader, p + "attention.scale")
    return {**_gguf_rope(reader, p), "embedding_scale": float(_key(reader, p + "embedding_scale", 1.0)),
            "attention_scale": float(scale) if scale else None,
            "residual_multiplier": float(_key(reader, p + "residual_scale", 1.0)),
            "logits_scaling": float(_key(reader, p + "logit_scale", 1.0))}


def _gguf_granitemoe(reader, p: str) -> dict:
    """llama.cpp's granitemoe: granite's multipliers; the top k logits then a softmax (llama.cpp's softmax then
    renormalised top k: the same weights); a shared expert without a gate."""
    return {**_gguf_granite(reader, p), **_gguf_moe(reader, p, norm_topk_prob=False), "moe_router": "topk_softmax"}


# llama.cpp's gpt-oss constants (src/models/openai-moe.cpp, llama-graph.cpp, ggml's rope): the clamped SwiGLU's
# limit (1.702 its alpha, as ours); YaRN's beta_fast / beta_slow (hparams' defaults: the arch reads no key for them)
# and its correction range floored / ceiled (ggml_rope_yarn_corr_dims: transformers' truncate true, whatever the
# source's config said); the layers sliding where i % 2 == 0 unless attention.sliding_window_pattern says otherwise
GPT_OSS_SWIGLU_LIMIT = 7.0
LLAMA_CPP_YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
GPT_OSS_SWA_PERIOD = 2


def yarn_mscale(factor: float) -> float:
    """YaRN's default attention factor, 0.1 ln(factor) + 1 (1 for factor <= 1): transformers' get_mscale and
    llama.cpp's, which multiplies cos and sin by it times `<arch>.rope.scaling.attn_factor`."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def gguf_swa_layers(n: int, pattern) -> list[bool]:
    """Each layer sliding or not as llama.cpp's load_swa_pattern reads `<arch>.attention.sliding_window_pattern`: a
    bool a layer, or a period P (layer i sliding where i % P < P - 1; gpt-oss's default P is 2)."""
    if isinstance(pattern, (list, tuple)):
        return [bool(x) for x in pattern]
    period = int(pattern if pattern is not None else GPT_OSS_SWA_PERIOD)
    return [period == 0 or i % period < period - 1 for i in range(n)]


def _gguf_gpt_oss(reader, p: str) -> dict:
    """llama.cpp's gpt-oss: q/k/v/o biases, attention sinks (attn_sinks), sliding layers (the window; which layers:
    gguf_swa_layers), YaRN as llama.cpp computes it (LLAMA_CPP_YARN; the attention factor yarn_mscale times
    rope.scaling.attn_factor), every MLP a mixture of experts routed top-k then a softmax over the k, router and
    expert biases, the SwiGLU clamped at GPT_OSS_SWIGLU_LIMIT."""
    n = int(_key(reader, p + "block_count"))
    window = _key(reader, p + "attention.sliding_window")
    sliding = gguf_swa_layers(n, _key(reader, p + "attention.sliding_window_pattern")) if window else [False] * n
    kind = _key(reader, p + "rope.scaling.type")
    rope = None
    if kind == "yarn":
        factor = float(_key(reader, p + "rope.scaling.factor"))
        rope = {"type": "yarn", "factor": factor, "beta_fast": LLAMA_CPP_YARN["beta_fast"],
                "beta_slow": LLAMA_CPP_YARN["beta_slow"],
                "original_max_position_embeddings": int(_key(reader, p + "rope.scaling.original_context_length",
                                                             _key(reader, p + "context_length", 2048))),
                "truncate": LLAMA_CPP_YARN["truncate"],
                "attention_factor": yarn_mscale(factor) * float(_key(reader, p + "rope.scaling.attn_factor", 1.0))}
    elif kind not in (None, "none"):
        raise BuildError(f"GGUF gpt-oss rope scaling '{kind}' is not supported; supported: none, yarn")
    types = tuple("sliding" if s else "full" for s in sliding)
    return {"attention_bias": True, "o_proj_bias": True, "attention_sinks": True, "layer_types": types,
            "sliding_window": int(window) if "sliding" in types else None, "rope_scaling": rope,
            **_gguf_moe(reader, p, norm_topk_prob=False), "moe_router": "topk_softmax", "norm_topk_prob": False,
            "moe_bias": True, "swiglu_limit": GPT_OSS_SWIGLU_LIMIT}


def gguf_config(reader) -> ModelConfig:
    arch = _key(reader, "general.architecture")
    if arch not in GGUF_ARCHS:
        raise BuildError(f"GGUF architecture '{arch}' is not supported; supported: {', '.join(sorted(GGUF_ARCHS))}")
    p = f"{arch}."
    return ModelConfig(**(_gguf_common(reader, p) | FAMILIES[GGUF_ARCHS[arch]].gguf(reader, p)), arch=arch)


# llama.cpp's tensor names -> transformers'; norms by role (weights.norm_names), the rest per layer suffix
GGUF_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                     "output.weight": "lm_head.weight"}
GGUF_NORM_ROLES = {"attn_norm.weight": "attn_in", "post_attention_norm.weight": "attn_out",
                   "ffn_norm.weight": "mlp_in", "post_ffw_norm.weight": "mlp_out"}
GGUF_LAYER_NAMES = {
    **{f"attn_{x}.{kind}": f"self_attn.{x}_proj.{kind}" for x in "qkv" for kind in ("weight", "bias")},
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


# gpt-oss's GGUF names (llama.cpp's converter, gguf-py's MODEL_ARCH.GPT_OSS): the MLP's input norm is
# post_attention_norm (ATTN_POST_NORM), not ffn_norm; o_proj's bias, the sinks, the router's bias and the experts'
# biases stacked [E, n] per projection (split_experts splits them as it splits the weights)
GPT_OSS_GGUF_NAMES = {"ffn_norm.weight": None, "post_attention_norm.weight": "post_attention_layernorm.weight",
                      "attn_output.bias": "self_attn.o_proj.bias", "attn_sinks.weight": "self_attn.sinks",
                      "ffn_gate_inp.bias": "mlp.gate.bias",
                      **{f"ffn_{x}_exps.bias": f"mlp.experts.{x}_proj_bias" for x in ("gate", "up", "down")}}

# MoE layers' tensors: the router, the experts stacked [E, ...] (split_experts splits them) and the shared expert
GGUF_MOE_NAMES = {"ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_exps.weight": "mlp.experts.gate_proj",
                  "ffn_up_exps.weight": "mlp.experts.up_proj", "ffn_down_exps.weight": "mlp.experts.down_proj",
                  **{f"ffn_{x}_shexp.weight": f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")},
                  "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight"}


def gguf_tensor_names(cfg: ModelConfig) -> dict[str, str]:
    """Every GGUF tensor name the family uses -> its transformers name (rope_freqs etc. are read as config)."""
    from .weights import norm_names
    roles = norm_names(cfg)
    layer = {g: f"{roles[r]}.weight" for g, r in GGUF_NORM_ROLES.items() if roles[r]}
    layer |= GGUF_LAYER_NAMES | (GGUF_MOE_NAMES if cfg.num_experts else {}) | FAMILIES[GGUF_ARCHS[cfg.arch]].gguf_names
    layer = {g: h for g, h in layer.items() if h is not None}     # None: a name the family's GGUFs do not use
    out = dict(GGUF_GLOBAL_NAMES)
    for i in range(cfg.num_layers):
        out |= {f"blk.{i}.{g}": f"model.layers.{i}.{h}" for g, h in layer.items()}
    return out


# ---------------------------------------------------------------- tensor fix-ups

def _rewrite(t: dict, name: str, fix: Callable[[np.ndarray], np.ndarray]) -> None:
    """t[name] = fix(t[name]): now for a dict, when the tensor is read for LazyTensors (one tensor at a time)."""
    if isinstance(t, LazyTensors):
        t.transform(name, fix)
    else:
        t[name] = fix(t[name])


def _qk_rows(cfg: ModelConfig, t: dict, inverse: bool) -> None:
    for name in list(t):
        for proj, n in (("q_proj", cfg.num_heads), ("k_proj", cfg.num_kv_heads)):
            if name.endswith(f"self_attn.{proj}.weight"):
                order = np.asarray(rope_half_rows(tensor_shape(t, name)[0], n))
                order = np.argsort(order) if inverse else order
                _rewrite(t, name, lambda w, order=order: np.ascontiguousarray(w[order]))


def unpermute_qk(cfg: ModelConfig, t: dict) -> None:
    """Undo llama.cpp's q/k row permutation of llama GGUFs (its rope pairs (2i, 2i+1); HF pairs (i, i + d/2))."""
    _qk_rows(cfg, t, inverse=False)


def permute_qk(cfg: ModelConfig, t: dict) -> None:
    """unpermute_qk's inverse: q/k rows back to interleaved pairs (2i, 2i+1), as Helium's transformers model keeps
    them."""
    _qk_rows(cfg, t, inverse=True)


def split_fused(cfg: ModelConfig, t: dict) -> None:
    """Phi-3's fused qkv_proj [(Hq + 2 Hkv) D, H] and gate_up_proj [2 I, H] (gate first) into the separate
    projections (the builders fuse them again, with LoRA targets per projection)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    rows = {"q_proj": q, "k_proj": kv, "v_proj": kv, "gate_proj": cfg.intermediate_size,
            "up_proj": cfg.intermediate_size}
    for name, stem, parts in fused_tensors(list(t)):
        cuts = np.cumsum([rows[p] for p in parts])[:-1]
        if isinstance(t, LazyTensors):      # each part reads its rows of the fused tensor when it is read
            load, k = t.loader(name), tensor_shape(t, name)[1]
            del t[name]
            for p, a, b in zip(parts, [0, *cuts], [*cuts, sum(rows[p] for p in parts)]):
                t.add(f"{stem}.{p}.weight", (int(b - a), k),
                      lambda load=load, a=int(a), b=int(b): np.ascontiguousarray(load()[a:b]))
            continue
        t.update({f"{stem}.{p}.weight": np.ascontiguousarray(v) for p, v in zip(parts, np.split(t.pop(name), cuts))})


def fused_tensors(names: list[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, its module's stem, the projections it splits into) for each HF tensor name among `names` that is the
    weight of a fused projection (contract.FUSED_PROJECTIONS: "model.layers.0.self_attn.qkv_proj.weight" ->
    ("model.layers.0.self_attn", ("q_proj", "k_proj", "v_proj")))."""
    out = []
    for name in names:
        stem, module, leaf = (["", ""] + name.rsplit(".", 2))[-3:]
        if leaf == "weight" and module in FUSED_PROJECTIONS:
            out.append((name, stem, FUSED_PROJECTIONS[module]))
    return out


def _rename(t: dict, marker: str, names: dict[str, str]) -> None:
    """Each tensor whose name has `marker` renamed by the (old -> new) substring replacements `names`, in order."""
    for name in [n for n in list(t) if marker in n]:
        new = name
        for old, repl in names.items():
            new = new.replace(old, repl)
        if isinstance(t, LazyTensors):
            t.add(new, tensor_shape(t, name), t.loader(name))
            del t[name]
        else:
            t[new] = t.pop(name)


MIXTRAL_NAMES = {"block_sparse_moe.gate.": "mlp.gate.", "block_sparse_moe.experts.": "mlp.experts.",
                 ".w1.weight": ".gate_proj.weight", ".w3.weight": ".up_proj.weight", ".w2.weight": ".down_proj.weight"}


def mixtral_names(cfg: ModelConfig, t: dict) -> None:
    """Mixtral's block_sparse_moe.gate and experts.{e}.w1 (gate) / w3 (up) / w2 (down) under the names the builders
    read: mlp.gate, mlp.experts.{e}.gate_proj / up_proj / down_proj."""
    _rename(t, ".block_sparse_moe.", MIXTRAL_NAMES)


# Granite-MoE's router and fused experts [E, 2I, H] (gate rows first: transformers chunks the output in two and
# activates the first) / [E, H, I] under transformers 5's fused names, which split_experts then splits per expert
GRANITE_NAMES = {"block_sparse_moe.router.layer.weight": "mlp.gate.weight",
                 "block_sparse_moe.input_linear.weight": "mlp.experts.gate_up_proj",
                 "block_sparse_moe.output_linear.weight": "mlp.experts.down_proj",
                 "shared_mlp.output_linear.weight": "mlp.shared_expert.down_proj.weight"}


def granite_names(cfg: ModelConfig, t: dict) -> None:
    """Granite-MoE's tensors under the names the builders read (GRANITE_NAMES); the shared expert's fused
    shared_mlp.input_linear [2S, H] (gate rows first) into mlp.shared_expert.gate_proj / up_proj."""
    _rename(t, ".block_sparse_moe.", GRANITE_NAMES)
    _rename(t, ".shared_mlp.output_linear.", GRANITE_NAMES)
    for name in [n for n in list(t) if n.endswith(".shared_mlp.input_linear.weight")]:
        stem, (rows, k) = name.removesuffix("shared_mlp.input_linear.weight"), tensor_shape(t, name)
        load = t.loader(name) if isinstance(t, LazyTensors) else (lambda a=t[name]: a)
        del t[name]
        for proj, a, b in (("gate_proj", 0, rows // 2), ("up_proj", rows // 2, rows)):
            def get(load=load, a=a, b=b):
                return np.ascontiguousarray(load()[a:b], np.float32)
            if isinstance(t, LazyTensors):
                t.add(f"{stem}mlp.shared_expert.{proj}.weight", (b - a, k), get)
            else:
                t[f"{stem}mlp.shared_expert.{proj}.weight"] = get()


def split_experts(cfg: ModelConfig, t: dict) -> None:
    """Stacked expert tensors (transformers 5: mlp.experts.gate_up_proj [E, 2I, H], gate rows first, and
    mlp.experts.down_proj [E, H, I]; a GGUF's ffn_{gate,up,down}_exps: mlp.experts.gate_proj / up_proj [E, I, H] and
    down_proj, and gpt-oss's stacked biases mlp.experts.{gate,up,down}_proj_bias [E, n]) into each expert's
    mlp.experts.{e}.gate_proj / up_proj / down_proj (.weight, .bias), the layout the builders read (hub checkpoints of
    transformers 4 already have it)."""
    f = cfg.moe_intermediate_size
    projs = ("gate_proj", "up_proj", "down_proj")
    parts = {"gate_up_proj": (("gate_proj", 0, f), ("up_proj", f, 2 * f)), **{p: ((p, 0, None),) for p in projs},
             **{f"{p}_bias": ((p, 0, None),) for p in projs}}      # gpt-oss GGUFs' stacked biases [E, n]
    for name in [n for n in list(t) if n.rsplit(".", 1)[-1] in parts and ".mlp.experts." in n]:
        stem, kind = name.rsplit(".", 1)
        leaf = "bias" if kind.endswith("_bias") else "weight"
        shape = tensor_shape(t, name)
        load = t.loader(name) if isinstance(t, LazyTensors) else (lambda a=t[name]: a)
        del t[name]
        for e in range(shape[0]):
            for proj, a, b in parts[kind]:
                rows = (b or shape[1]) - a
                def get(load=load, e=e, a=a, b=b):
                    return np.ascontiguousarray(load()[e, a:b], np.float32)
                if isinstance(t, LazyTensors):
                    t.add(f"{stem}.{e}.{proj}.{leaf}", (rows, *shape[2:]), get)
                else:
                    t[f"{stem}.{e}.{proj}.{leaf}"] = get()


def _last_read(load: Callable[[], np.ndarray], held: dict, keep: int = 1) -> Callable[[], np.ndarray]:
    """load, its array kept in `held` (loader -> array) while it is among the `keep` last read by the loaders sharing
    `held`: the builders read a layer's experts one after another, so a fused [E, ...] tensor is read from its file
    once, not once per expert."""
    def get():
        if load not in held:
            while len(held) >= keep:
                held.pop(next(iter(held)))
            held[load] = load()
        return held[load]
    return get


# MXFP4's e2m1 values by 4-bit code (transformers' integrations/mxfp4.py FP4_VALUES)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 [E, N, K / 32, 16] code bytes (element 2i in the low nibble, 2i + 1 in the high) and [E, N, K / 32]
    e8m0 block exponents (2^(s - 127)) -> fp32 [E, K, N], as transformers' convert_moe_packed_tensors (the layout of
    the bf16 checkpoints' experts, x @ W). Exact: a code's value times a power of two is an fp32 number."""
    codes = np.asarray(blocks).astype(np.uint8)
    exp = np.asarray(scales).astype(np.int32) - 127
    e, n, g, b = codes.shape
    vals = np.empty((e, n, g, 2 * b), np.float32)
    vals[..., 0::2], vals[..., 1::2] = E2M1[codes & 0x0F], E2M1[codes >> 4]
    out = np.ldexp(vals, exp[..., None]).astype(np.float32).reshape(e, n, g * 2 * b)
    return np.ascontiguousarray(out.transpose(0, 2, 1))


class SourceGrids(Mapping):
    """HF weight name -> its source grid (scale, low) fp32 [N, K / 32], each computed when asked for (a model's grids
    in fp32 would be twice its MXFP4 experts' bytes); the quantizer keeps a weight on it where its bits hold the
    codes (quant_grid.on_grid). types: name -> the source format's name, for the quantization report."""

    def __init__(self):
        self._make: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {}
        self.types: dict[str, str] = {}
        # name -> its source bytes (MXFP4: code bytes [N, K / 32, 16], element 2i in the low nibble, and e8m0
        # exponents [N, K / 32]), for a writer that carries them across as they are (bench/gguf_weights.py)
        self.codes: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {}

    def add(self, name: str, kind: str, make: Callable[[], tuple[np.ndarray, np.ndarray]],
            codes: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self._make[name], self.types[name] = make, kind
        if codes is not None:
            self.codes[name] = codes

    def __getitem__(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        return self._make[name]()

    def __iter__(self):
        return iter(self._make)

    def __len__(self) -> int:
        return len(self._make)


def mxfp4_grid(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An MXFP4 weight's [N, K / 32] e8m0 exponents -> the uniform grid its values lie on: every e2m1 value is a
    multiple of 0.5 within +-6, so a block with exponent s is scale * q + low with scale 2^(s - 128), low -12 scale,
    q in 0..24 (25 levels: 8-bit codes hold them exactly, 4-bit ones do not)."""
    scale = np.ldexp(np.float32(1), np.asarray(scales).astype(np.int32) - 128).astype(np.float32)
    return scale, (np.float32(-12) * scale).astype(np.float32)


def mxfp4_hub_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """expected_shapes as gpt-oss's hub checkpoints hold them, which fix_tensors(cfg, t, "hf") (mxfp4_experts, then
    gpt_oss_experts) brings back to expected_shapes: each sparse layer's router as mlp.router.{weight,bias} and its
    experts fused, in MXFP4: mlp.experts.gate_up_proj_blocks [E, 2I, H / 32, 16] (gate and up rows interleaved),
    _scales [E, 2I, H / 32], gate_up_proj_bias [E, 2I], down_proj_blocks [E, H, I / 32, 16], _scales [E, H, I / 32],
    down_proj_bias [E, H]. For a seeded random source of those tensors (sources.random_weights, mxfp4_experts)."""
    if mxfp4_experts not in FAMILIES[GGUF_ARCHS.get(cfg.arch, cfg.arch)].fix_hf:
        raise BuildError(f"MXFP4 experts are read for gpt-oss (arch gpt_oss) only; got arch '{cfg.arch}'")
    e, h, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    if h % 32 or f % 32:
        raise BuildError(f"MXFP4 experts need hidden_size and moe_intermediate_size multiples of 32 (its blocks); "
                         f"got {h}, {f}")
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith(".mlp.gate.weight"):       # a sparse layer's MLP: its hub tensors where the router was
            p = name.removesuffix("gate.weight")
            out |= {p + "router.weight": (e, h), **({p + "router.bias": (e,)} if cfg.moe_bias else {}),
                    p + "experts.gate_up_proj_blocks": (e, 2 * f, h // 32, 16),
                    p + "experts.gate_up_proj_scales": (e, 2 * f, h // 32),
                    **({p + "experts.gate_up_proj_bias": (e, 2 * f)} if cfg.moe_bias else {}),
                    p + "experts.down_proj_blocks": (e, h, f // 32, 16),
                    p + "experts.down_proj_scales": (e, h, f // 32),
                    **({p + "experts.down_proj_bias": (e, h)} if cfg.moe_bias else {})}
        elif ".mlp.gate." not in name and ".mlp.experts." not in name:
            out[name] = shape
    return out


class _ExpertsLoader:
    """The loader of a fused MXFP4 experts tensor (fp32 [E, K, N], mxfp4_dequantize) that can also give one expert
    alone, [K, N], from the held bytes (`expert(e)`: gpt_oss_experts splits the experts so; the same values as
    `self()[e]`, without the other experts' fp32)."""

    def __init__(self, raw: Callable[[], tuple[np.ndarray, np.ndarray]]):
        self.raw = raw

    def __call__(self) -> np.ndarray:
        return mxfp4_dequantize(*self.raw())

    def expert(self, e: int) -> np.ndarray:
        blocks, scales = self.raw()
        return mxfp4_dequantize(blocks[e:e + 1], scales[e:e + 1])[0]


def mxfp4_experts(cfg: ModelConfig, t: dict) -> SourceGrids | None:
    """The hub's gpt-oss experts in MXFP4 (mlp.experts.{gate_up,down}_proj_blocks / _scales) as the fused fp32
    tensors of a bf16 checkpoint (mlp.experts.gate_up_proj [E, H, 2I], down_proj [E, I, H]), dequantized exactly when
    read (gpt_oss_experts then splits them). Returns each expert projection's MXFP4 grid (mxfp4_grid; gate the even
    rows of gate|up, up the odd ones; with its code and exponent bytes as SourceGrids.codes), or None without MXFP4
    tensors."""
    grids, held = SourceGrids(), {}
    for name in [n for n in list(t) if ".mlp.experts." in n and n.endswith("_proj_blocks")]:
        stem = name.removesuffix("_blocks")
        scales = stem + "_scales"
        if scales not in t:
            raise BuildError(f"{name} has no {scales} beside it: is the MXFP4 checkpoint complete?")
        e, n, g, b = tensor_shape(t, name)
        if tensor_shape(t, scales) != (e, n, g):
            raise BuildError(f"{scales} has shape {tensor_shape(t, scales)}; {name} {(e, n, g, b)} implies {(e, n, g)}")
        lb = t.loader(name) if isinstance(t, LazyTensors) else (lambda a=t[name]: a)
        ls = t.loader(scales) if isinstance(t, LazyTensors) else (lambda a=t[scales]: a)
        del t[name], t[scales]
        # (codes, exponents) as bytes, a layer's two projections held while its experts are quantized (~0.4 GB at
        # gpt-oss-20b's shape; their fp32 would be 3.2 GB): each read from its source once a layer
        raw = _last_read(lambda lb=lb, ls=ls: (np.asarray(lb(), np.uint8), np.asarray(ls(), np.uint8)), held, keep=2)
        if isinstance(t, LazyTensors):
            t.add(stem, (e, g * 2 * b, n), _ExpertsLoader(raw))
        else:
            t[stem] = mxfp4_dequantize(*raw())
        rows = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2)} if stem.endswith("gate_up_proj") \
            else {"down_proj": slice(None)}
        prefix = stem.rsplit(".", 1)[0]        # model.layers.N.mlp.experts
        for x in range(e):
            for proj, sl in rows.items():
                grids.add(f"{prefix}.{x}.{proj}.weight", "MXFP4",
                          lambda raw=raw, x=x, sl=sl: mxfp4_grid(raw()[1][x][sl]),
                          codes=lambda raw=raw, x=x, sl=sl: (raw()[0][x][sl], raw()[1][x][sl]))
    return grids or None


def gpt_oss_experts(cfg: ModelConfig, t: dict) -> None:
    """gpt-oss's router mlp.router.{weight,bias} as mlp.gate.*, and its fused experts (mlp.experts.gate_up_proj
    [E, H, 2I] with gate and up INTERLEAVED along the last axis, gate_up_proj_bias [E, 2I], down_proj [E, I, H],
    down_proj_bias [E, H]: x @ W, not W^T) as each expert's mlp.experts.{e}.gate_proj / up_proj / down_proj [out, in]
    weights and biases, the layout the builders read."""
    for name in [n for n in list(t) if ".mlp.router." in n]:
        new = name.replace(".mlp.router.", ".mlp.gate.")
        if isinstance(t, LazyTensors):
            t.add(new, tensor_shape(t, name), t.loader(name))
            del t[name]
        else:
            t[new] = t.pop(name)
    # fused name -> (per-expert projection, its slice of the last axis (interleaved columns), transposed)
    parts = {"gate_up_proj": (("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2))),
             "gate_up_proj_bias": (("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2))),
             "down_proj": (("down_proj", slice(None)),), "down_proj_bias": (("down_proj", slice(None)),)}
    held: dict = {}
    for name in [n for n in list(t) if ".mlp.experts." in n and n.rsplit(".", 1)[-1] in parts]:
        stem, kind = name.rsplit(".", 1)
        shape = tensor_shape(t, name)
        if isinstance(t, LazyTensors):
            source = t.loader(name)
            # one expert at a time where the loader can (MXFP4: _ExpertsLoader), else the fused tensor held while it
            # is among a layer's four last read (the builders read each expert's gate, up and down, weight and bias,
            # from gate_up_proj, its bias, down_proj and its bias in turn), so each is read once a layer
            load = getattr(source, "expert", None) or (lambda e, fused=_last_read(source, held, keep=4): fused()[e])
        else:
            load = t[name].__getitem__         # the array, expert e at load(e)
        del t[name]
        leaf = "bias" if kind.endswith("_bias") else "weight"
        for e in range(shape[0]):
            for proj, cols in parts[kind]:
                def get(load=load, e=e, cols=cols, leaf=leaf):
                    a = np.asarray(load(e), np.float32)[..., cols]
                    return np.ascontiguousarray(a.T if leaf == "weight" else a, np.float32)
                width = len(range(shape[-1])[cols])
                out_shape = (width, shape[1]) if leaf == "weight" else (width,)
                if isinstance(t, LazyTensors):
                    t.add(f"{stem}.{e}.{proj}.{leaf}", out_shape, get)
                else:
                    t[f"{stem}.{e}.{proj}.{leaf}"] = get()


def norms_plus_one(cfg: ModelConfig, t: dict) -> None:
    """Gemma's RMSNorms multiply by (1 + w): fold the 1 in (llama.cpp's converter does the same for its GGUFs)."""
    for name in [n for n in t if n.endswith("norm.weight")]:
        _rewrite(t, name, lambda w: (w + np.float32(1.0)).astype(np.float32))


def fix_tensors(cfg: ModelConfig, tensors: dict, source: str) -> Mapping | None:
    """Apply the family's fix-ups of a `source` ("hf" or "gguf") to tensors, in place; returns the source grids a
    fix-up found (HF name -> (scale, low): MXFP4 experts), or None."""
    fam = FAMILIES[GGUF_ARCHS.get(cfg.arch, cfg.arch)]
    grids = None
    for fix in fam.fix_hf if source == "hf" else fam.fix_gguf:
        grids = fix(cfg, tensors) or grids
    return grids


# ---------------------------------------------------------------- back to transformers (references, LoRA training)

def hf_model_spec(cfg: ModelConfig, tensors: dict) -> tuple[str, str, dict, dict]:
    """(config class, model class, config kwargs, state dict in the family's transformers layout) of our weights:
    the inverse of hf_config and the HF fix-ups, for a transformers model holding exactly these weights."""
    name = GGUF_ARCHS.get(cfg.arch, cfg.arch)
    if name == "helium":        # the llama layout's weights, q/k rows interleaved again for its rotary embedding
        kw = {k: v for k, v in cfg.to_hf_config().items() if k not in ("architectures", "model_type")}
        t = dict(tensors)
        permute_qk(cfg, t)
        return "HeliumConfig", "HeliumForCausalLM", kw, t
    if name == "llama":
        kw = {k: v for k, v in cfg.to_hf_config().items() if k not in ("architectures", "model_type")}
        return "LlamaConfig", "LlamaForCausalLM", kw, dict(tensors)
    eos = list(cfg.eos_token_ids)
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
              num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
              num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
              max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
              rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
              bos_token_id=cfg.bos_token_id, eos_token_id=eos[0] if len(eos) == 1 else eos, pad_token_id=0)
    if cfg.rope_scaling and cfg.rope_scaling["type"] != "factors":
        kw["rope_scaling"] = {"rope_type": cfg.rope_scaling["type"],
                              **{k: v for k, v in cfg.rope_scaling.items() if k != "type"}}
    layer_types = ["sliding_attention" if t == "sliding" else "full_attention" for t in cfg.layer_types]
    t = dict(tensors)
    if name in ("mistral", "phi3"):
        kw["sliding_window"] = cfg.sliding_window
    if name in ("qwen2", "qwen3"):
        kw |= {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
               "layer_types": layer_types}
    if name == "phi3":
        q, k, v, g, u = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            t[p + "self_attn.qkv_proj.weight"] = np.concatenate([t.pop(f"{p}{n}.weight") for n in (q, k, v)])
            t[p + "mlp.gate_up_proj.weight"] = np.concatenate([t.pop(f"{p}{n}.weight") for n in (g, u)])
    if name == "gemma3":
        scalar = cfg.softmax_scale ** -2    # an int in Gemma3TextConfig (strictly checked by transformers 5)
        scalar = round(scalar) if abs(scalar - round(scalar)) <= 1e-6 * scalar else scalar
        kw |= {"layer_types": layer_types, "sliding_window": cfg.sliding_window,
               "query_pre_attn_scalar": scalar, "rope_local_base_freq": cfg.rope_local_theta,
               "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": cfg.final_logit_softcap}
        t = {n: (w - np.float32(1.0)).astype(np.float32) if n.endswith("norm.weight") else w for n, w in t.items()}
    if name == "granite":
        kw |= {"embedding_multiplier": cfg.embedding_scale, "attention_multiplier": cfg.softmax_scale,
               "residual_multiplier": cfg.residual_multiplier, "logits_scaling": cfg.logits_scaling}
    cls = {"mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "phi3": "Phi3", "gemma3": "Gemma3",
           "granite": "Granite"}[name]
    return ("Gemma3TextConfig" if name == "gemma3" else f"{cls}Config"), f"{cls}ForCausalLM", kw, t


FAMILIES = {
    "llama": Family(_hf_llama, _gguf_llama, fix_gguf=(unpermute_qk, split_experts)),    # split: Mixtral's GGUFs
    "mistral": Family(_hf_mistral, _gguf_llama),
    "qwen2": Family(_hf_qwen2, _gguf_qwen2),
    "qwen3": Family(_hf_qwen3, _gguf_qwen3),
    # Qwen3's blocks with a mixture-of-experts MLP (its dense layers: mlp_only_layers, decoder_sparse_step)
    "qwen3_moe": Family(_hf_qwen3_moe, _gguf_qwen3_moe, fix_hf=(split_experts,), fix_gguf=(split_experts,)),
    # Mistral + MoE: every layer sparse (its experts w1 / w3 / w2 renamed first)
    "mixtral": Family(_hf_mixtral, None, fix_hf=(mixtral_names, split_experts)),
    # Qwen2's blocks + MoE with a shared expert behind a sigmoid gate (Qwen1.5-MoE-A2.7B)
    "qwen2_moe": Family(_hf_qwen2_moe, _gguf_qwen2_moe, fix_hf=(split_experts,), fix_gguf=(split_experts,)),
    # llama's blocks with q/k norms over the whole projection + MoE on every layer
    "olmoe": Family(_hf_olmoe, _gguf_olmoe, fix_hf=(split_experts,), fix_gguf=(split_experts,)),
    # llama's blocks with Granite's multipliers + MoE (top-k then softmax) from fused experts; the -shared variant
    # adds a shared expert
    "granitemoe": Family(_hf_granitemoe, _gguf_granitemoe, fix_hf=(granite_names, split_experts),
                         fix_gguf=(unpermute_qk, split_experts)),
    # gpt-oss: biased attention with sinks, alternating sliding / full layers, YaRN, every MLP a mixture of experts
    # (router top-k then softmax, biased experts, clamped SwiGLU; MXFP4 experts dequantized exactly, fused experts
    # split by gpt_oss_experts); its GGUFs (llama.cpp's gpt-oss) with the stacked experts and their biases split by
    # split_experts (MXFP4 experts read by dequantizing them, exactly)
    "gpt_oss": Family(_hf_gpt_oss, _gguf_gpt_oss, fix_hf=(mxfp4_experts, gpt_oss_experts), fix_gguf=(split_experts,),
                      gguf_names=GPT_OSS_GGUF_NAMES),
    "phi3": Family(_hf_phi3, _gguf_phi3, fix_hf=(split_fused,), fix_gguf=(split_fused,),
                   gguf_names={"attn_qkv.weight": "self_attn.qkv_proj.weight",
                               "ffn_up.weight": "mlp.gate_up_proj.weight"}),
    # q|k|v on int16 activation codes: Gemma 3 270M's int8 build loses most to k's and v's int8 activations (the
    # normed hidden state's few large channels set their blocks' step); with it (and q|k|v unsmoothed, on the GGUF's
    # exact Q5_0 / Q8_0 grids) held-out KLD prose 0.00574 -> 0.00353, all 0.00479 -> 0.00388, top-1 97.56%, for
    # +9% CPU time of the q|k|v call at T = 1. Its int4 build smooths the MLP's norm (only gate|up, int8 on the Q5_0
    # grid, move; q|k|v keep their int16 codes and exact grids): held-out KLD code 0.00542 -> 0.00367, all 0.00442
    # -> 0.00369, for a calibration pass at build time (docs/quality-gemma3.md)
    "gemma3": Family(_hf_gemma3, _gguf_gemma3, fix_hf=(norms_plus_one,), act16=("qkv",), int4_smooth=0.5),
    # Kyutai's Helium: llama's blocks with an interleaved rotary embedding (pairs (2i, 2i+1)), i.e. q/k rows in the
    # order llama.cpp's GGUFs keep them; no GGUF architecture of its own (docs/howto-add-a-model.md walks this row)
    "helium": Family(_hf_helium, _gguf_llama, fix_hf=(unpermute_qk,)),
    # IBM's Granite: llama's blocks with its four multipliers (its GGUFs' q/k rows permuted as llama's)
    "granite": Family(_hf_granite, _gguf_granite, fix_gguf=(unpermute_qk,)),
}
HF_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                  "gemma3_text": "gemma3", "helium": "helium", "granite": "granite"}
HF_MODEL_TYPES |= {"qwen3_moe": "qwen3_moe", "mixtral": "mixtral", "qwen2_moe": "qwen2_moe", "olmoe": "olmoe",
                   "granitemoe": "granitemoe", "granitemoeshared": "granitemoe",
                   "gpt_oss": "gpt_oss"}        # mixtures of experts (engine graph only)
GGUF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma3": "gemma3",
              "granite": "granite"}
GGUF_ARCHS |= {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "olmoe": "olmoe",
               "granitemoe": "granitemoe", "gpt-oss": "gpt_oss"}     # mixtures of experts (engine graph only)


def default_act16(cfg: ModelConfig) -> tuple[str, ...]:
    """The projection groups an int8 build of this family puts on int16 activation codes when --act16 is not given
    (the llama default: none, the int8 codes' speed)."""
    family = FAMILIES.get(cfg.arch)
    return family.act16 if family is not None else ()


def default_int4_smooth(cfg: ModelConfig) -> float:
    """The SmoothQuant alpha an int4 build of this family takes when --smooth is not given (llama: 0, none)."""
    family = FAMILIES.get(cfg.arch)
    return family.int4_smooth if family is not None else 0.0
