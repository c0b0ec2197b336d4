"""Graph blocks shared by the portable and the engine graph (any activation rank: [B, S, H] or [T, H])."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from .onnx_builder import GraphBuilder
from .quantize import QuantizedWeight, hf_name
from .weights import ModelConfig, norm_names


def rope_inv_freq(cfg: ModelConfig, layer_type: str = "full") -> np.ndarray:
    """[D/2] fp32 RoPE frequencies of a layer type, as transformers computes them: the full layers' base and
    scaling (linear, llama3, or a GGUF's per-frequency divisors), or the sliding layers' own unscaled base."""
    d = cfg.head_dim
    local = layer_type == "sliding" and cfg.rope_local_theta is not None
    base = cfg.rope_local_theta if local else cfg.rope_theta
    inv = (1.0 / (base ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))).astype(np.float32)
    r = None if local else cfg.rope_scaling
    kind = (r or {}).get("type")
    if kind == "linear":
        inv = (inv / np.float32(r["factor"])).astype(np.float32)
    elif kind == "factors":
        inv = (inv / np.asarray(r["factors"], np.float32)).astype(np.float32)
    elif kind == "llama3":      # transformers' _compute_llama3_parameters, in fp32
        factor, lo, hi, old = (np.float32(r[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                          "original_max_position_embeddings"))
        wavelen = (np.float32(2 * np.pi) / inv).astype(np.float32)
        scaled = np.where(wavelen > old / lo, inv / factor, inv).astype(np.float32)
        smooth = ((old / wavelen - lo) / (hi - lo)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    elif kind == "yarn":
        inv = yarn_inv_freq(cfg.rope_theta, d, r)
    return inv


def yarn_inv_freq(base: float, d: int, r: dict) -> np.ndarray:
    """[D/2] fp32 YaRN frequencies, as transformers' _compute_yarn_parameters: each frequency between its
    interpolated (/ factor) and its original value by a linear ramp over the dimensions whose rotations within
    original_max_position_embeddings lie between beta_slow and beta_fast (the bounds floored/ceiled with truncate)."""
    factor, old = float(r["factor"]), float(r["original_max_position_embeddings"])

    def dim_of(rotations: float) -> float:
        return (d * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = dim_of(float(r["beta_fast"])), dim_of(float(r["beta_slow"]))
    if r.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    pos = (np.float32(base) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))).astype(np.float32)
    extra, inter = (np.float32(1) / pos).astype(np.float32), (np.float32(1) / (np.float32(factor) * pos))
    ramp = np.clip((np.arange(d // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (np.float32(1) - ramp).astype(np.float32)         # 1: the original frequency (extrapolation)
    return (inter * (np.float32(1) - keep) + extra * keep).astype(np.float32)


def rope_attention_factor(cfg: ModelConfig, layer_type: str = "full") -> float:
    """The factor cos and sin are multiplied by (YaRN's attention scaling; 1 for the other RoPEs): q and k both carry
    it, so the attention logits scale by its square."""
    local = layer_type == "sliding" and cfg.rope_local_theta is not None
    r = None if local else cfg.rope_scaling
    return float(r["attention_factor"]) if (r or {}).get("type") == "yarn" else 1.0


def rope_tables(cfg: ModelConfig, layer_type: str = "full", max_pos: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin: [max_pos, D/2] (one angle per rotated pair) of a layer type, in fp32 as transformers computes
    them (times YaRN's attention factor, rope_attention_factor)."""
    n = max_pos or cfg.max_position_embeddings
    freqs = np.outer(np.arange(n, dtype=np.float32), rope_inv_freq(cfg, layer_type)).astype(np.float32)
    af = rope_attention_factor(cfg, layer_type)
    cos, sin = np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
    if af != 1.0:
        cos, sin = (cos * np.float32(af)).astype(np.float32), (sin * np.float32(af)).astype(np.float32)
    return cos, sin


def head_norm(g: GraphBuilder, x: str, weight: np.ndarray, eps: float, heads: int, path: str, rank: int = 2) -> str:
    """RMSNorm over each head of q or k (Qwen3, Gemma 3): x [.., n * D] (rank 2 or 3) -> [.., n, D] -> RMSNorm(w [D])
    -> [.., n * D] (constant shapes: the ops after it keep their inferred shapes)."""
    d, keep = weight.shape[0], [0] * (rank - 1)
    split = g.op("Reshape", [x, g.const(keep + [heads, d])], path)
    return g.op("Reshape", [rms_norm(g, split, weight, eps, path), g.const(keep + [heads * d])], path)


def qk_norms(g: GraphBuilder, cfg: ModelConfig, q: str, k: str, w: dict, p: str, path: str, rank: int = 2
             ) -> tuple[str, str]:
    """q, k after the family's q/k norms (ModelConfig.qk_norm): RMSNorm over each head (head_norm), or over the whole
    projection at once (qk_norm_whole, OLMoE: q_norm.weight [Hq * D], k_norm.weight [Hkv * D]); unchanged without."""
    if not cfg.qk_norm:
        return q, k
    out = []
    for y, name, heads in ((q, "q_norm", cfg.num_heads), (k, "k_norm", cfg.num_kv_heads)):
        weight, eps = w[f"{p}.{name}.weight"], cfg.rms_norm_eps
        out.append(rms_norm(g, y, weight, eps, f"{path}/{name}") if cfg.qk_norm_whole else
                   head_norm(g, y, weight, eps, heads, f"{path}/{name}", rank))
    return out[0], out[1]


def add_bias(g: GraphBuilder, y: str, w: dict, name: str, path: str) -> str:
    """y + b where the weights have the bias `name` (q/k/v biases, Qwen2), else y."""
    return g.op("Add", [y, g.weight(name, w[name])], f"{path}/bias") if name in w else y


def activation(g: GraphBuilder, x: str, kind: str, path: str) -> str:
    """The MLP gate's activation (ModelConfig.hidden_act): SiLU x * sigmoid(x), or GELU with the tanh
    approximation 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) as torch's gelu(approximate="tanh")."""
    if kind == "silu":
        return g.op("Mul", [x, g.op("Sigmoid", [x], path)], path)
    cube = g.op("Mul", [g.op("Mul", [x, x], path), x], path)
    inner = g.op("Add", [x, g.op("Mul", [cube, g.const(0.044715, np.float32)], path)], path)
    t = g.op("Tanh", [g.op("Mul", [inner, g.const(np.sqrt(2 / np.pi), np.float32)], path)], path)
    half_x = g.op("Mul", [x, g.const(0.5, np.float32)], path)
    return g.op("Mul", [half_x, g.op("Add", [t, g.const(1.0, np.float32)], path)], path)


def scale_embedding(g: GraphBuilder, x: str, cfg: ModelConfig) -> str:
    """Embeddings times ModelConfig.embedding_scale (Gemma: sqrt(hidden)), where it is not 1."""
    if cfg.embedding_scale == 1.0:
        return x
    return g.op("Mul", [x, g.const(cfg.embedding_scale, np.float32)], "/model/embed_scale")


def scale_residual(g: GraphBuilder, y: str, cfg: ModelConfig, path: str) -> str:
    """A block's output times ModelConfig.residual_multiplier (Granite) before its residual add, where it is not 1."""
    if cfg.residual_multiplier == 1.0:
        return y
    return g.op("Mul", [y, g.const(cfg.residual_multiplier, np.float32)], f"{path}/residual_scale")


def softcap(g: GraphBuilder, logits: str, cfg: ModelConfig) -> str:
    """The final logits' maps, both monotonic (the argmax stays): / ModelConfig.logits_scaling (Granite), then
    c * tanh(logits / c) where the family caps them."""
    if cfg.logits_scaling != 1.0:
        logits = g.op("Div", [logits, g.const(cfg.logits_scaling, np.float32)], "/lm_head/logits_scaling")
    c = cfg.final_logit_softcap
    if c is None:
        return logits
    t = g.op("Tanh", [g.op("Div", [logits, g.const(c, np.float32)], "/lm_head/softcap")], "/lm_head/softcap")
    return g.op("Mul", [t, g.const(c, np.float32)], "/lm_head/softcap")


def out_norm(g: GraphBuilder, cfg: ModelConfig, w: dict, y: str, i: int, role: str) -> str:
    """The norm on a block's output before the residual add (role attn_out | mlp_out; Gemma), where there is one."""
    name = norm_names(cfg)[role]
    if name is None:
        return y
    return rms_norm(g, y, w[f"model.layers.{i}.{name}.weight"], cfg.rms_norm_eps, f"/model/layers.{i}/{name}")


def in_norm(cfg: ModelConfig, w: dict, i: int, role: str) -> tuple[np.ndarray, float, str]:
    """(weight, eps, path) of a block's input norm (role attn_in | mlp_in)."""
    name = norm_names(cfg)[role]
    return w[f"model.layers.{i}.{name}.weight"], cfg.rms_norm_eps, f"/model/layers.{i}/{name}"


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


def mlp(g: GraphBuilder, h: str, w: dict, i: int, proj, act: str = "silu") -> str:
    """down(act(gate(h)) * up(h)); `proj(g, x, weights, paths)` emits projections of one input, fused
    where it can (linear_group, plain or with LoRA)."""
    path, p = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
    gate, up = proj(g, h, [w[f"{p}.gate_proj.weight"], w[f"{p}.up_proj.weight"]],
                    [f"{path}/gate_proj", f"{path}/up_proj"])
    act = activation(g, gate, act, f"{path}/act")
    return proj(g, g.op("Mul", [act, up], f"{path}/act_up"), [w[f"{p}.down_proj.weight"]], [f"{path}/down_proj"])[0]


def decoder_layers(g: GraphBuilder, cfg: ModelConfig, w: dict, x: str, attention, proj) -> str:
    """The layer stack; `attention(h, i)` and `proj(g, x, weights, paths, i)` are the graph's own.

        x -> RMSNorm -> attention [-> RMSNorm] [* m] -> +x -> RMSNorm -> MLP(proj) [-> RMSNorm] [* m] -> +
                                  (per layer; [Gemma's output norms], [Granite's residual_multiplier m])
    """
    for i in range(cfg.num_layers):
        h = rms_norm(g, x, *in_norm(cfg, w, i, "attn_in"))
        a = scale_residual(g, out_norm(g, cfg, w, attention(h, i), i, "attn_out"), cfg, f"/model/layers.{i}/attn")
        x = g.op("Add", [x, a], f"/model/layers.{i}/attn_residual")
        h = rms_norm(g, x, *in_norm(cfg, w, i, "mlp_in"))
        m = mlp(g, h, w, i, lambda g_, x_, ws, paths, i=i: proj(g_, x_, ws, paths, i), cfg.hidden_act)
        m = scale_residual(g, out_norm(g, cfg, w, m, i, "mlp_out"), cfg, f"/model/layers.{i}/mlp")
        x = g.op("Add", [x, m], f"/model/layers.{i}/mlp_residual")
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
