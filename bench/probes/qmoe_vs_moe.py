"""One MoE layer: ortllm's MoE op against ONNX Runtime's own `com.microsoft.QMoE` CPU op on the same int4 weights,
and against a dense SwiGLU layer of the same active width.

    .venv/bin/python bench/probes/qmoe_vs_moe.py [--hidden 2048] [--inter 768] [--experts 128,32] [--top-k 8]
                                                [--tokens 1,4,16,64] [--threads 2] [--rounds 7]

The weights: E experts' gate, up [I, H] and down [H, I], seeded normal, quantized once to symmetric int4 in blocks
of 32 along K (pipeline/quantize.py RTNQuantizer: w = (code - 8) * scale), the one form both ops read exactly:
ortllm's engine layout (pipeline/qlinear_pack.py) and QMoE's raw [E, N, K/2] nibbles with [E, N, K/32] scales
(block_size 32, no zero points: 8). So both compute with the same dequantized weights; they differ in the
activations (ortllm: int8 codes per 32-block, exact integer sums; QMoE accuracy_level 0: fp32 activations, 4: int8)
and in the kernels. The router is outside the timing's difference: QMoE takes logits and does softmax, top-k and
the renormalisation itself; ortllm's op takes the top-k ids and weights (the graph's TopK and Softmax, timed here
with it as the engine runs them). Each system's output is checked against a float64 NumPy reference on the
dequantized weights (max error / max |reference|) before anything is timed.

Dense: the MoE op with one expert of width k x I (the engine's dense FFN runs the same QLinear calls, gate|up with
the SwiGLU epilogue then down): what the MoE layer's cost at B = 1 is judged against (bytes read are equal).
Qwen3-30B-A3B's layer by default (hidden 2048, expert FFN 768, 128 experts, top-8). Medians of --rounds, systems
alternating in each round, per-call wall time: run it on an idle machine. Dev tooling.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortllm.bench.op_graphs import moe_model, session
from ortllm.pipeline.qlinear_pack import pack, stack_experts
from ortllm.pipeline.quant_grid import QuantizedWeight
from ortllm.pipeline.quantize import RTNQuantizer

BLOCK = 32
QUANT = RTNQuantizer(4, BLOCK, True)


def quantized_experts(rng, E: int, H: int, I: int):  # noqa: E741 - the expert FFN width, as configs name it
    """Per expert: (gate, up, down) as QuantizedWeights, generated and quantized one matrix at a time (at 128
    experts the fp32 weights would be 2.4 GB)."""
    out = []
    for _ in range(E):
        g, u = (rng.standard_normal((I, H), dtype=np.float32) * 0.05 for _ in range(2))
        d = rng.standard_normal((H, I), dtype=np.float32) * 0.05
        out.append(tuple(_fp16_scales(QUANT.quantize(w)) for w in (g, u, d)))
    return out


def _fp16_scales(q: QuantizedWeight) -> QuantizedWeight:
    """The scales as the engine layout stores them (fp16), so every system reads the very same weights."""
    return replace(q, scales=q.scales.astype(np.float16).astype(np.float32))


def dequant(q) -> np.ndarray:
    return QUANT.dequantize(q).reshape(q.n, q.k).astype(np.float64)


def reference(x, ids, w, experts) -> np.ndarray:
    y = np.zeros((len(x), experts[0][2].n))
    for t, j in np.ndindex(ids.shape):
        g, u, d = (dequant(q) for q in experts[int(ids[t, j])])
        a, b = g @ x[t], u @ x[t]
        y[t] += w[t, j] * (d @ (a / (1 + np.exp(-a)) * b))
    return y


def qmoe_session(experts, H, I, k, threads, accuracy_level):  # noqa: E741
    """QMoE: fc1 = gate and up rows interleaved (g0, u0, g1, u1, ...: SwiGLU fused, alpha 1, beta 0: silu(gate) *
    up), fc2 = down; int4 raw nibbles, block scales. (This onnxruntime's CPU QMoE refuses the other forms: SiLU with
    fc3 = up, and [gate; up] not interleaved.)"""
    E = len(experts)

    def stack(parts: list[int], n: int, kk: int):
        def rows(e, field, width):                      # [n * len(parts), width], the parts' rows interleaved
            return np.stack([getattr(e[p], field).reshape(n, width) for p in parts], axis=1).reshape(-1, width)
        codes = np.stack([rows(e, "data", kk // 2) for e in experts])
        scales = np.stack([rows(e, "scales", kk // BLOCK) for e in experts])
        return codes, scales.astype(np.float32)                                    # low nibble first, as ours

    inits = []
    for name, parts, n, kk in (("fc1", [0, 1], I, H), ("fc2", [2], H, I)):
        codes, scales = stack(parts, n, kk)
        inits += [onnx.numpy_helper.from_array(codes, f"{name}_w"), onnx.numpy_helper.from_array(scales, f"{name}_s")]
    node = helper.make_node(
        "QMoE", ["x", "logits", "fc1_w", "fc1_s", "", "fc2_w", "fc2_s"], ["y"], domain="com.microsoft", k=k,
        activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0,
        normalize_routing_weights=1, expert_weight_bits=4, block_size=BLOCK, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "qmoe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", H]),
                                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["T", E])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", H])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return session(m, threads=threads)


def ortllm_runner(experts, H, I, threads):  # noqa: E741
    """The MoE op on the engine layout; run(x, ids, w)."""
    gu = [pack(replace(g, n=g.n + u.n, data=np.concatenate([g.data, u.data]),
                       scales=np.concatenate([g.scales, u.scales]))) for g, u, _ in experts]     # [gate; up] rows
    dn = [pack(d) for _, _, d in experts]
    feeds = {}
    for name, parts in (("gate_up", gu), ("down", dn)):
        codes, scales, _ = stack_experts(parts)
        feeds |= {f"{name}_codes": codes, f"{name}_scales": scales}
    sess = session(moe_model(["x", "expert", "weight", *feeds], H=H, I=I, E=len(experts), bits=4, block_size=BLOCK),
                   threads=threads)
    return lambda x, ids, w: sess.run(None, {"x": x, "expert": ids, "weight": w, **feeds})[0]


def route(logits: np.ndarray, k: int):
    """softmax over all, top-k, renormalised = softmax over the top-k logits (QMoE's normalize_routing_weights)."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, ids, 1)
    w = np.exp(top - top.max(1, keepdims=True))
    return ids.astype(np.int64), (w / w.sum(1, keepdims=True)).astype(np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/probes/qmoe_vs_moe.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768, help="each expert's FFN width")
    ap.add_argument("--experts", default="128,32", help="expert counts, comma-separated")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", default="1,4,16,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5, help="calls a round, a system's figure their mean")
    args = ap.parse_args(argv)
    H, I, k = args.hidden, args.inter, args.top_k  # noqa: E741
    rng = np.random.default_rng(0)
    dense_q = [tuple(_fp16_scales(QUANT.quantize(rng.standard_normal(shape, dtype=np.float32) * 0.05))
                     for shape in ((k * I, H), (k * I, H), (H, k * I)))]
    dense = ortllm_runner(dense_q, H, k * I, args.threads)
    print(f"hidden {H}, expert FFN {I}, top-{k}, int4 sym b{BLOCK}, {args.threads} threads; ms a call, median of "
          f"{args.rounds} rounds")
    print("E | T | distinct experts | ortllm MoE | QMoE acc 0 | QMoE acc 4 | dense k x I | QMoE0/ortllm | "
          "QMoE4/ortllm | ortllm/dense | max err ortllm, QMoE0, QMoE4")
    for E in (int(e) for e in args.experts.split(",")):
        experts = quantized_experts(rng, E, H, I)
        systems = {"ortllm": ortllm_runner(experts, H, I, args.threads)}
        for level in (0, 4):
            s = qmoe_session(experts, H, I, k, args.threads, level)
            systems[f"qmoe{level}"] = lambda x, ids, w, logits, s=s: s.run(None, {"x": x, "logits": logits})[0]
        for T in (int(t) for t in args.tokens.split(",")):
            x = rng.standard_normal((T, H), dtype=np.float32)
            logits = rng.standard_normal((T, E), dtype=np.float32) * 2
            ids, w = route(logits, k)
            ref = reference(x, ids, w, experts)
            scale = np.abs(ref).max()
            calls = {"ortllm": lambda: systems["ortllm"](x, ids, w),
                     "qmoe0": lambda: systems["qmoe0"](x, ids, w, logits),
                     "qmoe4": lambda: systems["qmoe4"](x, ids, w, logits),
                     "dense": lambda: dense(x, np.zeros((T, 1), np.int64), np.ones((T, 1), np.float32))}
            err = {n: float(np.abs(calls[n]() - ref).max() / scale) for n in ("ortllm", "qmoe0", "qmoe4")}
            times = {n: [] for n in calls}
            for _ in range(args.rounds):
                for n, f in calls.items():
                    f()
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        f()
                    times[n].append((time.perf_counter() - t0) / args.calls * 1e3)
            ms = {n: statistics.median(v) for n, v in times.items()}
            print(f"{E} | {T} | {len(np.unique(ids))} | {ms['ortllm']:.3f} | {ms['qmoe0']:.3f} | {ms['qmoe4']:.3f} | "
                  f"{ms['dense']:.3f} | {ms['qmoe0'] / ms['ortllm']:.2f}x | {ms['qmoe4'] / ms['ortllm']:.2f}x | "
                  f"{ms['ortllm'] / ms['dense']:.2f}x | {err['ortllm']:.1e}, {err['qmoe0']:.1e}, {err['qmoe4']:.1e}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
