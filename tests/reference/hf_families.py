"""Small random models of each family, made with transformers' own config and model classes, saved as HF
directories (config.json, model.safetensors and a byte tokenizer) that `ortllm build` reads like any other.

Weights are re-drawn so a wrong wire shows: projections ~ N(0, 1/in) (activations stay O(1)), norms around
their multiplier 1 (Gemma stores 1 + w: w ~ 0.1 N), biases 0.1 N. Each family sets the features it is here
for: Qwen2 q/k/v biases, Qwen3 q/k norms and head_dim != hidden / heads, Mistral a sliding window shorter
than the test's context, Llama 3 llama3 RoPE scaling with a tied head, Phi-3 fused qkv / gate_up, Gemma 3
pre/post norms, GELU-tanh, embedding scale, query_pre_attn_scalar, a sliding and a global layer with their
RoPE bases, and a final logit softcap.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)

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
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=32, num_key_value_heads=1, intermediate_size=128, sliding_window=24,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=48, rope_theta=1e6,
        rope_local_base_freq=10000.0, final_logit_softcapping=30.0, tie_word_embeddings=True)),
}


def tiny_model(family: str, seed: int = 0):
    """transformers' model of the family with re-drawn seeded weights, fp32, eval mode, eager attention."""
    import torch
    import transformers

    cfg_cls, model_cls, over = FAMILIES[family]
    cfg = getattr(transformers, cfg_cls)(**(BASE | over))
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
            else:
                p.copy_(torch.randn_like(p) / np.sqrt(p.shape[1]))
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
