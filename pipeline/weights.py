"""The in-memory model every source loads into: a ModelConfig plus fp32 NumPy tensors in HF naming.

Tensor names follow transformers' LlamaForCausalLM (`model.layers.3.self_attn.q_proj.weight`, shape
[out, in]) so the graph builder, the optimum exporter and the transformers reference read one layout.
"""
from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field

import numpy as np

from ortllm.runtime.contract import ModelConfig

from .errors import BuildError

__all__ = ["LazyTensors", "ModelConfig", "ModelWeights", "expected_shapes", "layer_tensor_shapes", "norm_names"]


def norm_names(cfg: ModelConfig) -> dict[str, str | None]:
    """A layer's RMSNorms by role (HF suffixes after `model.layers.N.`; None: the family has none there):
    attn_in, attn_out (on the attention's output, before the residual add), mlp_in, mlp_out. transformers
    names the MLP's input norm post_attention_layernorm in llama and pre_feedforward_layernorm in Gemma, whose
    post_attention_layernorm is the attention's output norm."""
    if cfg.post_norms:
        return {"attn_in": "input_layernorm", "attn_out": "post_attention_layernorm",
                "mlp_in": "pre_feedforward_layernorm", "mlp_out": "post_feedforward_layernorm"}
    return {"attn_in": "input_layernorm", "attn_out": None, "mlp_in": "post_attention_layernorm", "mlp_out": None}


def layer_tensor_shapes(cfg: ModelConfig, layer: int = 0) -> dict[str, tuple[int, ...]]:
    """Layer `layer`'s tensor names (suffix after `model.layers.N.`) -> shape: a sparse layer (ModelConfig.sparse_layer)
    has the router mlp.gate [E, H] and each expert's mlp.experts.{e}.gate_proj / up_proj / down_proj instead of the
    dense MLP's [, the shared expert's mlp.shared_expert.* and its gate mlp.shared_expert_gate [1, H]]."""
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
    if cfg.sparse_layer(layer):
        f = cfg.moe_intermediate_size
        for name in ("gate_proj", "up_proj", "down_proj"):
            del shapes[f"mlp.{name}.weight"]
        shapes["mlp.gate.weight"] = (cfg.num_experts, h)
        for e in range(cfg.num_experts):
            shapes |= {f"mlp.experts.{e}.gate_proj.weight": (f, h), f"mlp.experts.{e}.up_proj.weight": (f, h),
                       f"mlp.experts.{e}.down_proj.weight": (h, f)}
        if cfg.moe_bias:        # gpt-oss: the router's and each expert's biases
            shapes["mlp.gate.bias"] = (cfg.num_experts,)
            for e in range(cfg.num_experts):
                shapes |= {f"mlp.experts.{e}.gate_proj.bias": (f,), f"mlp.experts.{e}.up_proj.bias": (f,),
                           f"mlp.experts.{e}.down_proj.bias": (h,)}
        s = cfg.shared_expert_intermediate_size
        if s:
            shapes |= {"mlp.shared_expert.gate_proj.weight": (s, h), "mlp.shared_expert.up_proj.weight": (s, h),
                       "mlp.shared_expert.down_proj.weight": (h, s)}
        if cfg.shared_expert_gate:
            shapes["mlp.shared_expert_gate.weight"] = (1, h)
    if cfg.attention_bias:
        shapes |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    if cfg.qk_norm:     # per head, or over the whole projection (qk_norm_whole)
        shapes |= {"self_attn.q_norm.weight": (q if cfg.qk_norm_whole else d,),
                   "self_attn.k_norm.weight": (kv if cfg.qk_norm_whole else d,)}
    if cfg.o_proj_bias:
        shapes["self_attn.o_proj.bias"] = (h,)
    if cfg.attention_sinks:
        shapes["self_attn.sinks"] = (cfg.num_heads,)
    return shapes


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    for i in range(cfg.num_layers):
        for suffix, shape in layer_tensor_shapes(cfg, i).items():
            shapes[f"model.layers.{i}.{suffix}"] = shape
    return shapes


class LazyTensors(MutableMapping):
    """HF name -> fp32 array, each read from its source when accessed and not kept, so a build holds one tensor
    (or one layer's few) at a time: an 8B model's 32 GB of fp32 never sits in RAM. Each name has a shape, known
    without reading, and a loader (a safetensors slice of an mmap, one GGUF tensor dequantized); `transform` chains
    a per-tensor fix-up (pipeline/families.py) onto the loader. Arrays assigned (t[name] = arr) are kept as given.
    Iteration follows insertion order, as a dict's."""

    def __init__(self):
        self._loaders: dict[str, Callable[[], np.ndarray]] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._held: dict[str, np.ndarray] = {}

    def add(self, name: str, shape: tuple[int, ...], loader: Callable[[], np.ndarray]) -> None:
        self._held.pop(name, None)
        self._loaders[name], self._shapes[name] = loader, tuple(int(n) for n in shape)

    def transform(self, name: str, fix: Callable[[np.ndarray], np.ndarray], shape: tuple | None = None) -> None:
        """t[name] = fix(t[name]), applied when the tensor is read (shape: the fixed tensor's, if it changes)."""
        if name in self._held:
            self._held[name] = fix(self._held[name])
            return
        load = self._loaders[name]
        self.add(name, shape or self._shapes[name], lambda: fix(load()))

    def loader(self, name: str) -> Callable[[], np.ndarray]:
        return self._loaders[name] if name in self._loaders else (lambda: self._held[name])

    def copy(self) -> "LazyTensors":
        """Another mapping over the same loaders and held arrays: its transforms leave this one untouched."""
        out = LazyTensors()
        out._loaders, out._shapes, out._held = dict(self._loaders), dict(self._shapes), dict(self._held)
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._held:
            return self._held[name]
        if name not in self._loaders:
            raise KeyError(name)
        return np.ascontiguousarray(self._loaders[name](), dtype=np.float32)

    def __setitem__(self, name: str, arr: np.ndarray) -> None:
        self._loaders.pop(name, None)
        self._held[name], self._shapes[name] = arr, tuple(arr.shape)

    def __delitem__(self, name: str) -> None:
        if name not in self._shapes:
            raise KeyError(name)
        self._loaders.pop(name, None)
        self._held.pop(name, None)
        del self._shapes[name]

    def __iter__(self):
        return iter(list(self._shapes))

    def __len__(self) -> int:
        return len(self._shapes)

    def __contains__(self, name) -> bool:
        return name in self._shapes


def tensor_shape(tensors, name: str) -> tuple[int, ...]:
    """A tensor's shape without reading it from a lazy source."""
    return tensors.shape(name) if isinstance(tensors, LazyTensors) else tuple(tensors[name].shape)


@dataclass
class ModelWeights:
    config: ModelConfig
    tensors: dict[str, np.ndarray] | LazyTensors    # HF name -> fp32 array (LazyTensors: read on access)
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
            if tensor_shape(self.tensors, name) != shape:
                raise BuildError(f"tensor {name} has shape {tensor_shape(self.tensors, name)}, "
                                 f"the config implies {shape}")
            if isinstance(self.tensors, LazyTensors):
                continue          # read as fp32 on access
            got = self.tensors[name]
            if got.dtype != np.float32:
                self.tensors[name] = got.astype(np.float32)

    def lm_head(self) -> np.ndarray:
        """[vocab, hidden]: the embedding when tied."""
        key = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        return self.tensors[key]
