"""The in-memory model every source loads into: a ModelConfig plus fp32 NumPy tensors in HF naming.

Tensor names follow transformers' LlamaForCausalLM (`model.layers.3.self_attn.q_proj.weight`, shape
[out, in]) so the graph builder, the optimum exporter and the transformers reference read one layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ortllm.runtime.contract import ModelConfig

from .errors import BuildError

__all__ = ["ModelConfig", "ModelWeights", "expected_shapes", "layer_tensor_shapes", "norm_names"]


def norm_names(cfg: ModelConfig) -> dict[str, str | None]:
    """A layer's RMSNorms by role (HF suffixes after `model.layers.N.`; None: the family has none there):
    attn_in, attn_out (on the attention's output, before the residual add), mlp_in, mlp_out. transformers
    names the MLP's input norm post_attention_layernorm in llama and pre_feedforward_layernorm in Gemma, whose
    post_attention_layernorm is the attention's output norm."""
    if cfg.post_norms:
        return {"attn_in": "input_layernorm", "attn_out": "post_attention_layernorm",
                "mlp_in": "pre_feedforward_layernorm", "mlp_out": "post_feedforward_layernorm"}
    return {"attn_in": "input_layernorm", "attn_out": None, "mlp_in": "post_attention_layernorm", "mlp_out": None}


def layer_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per-layer tensor names (suffix after `model.layers.N.`) -> shape."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes = {f"{n}.weight": (h,) for n in norm_names(cfg).values() if n}
    shapes |= {
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (cfg.intermediate_size, h),
        "mlp.up_proj.weight": (cfg.intermediate_size, h),
        "mlp.down_proj.weight": (h, cfg.intermediate_size),
    }
    if cfg.attention_bias:
        shapes |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    if cfg.qk_norm:
        shapes |= {"self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,)}
    return shapes


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    for i in range(cfg.num_layers):
        for suffix, shape in layer_tensor_shapes(cfg).items():
            shapes[f"model.layers.{i}.{suffix}"] = shape
    return shapes


@dataclass
class ModelWeights:
    config: ModelConfig
    tensors: dict[str, np.ndarray]          # HF name -> fp32 array
    # Writes the tokenizer files into an artifact dir and returns a pipeline.tokenizer.TokenizerInfo.
    write_tokenizer: object = None
    source_sha256: str | None = None
    source_desc: str = ""
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Every tensor present, fp32, with the shape the config implies."""
        want = expected_shapes(self.config)
        missing = sorted(set(want) - set(self.tensors))
        if missing:
            raise BuildError(f"source lacks {len(missing)} tensors, e.g. {missing[0]}; "
                             f"is it a complete {self.config.arch} checkpoint?")
        for name, shape in want.items():
            got = self.tensors[name]
            if tuple(got.shape) != shape:
                raise BuildError(f"tensor {name} has shape {tuple(got.shape)}, the config implies {shape}")
            if got.dtype != np.float32:
                self.tensors[name] = got.astype(np.float32)

    def lm_head(self) -> np.ndarray:
        """[vocab, hidden]: the embedding when tied."""
        key = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        return self.tensors[key]
