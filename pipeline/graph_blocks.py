"""Graph blocks shared by the portable and the engine graph (any activation rank: [B, S, H] or [T, H])."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

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


@dataclass
class Projection:
    """One projection's output without its offset term: y = x @ W^T - blocksum(x) @ offsets^T.
    offsets: name of the fp16 [k_blocks, out] initializer (asymmetric quantized form) or None."""
    y: str
    offsets: str | None = None
    block_size: int = 0
    in_dim: int = 0


def linear(g: GraphBuilder, x: str, w: np.ndarray, path: str, quant=None) -> str:
    """x [.., in] @ w.T; w is the HF [out, in] weight (see linear_group)."""
    return linear_group(g, x, [w], [path], quant)[0]


def linear_group(g: GraphBuilder, x: str, ws: list[np.ndarray], paths: list[str], quant=None) -> list[str]:
    """Projections of one input in plain ONNX ops (project(), then each offset term as two MatMuls and an Add):

        x -> MatMul(block indicator [K, kb]) -> MatMul(offsets^T [kb, N]) --+
        x -> project ------------------------------------------------------> Add -> y
    """
    return [offset_term(g, x, p) for p in project(g, x, ws, paths, quant)]


def offset_term(g: GraphBuilder, x: str, p: Projection) -> str:
    """p.y + blocksum(x) @ offsets: the asymmetric form's correction in standard ops (pipeline/quantize.py)."""
    if p.offsets is None:
        return p.y
    ind = g.shared_weight(f"block_indicator.{p.in_dim}x{p.block_size}",
                          lambda: _block_indicator(p.in_dim, p.block_size))
    sums = g.op("MatMul", [x, ind], f"{p.offsets}/block_sums")                                # [.., kb]
    table = g.op("Cast", [p.offsets], f"{p.offsets}/fp32", to=TensorProto.FLOAT)              # folded at load
    return g.op("Add", [p.y, g.op("MatMul", [sums, table], f"{p.offsets}/term")], f"{p.offsets}/add")


def project(g: GraphBuilder, x: str, ws: list[np.ndarray], paths: list[str], quant=None) -> list[Projection]:
    """Projections of one input, fused into one matmul along out when they share a dtype (q|k|v, gate|up):
    one weight stream and one kernel launch instead of several, then Split back to the parts.

        x [.., in] -> MatMul(W^T [in, sum(out)]) | MatMulNBits(W_q) -> Split -> [.., out_i] per path

    fp32 weights are stored transposed [in, out]; `quant` (a pipeline.quantize.QuantPlan) decides per HF
    tensor, so a --keep that splits a group apart falls back to one matmul per projection. The offset term
    of asymmetric quantized weights is left to the caller (offset_term, or MultiLoRA's offsets input).
    """
    qs = [quant.quantize(hf_name(p), w) if quant is not None else None for w, p in zip(ws, paths)]
    forms = {None if q is None else (q.bits, q.offsets is None) for q in qs}
    if len(ws) > 1 and len(forms) > 1:
        return [project(g, x, [w], [p], quant)[0] for w, p in zip(ws, paths)]
    path = group_path(paths)
    if qs[0] is None:
        y = g.op("MatMul", [x, g.weight(f"{path}.weight", np.ascontiguousarray(np.concatenate(ws).T))], path)
    else:
        y = matmul_nbits(g, x, qs[0] if len(qs) == 1 else QuantizedWeight.concat(qs), path, quant.accuracy_level)
    ys = [y] if len(ws) == 1 else list(g.op("Split", [y, g.const([w.shape[0] for w in ws])], f"{path}/split",
                                            n_out=len(ws), axis=-1))
    return [Projection(y_, *_offsets(g, q, p)) for y_, q, p in zip(ys, qs, paths)]


def _offsets(g: GraphBuilder, q: QuantizedWeight | None, path: str) -> tuple[str | None, int, int]:
    if q is None or q.offsets is None:
        return None, 0, 0
    return g.weight(f"{path}.offsets", np.ascontiguousarray(q.offsets.T)), q.block_size, q.k   # [kb, out]


