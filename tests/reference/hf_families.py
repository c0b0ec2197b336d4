"""Small random models of each family, made with transformers' own config and model classes, saved as HF
directories (config.json, model.safetensors and a byte tokenizer) that `ortllm build` reads like any other.

Weights are re-drawn so a wrong wire shows: projections ~ N(0, 1/in) (activations stay O(1)), norms around
their multiplier 1 (Gemma stores 1 + w: w ~ 0.1 N), biases 0.1 N. Each family sets the features it is here
for: Qwen2 q/k/v biases, Qwen3 q/k norms and head_dim != hidden / heads, Mistral a sliding window shorter
than the test's context, Llama 3 llama3 RoPE scaling with a tied head, Phi-3 fused qkv / gate_up, Gemma 3
pre/post norms, GELU-tanh, embedding scale, query_pre_attn_scalar, a sliding and a global layer with their
RoPE bases, and a final logit softcap, Granite its embedding, attention, residual and logits multipliers; gpt-oss
(GPT_OSS) its sinks, biases, YaRN and clamped experts.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)

# Granite's multipliers away from 1 but not at Granite 3.1's (12, 1/64, 0.22, 6: on these N(0, 1) embeddings the blocks'
# share of the residual stream would be so small that every greedy token repeats the last one), each exact in float32 as
# a GGUF's keys hold them
GRANITE = dict(embedding_multiplier=1.5, attention_multiplier=0.125, residual_multiplier=0.625, logits_scaling=3.0)
GRANITE_MOE = dict(GRANITE, num_local_experts=8, num_experts_per_tok=2, intermediate_size=48)

# family -> (config class, model class, config overrides)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, rope_theta=1e6)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=40, head_dim=16)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict()),
    "helium": ("HeliumConfig", "HeliumForCausalLM", dict(head_dim=16)),
    # eos 511: this model's greedy continuation has token 2 as its argmax once, which transformers' generate masks
    # (min_new_tokens) where the engine's ignore_eos keeps it
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(GRANITE, eos_token_id=511)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=32, num_key_value_heads=1, intermediate_size=128, sliding_window=24,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=48, rope_theta=1e6,
        rope_local_base_freq=10000.0, final_logit_softcapping=30.0, tie_word_embeddings=True)),
}


# the mixture-of-experts families (tests/pipeline/test_moe_families.py; engine graph only): 8 experts, top-2; Qwen3-MoE
# with one dense layer among three (mlp_only_layers), Mixtral (every layer sparse) with a window shorter than the test,
# Qwen2-MoE's first layer dense (decoder_sparse_step 2) and its gated shared expert, OLMoE's whole-projection q/k norms,
# Granite-MoE's multipliers, and its shared-expert variant
MOE_FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        head_dim=16, num_local_experts=8, num_experts_per_tok=2, intermediate_size=48, sliding_window=40)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=32, rope_theta=1e6, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        rope_theta=1e6, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
        shared_expert_intermediate_size=96, decoder_sparse_step=2, norm_topk_prob=False)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(
        num_experts=8, num_experts_per_tok=2, intermediate_size=48, norm_topk_prob=False)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(GRANITE_MOE)),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", dict(
        GRANITE_MOE, shared_intermediate_size=64)),
}


# gpt-oss (tests/pipeline/test_gpt_oss.py): 8 experts, top-2, biases everywhere, attention sinks, a window of 8
# alternating with full layers, YaRN; its gate|up weights scaled by GPT_OSS_GATE_UP_SCALE so the clamp at 7 fires
GPT_OSS = {"gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
    head_dim=16, num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2, intermediate_size=48,
    max_position_embeddings=128,
    sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                  "original_max_position_embeddings": 32}))}
GPT_OSS_GATE_UP_SCALE = 4.0


def tiny_model(family: str, seed: int = 0, **overrides):
    """transformers' model of the family with re-drawn seeded weights, fp32, eval mode, eager attention;
    `overrides` change the config (e.g. vocab_size for a real tokenizer)."""
    import torch
    import transformers

    cfg_cls, model_cls, over = (FAMILIES | MOE_FAMILIES | GPT_OSS)[family]
    cfg = getattr(transformers, cfg_cls)(**(BASE | over | overrides))
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    gemma = family == "gemma3"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.1 * torch.randn_like(p) + (0.0 if gemma else 1.0))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p) * (cfg.hidden_size ** -0.5 if gemma else 1.0))
            elif name.endswith("sinks"):            # gpt-oss: logits of the size of the scores'
                p.copy_(torch.randn_like(p) + 1.0)
            elif name.endswith("experts.gate_up_proj"):     # [E, H, 2I]: x @ W
                p.copy_(torch.randn_like(p) * (GPT_OSS_GATE_UP_SCALE / np.sqrt(p.shape[1])))
            else:
                p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1]))   # fan-in (experts [E, out, in])
    return model


def save_hf_dir(model, out: Path) -> Path:
    """config.json + model.safetensors + the byte tokenizer (tokenizer.json, tokenizer_config.json)."""
    from ortllm.pipeline.tokenizer import write_byte_tokenizer

    model.save_pretrained(out, safe_serialization=True)
    write_byte_tokenizer(out, model.config.vocab_size)
    return out


def hf_logits(model, ids: list[int]) -> np.ndarray:
    """[len(ids), V] fp32 logits of one forward pass."""
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_logits_hooked(model, ids: list[int], suffixes, hook, with_kwargs: bool = False) -> np.ndarray:
    """hf_logits with `hook` a forward hook (torch's signature; with_kwargs: it also takes the call's kwargs) on
    every module whose name ends with one of `suffixes`, removed after the pass."""
    handles = [m.register_forward_hook(hook, with_kwargs=with_kwargs) for n, m in model.named_modules()
               if n.endswith(suffixes)]
    try:
        return hf_logits(model, ids)
    finally:
        for h in handles:
            h.remove()


# family -> gguf's architecture (Mistral converts to llama, as llama.cpp's converter does it)
GGUF_ARCH = {"qwen2": "QWEN2", "qwen3": "QWEN3", "mistral": "LLAMA", "llama3": "LLAMA", "phi3": "PHI3",
             "granite": "GRANITE"}
MOE_GGUF_ARCH = {"qwen3_moe": "QWEN3MOE", "qwen2_moe": "QWEN2MOE", "olmoe": "OLMOE", "granitemoe": "GRANITE_MOE",
                 "granitemoeshared": "GRANITE_MOE", "mixtral": "LLAMA"}     # the MoE families llama.cpp reads
# Granite's fused gate|up (gate rows first) -> the names gguf's map knows (its converter splits them the same way)
_GRANITE_FUSED = {"block_sparse_moe.input_linear.weight": "mlp.experts.{}_proj.weight",
                  "shared_mlp.input_linear.weight": "mlp.shared_expert.{}_proj.weight"}
_EXPERT = re.compile(r"^(model\.layers\.\d+\.(?:mlp|block_sparse_moe)\.experts)\.(\d+)\.(\w+)\.weight$")


def _split_granite(state: dict):
    """(name, tensor) of a state dict, Granite's fused input_linear weights ([E, 2I, H] / [2S, H], gate rows first)
    as their gate and up halves under names gguf's tensor map knows."""
    for name, t in state.items():
        fused = next((k for k in _GRANITE_FUSED if name.endswith(k)), None)
        if fused is None:
            yield name, t
            continue
        stem = name.removesuffix(fused)
        half = t.shape[-2] // 2
        yield stem + _GRANITE_FUSED[fused].format("gate"), t[..., :half, :]
        yield stem + _GRANITE_FUSED[fused].format("up"), t[..., half:, :]


