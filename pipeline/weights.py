"""The in-memory model every source loads into: a llama config plus fp32 NumPy tensors in HF naming.

Tensor names follow transformers' LlamaForCausalLM (`model.layers.3.self_attn.q_proj.weight`, shape
[out, in]) so the graph builder, the optimum exporter and the transformers reference read one layout.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .errors import BuildError


@dataclass(frozen=True)
class ModelConfig:
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
            raise BuildError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise BuildError(f"head_dim must be even for rotary embeddings; got {self.head_dim}")

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


def layer_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per-layer tensor names (suffix after `model.layers.N.`) -> shape."""
    h, d = cfg.hidden_size, cfg.head_dim
    return {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (cfg.num_heads * d, h),
        "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
        "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
        "self_attn.o_proj.weight": (h, cfg.num_heads * d),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (cfg.intermediate_size, h),
        "mlp.up_proj.weight": (cfg.intermediate_size, h),
        "mlp.down_proj.weight": (h, cfg.intermediate_size),
    }


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
                             "is it a complete llama checkpoint?")
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
