"""The portable graph: stock ONNX ops with a plain KV cache (runtime/contract.py, "portable").

Any ONNX Runtime client runs it without ortllm's ops library. One small function per block; node names
are paths (`/model/layers.3/attn/q_proj/MatMul`). Shapes: B batch, S new tokens, P past, T = P + S,
H hidden, Hq/Hkv query/kv heads, D head_dim, R = Hq / Hkv.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ortllm.runtime import contract as C

from .graph_blocks import (add_bias, decoder_layers, linear, linear_group, lm_head, qk_norms, rms_norm, rope_tables,
                           scale_embedding, softcap)
from .onnx_builder import GraphBuilder
from .weights import ModelConfig, ModelWeights

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def rotary(g: GraphBuilder, x: str, cos: str, sin: str, half: int, path: str) -> str:
    """x * cos + rotate_half(x) * sin; x [B, heads, S, D], cos/sin [B, 1, S, D].

        x -> Split(D/2, D/2) -> x1, x2 -> Concat(-x2, x1) -> * sin
        x --------------------------------------------------> * cos -> Add
    """
    x1, x2 = g.op("Split", [x, g.const([half, half])], path, n_out=2, axis=-1)
    rot = g.op("Concat", [g.op("Neg", [x2], path), x1], path, axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos], path), g.op("Mul", [rot, sin], path)], path)


def heads(g: GraphBuilder, x: str, n: int, d: int, path: str) -> str:
    """[B, S, n*D] -> [B, n, S, D]"""
    return g.op("Transpose", [g.op("Reshape", [x, g.const([0, 0, n, d])], path)], path, perm=[0, 2, 1, 3])


def attention(g: GraphBuilder, cfg: ModelConfig, h: str, w: dict, i: int, rope: dict, bias: dict,
              quant=None) -> str:
    """Causal GQA attention with a plain KV cache; returns [B, S, H] and adds present.i.* outputs. rope and bias:
    the layer types' (cos, sin) and additive masks (a sliding layer's sees only its window).

        h -> q|k|v_proj (one matmul, Split) [+ biases]:
        q [-> q/k RMSNorm]  -> heads -> rope -> *scale -> Reshape [B, Hkv, R, S, D] --+
        k [-> q/k RMSNorm]  -> heads -> rope -> Concat(past) -> present.k [B,Hkv,T,D] --> MatMul(k^T) + bias
        v -> heads ---------> Concat(past) -> present.v ---------------> Softmax -> MatMul(v) -> o_proj
    K/V are broadcast over R inside MatMul (no repeated copy of the cache).
    """
    path = f"/model/layers.{i}/attn"
    p = f"model.layers.{i}.self_attn"
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    targets = ("q_proj", "k_proj", "v_proj")
    q, k, v = (add_bias(g, y, w, f"{p}.{t}.bias", f"{path}/{t}") for y, t in zip(
        linear_group(g, h, [w[f"{p}.{t}.weight"] for t in targets], [f"{path}/{t}" for t in targets], quant), targets))
    q, k = qk_norms(g, cfg, q, k, w, p, path, rank=3)
    cos, sin = rope[cfg.layer_types[i]]
    bias = bias[cfg.layer_types[i]]
    q = rotary(g, heads(g, q, hq, d, f"{path}/q"), cos, sin, d // 2, f"{path}/q_rope")
    k = rotary(g, heads(g, k, hkv, d, f"{path}/k"), cos, sin, d // 2, f"{path}/k_rope")
    v = heads(g, v, hkv, d, f"{path}/v")

    kv_shape = ["batch", hkv, "total", d]
    past_k = g.input(C.past_key(i), F32, ["batch", hkv, "past", d])
    past_v = g.input(C.past_value(i), F32, ["batch", hkv, "past", d])
    k_all = g.op("Concat", [past_k, k], f"{path}/k_cache", axis=2)
    v_all = g.op("Concat", [past_v, v], f"{path}/v_cache", axis=2)
    g.identity(k_all, g.output(C.present_key(i), F32, kv_shape), f"{path}/present_k")
    g.identity(v_all, g.output(C.present_value(i), F32, kv_shape), f"{path}/present_v")

    q = g.op("Mul", [q, g.const(cfg.softmax_scale, np.float32)], f"{path}/scale")
    q5 = g.op("Reshape", [q, g.const([0, hkv, hq // hkv, -1, d])], f"{path}/q_groups")
    k5 = g.op("Unsqueeze", [k_all, g.const([2])], f"{path}/k_groups")
    v5 = g.op("Unsqueeze", [v_all, g.const([2])], f"{path}/v_groups")
    scores = g.op("MatMul", [q5, g.op("Transpose", [k5], f"{path}/k_t", perm=[0, 1, 2, 4, 3])], f"{path}/qk")
    probs = g.op("Softmax", [g.op("Add", [scores, bias], f"{path}/mask")], f"{path}/softmax", axis=-1)
    ctx = g.op("MatMul", [probs, v5], f"{path}/pv")                       # [B, Hkv, R, S, D]
    ctx = g.op("Reshape", [ctx, g.const([0, hq, -1, d])], f"{path}/merge")  # [B, Hq, S, D]
    ctx = g.op("Transpose", [ctx], f"{path}/merge", perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.const([0, 0, hq * d])], f"{path}/merge")
    return linear(g, ctx, w[f"{p}.o_proj.weight"], f"{path}/o_proj", quant)


def causal_bias(g: GraphBuilder, input_ids: str, mask: str, window: int | None = None) -> str:
    """Additive attention bias [B, 1, 1, S, T]: 0 where key j <= P + i and mask[b, j] == 1 (and, with a window W,
    j > P + i - W: the W keys up to the query's own), else fp32 min.

        Shape(mask)[1] = T, Shape(ids)[1] = S -> Range(T-S, T) rows, Range(0, T) cols
        -> cols <= rows [S, T] [-> And(cols > rows - W)] -> And(mask as bool [B,1,1,1,T]) -> Where(0, min)
    """
    path = "/model/attn_bias" if window is None else "/model/attn_bias_window"
    t = g.op("Gather", [g.op("Shape", [mask], path), g.const(1)], path, axis=0)
    s = g.op("Gather", [g.op("Shape", [input_ids], path), g.const(1)], path, axis=0)
    rows = g.op("Unsqueeze", [g.op("Range", [g.op("Sub", [t, s], path), t, g.const(1)], path), g.const([1])], path)
    cols = g.op("Unsqueeze", [g.op("Range", [g.const(0), t, g.const(1)], path), g.const([0])], path)
    causal = g.op("LessOrEqual", [cols, rows], path)                                        # [S, T]
    if window is not None:
        causal = g.op("And", [causal, g.op("Greater", [cols, g.op("Sub", [rows, g.const(window)], path)], path)],
                      path)
    pad = g.op("Cast", [g.op("Unsqueeze", [mask, g.const([1, 2, 3])], path)], path, to=TensorProto.BOOL)
    allowed = g.op("And", [causal, pad], path)                                              # [B,1,1,S,T]
    return g.op("Where", [allowed, g.const(0.0, np.float32), g.const(np.finfo(np.float32).min, np.float32)], path)


def build_portable_graph(weights: ModelWeights, model_path, data_path, metadata: dict | None = None,
                         quant=None) -> None:
    """Write the portable graph of `weights` to model_path (+ external data at data_path); quant: a
    pipeline.quantize.QuantPlan (None: fp32 projections)."""
    cfg, w = weights.config, weights.tensors
    g = GraphBuilder(data_path)
    ids = g.input(C.INPUT_IDS, I64, ["batch", "seq"])
    mask = g.input(C.ATTENTION_MASK, I64, ["batch", "total"])
    pos = g.input(C.POSITION_IDS, I64, ["batch", "seq"])
    logits_out = g.output(C.LOGITS, F32, ["batch", "seq", cfg.vocab_size])  # first output, then present.*

    rope, bias = {}, {}
    for kind in dict.fromkeys(cfg.layer_types):      # each layer type's RoPE and mask, once
        cos_t, sin_t = rope_tables(cfg, kind)
        cos_t, sin_t = np.concatenate([cos_t, cos_t], -1), np.concatenate([sin_t, sin_t], -1)  # rotate_half: [P, D]
        # cos/sin for the new tokens: Gather by position -> [B, S, D] -> [B, 1, S, D] (broadcast over heads)
        rope[kind] = tuple(g.op("Unsqueeze", [g.op("Gather", [g.weight(f"model.rope.{kind}.{f}", t), pos],
                                                   f"/model/rope/{kind}/{f}"), g.const([1])], f"/model/rope/{kind}/{f}")
                           for f, t in (("cos", cos_t), ("sin", sin_t)))
        bias[kind] = causal_bias(g, ids, mask, cfg.sliding_window if kind == "sliding" else None)

    embed = g.weight("model.embed_tokens.weight", w["model.embed_tokens.weight"])
    x = scale_embedding(g, g.op("Gather", [embed, ids], "/model/embed_tokens", axis=0), cfg)
    x = decoder_layers(g, cfg, w, x, lambda h, i: attention(g, cfg, h, w, i, rope, bias, quant),
                       lambda g_, x_, ws, paths, i: linear_group(g_, x_, ws, paths, quant))
    x = rms_norm(g, x, w["model.norm.weight"], cfg.rms_norm_eps, "/model/norm")

    # LM head on [B*S, H], back to [B, S, V]
    logits = lm_head(g, g.op("Reshape", [x, g.const([-1, cfg.hidden_size])], "/lm_head"), weights, embed, quant)
    logits = softcap(g, logits, cfg)
    out_shape = g.op("Concat", [g.op("Shape", [ids], "/lm_head"), g.const([cfg.vocab_size])], "/lm_head", axis=0)
    logits = g.op("Reshape", [logits, out_shape], "/lm_head")
    g.identity(logits, logits_out, "/lm_head/logits")
    g.save(model_path, "ortllm_portable", doc=f"ortllm portable graph ({cfg.arch})", metadata=metadata)