def write_gguf(model, family: str, path: Path, tokenizer=None, types: dict | None = None) -> Path:
    """The model as llama.cpp's converter writes it (F32): gguf's own tensor name map, q/k rows permuted for llama,
    Llama 3's RoPE scaling as a rope_freqs tensor, the `<arch>.*` keys, and a byte-level gpt2 tokenizer (or
    `tokenizer`: an object whose add_to(writer) writes the tokenizer keys, e.g. real_tokenizers.GGUFTokenizer). An MoE
    model's experts stacked [E, ...] per projection (ffn_{gate,up,down}_exps) with the `<arch>.expert_*` keys; a dense
    layer among its sparse ones keeps ffn_gate / ffn_up / ffn_down (which llama.cpp's qwen3moe has no place for).
    `types`: GGUF tensor name suffix (e.g. "ffn_down_exps.weight") -> gguf.GGMLQuantizationType to store it in."""
    import gguf

    from ortllm.pipeline.tokenizer import _bytes_to_unicode

    cfg = model.config
    arch_name = (GGUF_ARCH | MOE_GGUF_ARCH)[family]
    arch = getattr(gguf.MODEL_ARCH, arch_name)
    names = gguf.TensorNameMap(arch, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    d = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_dimension_count(d)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    if family in MOE_GGUF_ARCH:
        local = hasattr(cfg, "num_local_experts")    # Granite's, Mixtral's: num_local_experts of intermediate_size
        w.add_expert_count(cfg.num_local_experts if local else cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.intermediate_size if local else getattr(
            cfg, "moe_intermediate_size", cfg.intermediate_size))      # OLMoE's experts: intermediate_size too
        shared = getattr(cfg, "shared_expert_intermediate_size", 0) or getattr(cfg, "shared_intermediate_size", 0)
        if shared:
            w.add_expert_shared_feed_forward_length(shared)
    if arch_name in ("GRANITE", "GRANITE_MOE"):
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    if tokenizer is not None:
        tokenizer.add_to(w)
    else:
        tokens = _bytes_to_unicode() + ["\u0120\u0120"] + [f"<extra_{i}>" for i in range(cfg.vocab_size - 257)]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([1] * 257 + [3] * (cfg.vocab_size - 257))
        w.add_token_merges(["\u0120 \u0120"])
        w.add_eos_token_id(2)
    rs = getattr(cfg, "rope_scaling", None) or {}
    if rs.get("rope_type") == "llama3":    # llama.cpp's convert_hf_to_gguf: a divisor per frequency
        inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        old, lo, hi, f = (rs[k] for k in ("original_max_position_embeddings", "low_freq_factor",
                                          "high_freq_factor", "factor"))
        factors = []
        for freq in inv:
            wavelen = 2 * np.pi / freq
            if wavelen < old / hi:
                factors.append(1.0)
            elif wavelen > old / lo:
                factors.append(f)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                factors.append(1 / ((1 - smooth) / f + smooth))
        w.add_tensor("rope_freqs.weight", np.asarray(factors, np.float32))
    def add(gname: str, arr: np.ndarray) -> None:      # F32, or quantized as the converter does (gguf.quants)
        qtype = next((q for suffix, q in (types or {}).items() if gname.endswith(suffix)), None)
        arr = np.ascontiguousarray(arr)
        w.add_tensor(gname, arr) if qtype is None else w.add_tensor(gname, gguf.quants.quantize(arr, qtype),
                                                                    raw_dtype=qtype)

    dense_ffn = {f"mlp.{x}_proj.weight": f"ffn_{x}.weight" for x in ("gate", "up", "down")}
    experts: dict[str, list] = {}
    for name, t in _split_granite(model.state_dict()):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        arr = t.float().numpy()
        if arch_name in ("LLAMA", "GRANITE", "GRANITE_MOE") and name.endswith(("q_proj.weight", "k_proj.weight")):
            n = cfg.num_attention_heads if name.endswith("q_proj.weight") else cfg.num_key_value_heads
            arr = arr.reshape(n, 2, arr.shape[0] // n // 2, *arr.shape[1:]).swapaxes(1, 2).reshape(arr.shape)
        m = _EXPERT.match(name)
        if m:       # stacked in expert order once the layer's last expert is read (state_dict keeps the order)
            experts.setdefault(f"{m.group(1)}.{m.group(3)}", []).append(arr)
            continue
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None and family in MOE_GGUF_ARCH:
            layer, suffix = name.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{layer}.{dense_ffn[suffix]}"
        add(gname, arr)
    for name, arrs in experts.items():
        add(names.get_name(name + ".weight", try_suffixes=(".weight",)), np.stack(arrs))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