def group_path(paths: list[str]) -> str:
    """/model/layers.0/attn/{q,k,v}_proj -> /model/layers.0/attn/q_k_v_proj (one path: itself)."""
    if len(paths) == 1:
        return paths[0]
    head = paths[0].rsplit("/", 1)[0]
    return f"{head}/" + "_".join(p.rsplit("/", 1)[1].removesuffix("_proj") for p in paths) + "_proj"


def matmul_nbits(g: GraphBuilder, x: str, q: QuantizedWeight, path: str, accuracy_level: int) -> str:
    """x [.., K] -> com.microsoft MatMulNBits(B [N, k_blocks, blob], scales) -> [.., N] (symmetric part only)."""
    g.opsets.setdefault("com.microsoft", 1)
    ins = [x, g.weight(f"{path}.weight_q{q.bits}", q.data), g.weight(f"{path}.scales", q.scales)]
    return g.op("MatMulNBits", ins, path, domain="com.microsoft", K=q.k, N=q.n, bits=q.bits,
                block_size=q.block_size, accuracy_level=accuracy_level)


def _block_indicator(k: int, block_size: int) -> np.ndarray:
    """[K, k_blocks] fp32, 1 where row k lies in block b: x @ it = per-block sums of x."""
    return (np.arange(k)[:, None] // block_size == np.arange(-(-k // block_size))[None, :]).astype(np.float32)


def mlp(g: GraphBuilder, h: str, w: dict, i: int, proj) -> str:
    """down(silu(gate(h)) * up(h)); `proj(g, x, weights, paths)` emits projections of one input, fused
    where it can (linear_group, plain or with LoRA)."""
    path, p = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
    gate, up = proj(g, h, [w[f"{p}.gate_proj.weight"], w[f"{p}.up_proj.weight"]],
                    [f"{path}/gate_proj", f"{path}/up_proj"])
    act = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{path}/act")], f"{path}/act")
    return proj(g, g.op("Mul", [act, up], f"{path}/act_up"), [w[f"{p}.down_proj.weight"]], [f"{path}/down_proj"])[0]


def decoder_layers(g: GraphBuilder, cfg: ModelConfig, w: dict, x: str, attention, proj) -> str:
    """The llama layer stack; `attention(h, i)` and `proj(g, x, weights, paths, i)` are the graph's own.

        x -> RMSNorm -> attention -> +x -> RMSNorm -> MLP(proj) -> +  (per layer)
    """
    for i in range(cfg.num_layers):
        h = rms_norm(g, x, w[f"model.layers.{i}.input_layernorm.weight"], cfg.rms_norm_eps,
                     f"/model/layers.{i}/input_layernorm")
        x = g.op("Add", [x, attention(h, i)], f"/model/layers.{i}/attn_residual")
        h = rms_norm(g, x, w[f"model.layers.{i}.post_attention_layernorm.weight"], cfg.rms_norm_eps,
                     f"/model/layers.{i}/post_attention_layernorm")
        x = g.op("Add", [x, mlp(g, h, w, i, lambda g_, x_, ws, paths, i=i: proj(g_, x_, ws, paths, i))],
                 f"/model/layers.{i}/mlp_residual")
    return x


def lm_head(g: GraphBuilder, x: str, weights, embed: str, quant=None) -> str:
    """x [N, H] -> logits [N, V] where QLinear does not run it (the portable graph; the engine graph's fp32
    builds and the splits `--keep` holds back): MatMulNBits (+ the block-offset term) on the [V, H] weight when
    the plan quantizes it, else Gemm(transB) on it, so a tied embedding is stored once. The engine graph's
    quantized head is a QLinear (graph_engine.head)."""
    q_head = quant.quantize("lm_head.weight", weights.lm_head()) if quant is not None else None
    if q_head is not None:
        y = matmul_nbits(g, x, q_head, "/lm_head", quant.accuracy_level)
        return offset_term(g, x, Projection(y, *_offsets(g, q_head, "/lm_head")))
    cfg = weights.config
    head = embed if cfg.tie_word_embeddings else g.weight("lm_head.weight", weights.tensors["lm_head.weight"])
    return g.op("Gemm", [x, head], "/lm_head", transB=1)
