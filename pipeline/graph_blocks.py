"""Graph blocks shared by the portable and the engine graph (any activation rank: [B, S, H] or [T, H])."""
from __future__ import annotations

import numpy as np

from .onnx_builder import GraphBuilder
from .quantize import QuantizedWeight, hf_name
from .weights import ModelConfig


def rope_tables(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: [max_pos, D/2] (one angle per rotated pair), in fp32 as transformers computes them."""
    d = cfg.head_dim
    inv_freq = (1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))).astype(np.float32)
    freqs = np.outer(np.arange(cfg.max_position_embeddings, dtype=np.float32), inv_freq).astype(np.float32)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def rms_norm(g: GraphBuilder, x: str, weight: np.ndarray, eps: float, path: str) -> str:
    """x * 1/sqrt(mean(x^2) + eps) * w, in the op pattern ONNX Runtime fuses into SimplifiedLayerNormalization.

        x -> Pow(2) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Div(x, .) -> Mul(w)
    """
    sq = g.op("Pow", [x, g.const(2.0, np.float32)], path)
    mean = g.op("ReduceMean", [sq], path, axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [mean, g.const(eps, np.float32)], path)], path)
    normed = g.op("Div", [x, std], path)
    return g.op("Mul", [normed, g.weight(f"{path}.weight", weight)], path)


def linear(g: GraphBuilder, x: str, w: np.ndarray, path: str, quant=None) -> str:
    """x [.., in] @ w.T; w is the HF [out, in] weight, stored transposed [in, out] (fp32 MatMul), or, when
    `quant` (a pipeline.quantize.QuantPlan) quantizes this tensor, a MatMulNBits on the [out, in] blocks."""
    q = quant.quantize(hf_name(path), w) if quant is not None else None
    if q is None:
        return g.op("MatMul", [x, g.weight(f"{path}.weight", np.ascontiguousarray(w.T))], path)
    return matmul_nbits(g, x, q, path, quant.accuracy_level)


def matmul_nbits(g: GraphBuilder, x: str, q: QuantizedWeight, path: str, accuracy_level: int) -> str:
    """x [.., K] -> com.microsoft MatMulNBits(B [N, k_blocks, blob], scales [, zero_points]) -> [.., N]."""
    g.opsets.setdefault("com.microsoft", 1)
    ins = [x, g.weight(f"{path}.weight_q{q.bits}", q.data), g.weight(f"{path}.scales", q.scales)]
    if q.zero_points is not None:
        ins.append(g.weight(f"{path}.zero_points", q.zero_points))
    return g.op("MatMulNBits", ins, path, domain="com.microsoft", K=q.k, N=q.n, bits=q.bits,
                block_size=q.block_size, accuracy_level=accuracy_level)


def mlp(g: GraphBuilder, h: str, w: dict, i: int, proj) -> str:
    """down(silu(gate(h)) * up(h)); `proj(g, x, weight, path)` emits one projection (plain or with LoRA)."""
    path, p = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
    gate = proj(g, h, w[f"{p}.gate_proj.weight"], f"{path}/gate_proj")
    up = proj(g, h, w[f"{p}.up_proj.weight"], f"{path}/up_proj")
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{path}/act")], f"{path}/act")
    return proj(g, g.op("Mul", [act, up], f"{path}/act_up"), w[f"{p}.down_proj.weight"], f"{path}/down_proj")


def decoder_layers(g: GraphBuilder, cfg: ModelConfig, w: dict, x: str, attention, proj) -> str:
    """The llama layer stack; `attention(h, i)` and `proj(g, x, weight, path, i)` are the graph's own.

        x -> RMSNorm -> attention -> +x -> RMSNorm -> MLP(proj) -> +  (per layer)
    """
    for i in range(cfg.num_layers):
        h = rms_norm(g, x, w[f"model.layers.{i}.input_layernorm.weight"], cfg.rms_norm_eps,
                     f"/model/layers.{i}/input_layernorm")
        x = g.op("Add", [x, attention(h, i)], f"/model/layers.{i}/attn_residual")
        h = rms_norm(g, x, w[f"model.layers.{i}.post_attention_layernorm.weight"], cfg.rms_norm_eps,
                     f"/model/layers.{i}/post_attention_layernorm")
        x = g.op("Add", [x, mlp(g, h, w, i, lambda g_, x_, w_, path, i=i: proj(g_, x_, w_, path, i))],
                 f"/model/layers.{i}/mlp_residual")
    return x


def lm_head(g: GraphBuilder, x: str, weights, embed: str, quant=None) -> str:
    """x [N, H] -> logits [N, V]: MatMulNBits on the [V, H] weight when the plan quantizes it (the embedding
    stays fp32 for Gather), else Gemm(transB) on it, so a tied embedding is stored once."""
    q_head = quant.quantize("lm_head.weight", weights.lm_head()) if quant is not None else None
    if q_head is not None:
        return matmul_nbits(g, x, q_head, "/lm_head", quant.accuracy_level)
    cfg = weights.config
    head = embed if cfg.tie_word_embeddings else g.weight("lm_head.weight", weights.tensors["lm_head.weight"])
    return g.op("Gemm", [x, head], "/lm_head", transB=1)
