"""QLinear against ORT's MatMulNBits (part of `ortllm bench --scenario ops`).

Per shape (SmolLM2 and TinyLlama projections) and T = 1, 16, 64, systems alternated round by round:
  - "MatMulNBits int4": com.microsoft MatMulNBits, block 32, accuracy_level 4, no zero points (its
    fastest path: symmetric int4, int8 compute);
  - "MatMulNBits int4 + MultiLoRA": the pre-QLinear engine pair for an asymmetric (Q4_1-grid) weight: the
    projection, then MultiLoRA carrying the block-offsets term (no adapter active);
  - "QLinear int4": ortllm's op on the same asymmetric weight (offsets fused);
  - at T = 16, "QLinear int4 + LoRA 4x r16": four adapters of rank 16 over the tokens.
Each graph holds `copies` independent projections of x (distinct weights, ~48 MB of int4 in all, so the
weights stream from memory as in a decode step rather than sitting in cache), concatenated into y;
figures are per projection.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ortllm.runtime.lora_stacks import quantize_a, quantize_b

from .op_graphs import F16, F32, I8, I32, U8, model, multi_lora_node, qlinear_node, value_info
from .timing import Runner, compare, ratio_row, us_row

SHAPES = {"smollm2": [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)],
          "tinyllama": [(2048, 2560), (2048, 11264), (5632, 2048)]}
BLOCK = 32
STREAM_BYTES = 48 << 20


def _copies(K: int, N: int, T: int, stream_bytes: int = STREAM_BYTES) -> int:
    per = K * N // 2
    return int(np.clip(stream_bytes // per, 2, 64 if T == 1 else 8))


def _raw(name, dtype, arr):
    return helper.make_tensor(name, dtype, arr.shape, arr.tobytes(), raw=True)


def _graph(nodes, inits, feeds, K, N_out, copies, domains):
    nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(copies)], ["y"], axis=1))
    types = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32, np.dtype(np.int8): I8}
    inputs = [value_info("x", F32, ["T", K])]
    inputs += [value_info(n, types[v.dtype], v.ndim) for n, v in feeds.items() if n != "x"]
    return model(nodes, inputs, [value_info("y", F32, ["T", copies * N_out])], inits, domains)


def nbits_runner(rng, T, K, N, threads, with_offsets: bool):
    kb, copies = K // BLOCK, _copies(K, N, T)
    feeds = {"x": rng.standard_normal((T, K), dtype=np.float32)}
    nodes, inits = [], []
    if with_offsets:
        feeds |= {"A": np.zeros((1, K, 1), np.float16), "B": np.zeros((1, 1, N), np.float16),
                  "scale": np.ones(1, np.float32), "rank": np.zeros(1, np.int32),
                  "token_adapter": np.full(T, -1, np.int32)}
    for i in range(copies):
        inits += [_raw(f"W{i}", U8, rng.integers(0, 256, (N, kb, BLOCK // 2), dtype=np.uint8)),
                  _raw(f"S{i}", F32, rng.random(N * kb, dtype=np.float32) * 0.02)]
        base = f"b{i}" if with_offsets else f"y{i}"
        nodes.append(helper.make_node("MatMulNBits", ["x", f"W{i}", f"S{i}"], [base], domain="com.microsoft",
                                      K=K, N=N, bits=4, block_size=BLOCK, accuracy_level=4))
        if with_offsets:
            inits.append(_raw(f"O{i}", F16, (rng.standard_normal((kb, N)) * 0.01).astype(np.float16)))
            nodes.append(multi_lora_node(["x", base, "A", "B", "scale", "rank", "token_adapter", f"O{i}"], [f"y{i}"],
                                         block_size=BLOCK))
    domains = ["com.microsoft"] + (["ortllm"] if with_offsets else [])
    return Runner(_graph(nodes, inits, feeds, K, N, copies, domains), feeds, threads), copies


def lora_stack_feeds(rng, k: int, widths: list[int], slots: int, rank: int,
                     a_std: float | None = None) -> dict[str, np.ndarray]:
    """QLinear's LoRA stacks for `slots` random adapters of rank `rank` on input width k, per output segment j of
    width widths[j]: A{j} [slots, k, rank] int8 (~ a_std, default 1 / sqrt(k)), A_scale{j} [slots, k / 32, rank],
    B{j} [slots, rank, widths[j]] int8 (~ 0.05), B_scale{j} [slots, widths[j]] (the runtime's writer's quantization,
    runtime/lora_stacks.py) and rank{j} [slots]. token_adapter and lora_scale are the caller's."""
    a_std = a_std if a_std is not None else 1 / np.sqrt(k)
    feeds = {}
    for j, width in enumerate(widths):
        packed = [(*quantize_a((rng.standard_normal((k, rank)) * a_std).astype(np.float32)),
                   *quantize_b((rng.standard_normal((rank, width)) * 0.05).astype(np.float32))) for _ in range(slots)]
        shapes = ((slots, k, rank), (slots, -(-k // 32), rank), (slots, rank, width), (slots, width))
        for i, (name, shape) in enumerate(zip(("A", "A_scale", "B", "B_scale"), shapes)):
            feeds[f"{name}{j}"] = np.stack([p[i] for p in packed]).reshape(shape)
        feeds[f"rank{j}"] = np.full(slots, rank, np.int32)
    return feeds


def qlinear_runner(rng, T, K, N, threads, adapters: int = 0, rank: int = 16, slots: int = 8,
                   stream_bytes: int = STREAM_BYTES, block: int = BLOCK, bits: int = 4):
    """QLinear on random weights of `bits` (4: with block offsets; 8: without, as Q8_0) in blocks of `block`."""
    kb, G, copies = K // block, -(-N // 8), _copies(K, N, T, stream_bytes)
    feeds = {"x": rng.standard_normal((T, K), dtype=np.float32)}
    extra = []
    if adapters:
        feeds |= {"token_adapter": (np.arange(T) % adapters).astype(np.int32),
                  "lora_scale": np.ones(slots, np.float32), **lora_stack_feeds(rng, K, [N], slots, rank, a_std=0.05)}
        extra = ["token_adapter", "lora_scale", "A0", "A_scale0", "B0", "B_scale0", "rank0"]
    nodes, inits = [], []
    for i in range(copies):
        inits += [_raw(f"C{i}", U8, rng.integers(0, 256, (G, kb, block * bits), dtype=np.uint8)),
                  _raw(f"D{i}", F16, (rng.random((G, kb, 8)) * 0.02).astype(np.float16))]
        offsets = ""
        if bits == 4:
            inits.append(_raw(f"M{i}", F16, (rng.standard_normal((G, kb, 8)) * 0.01).astype(np.float16)))
            offsets = f"M{i}"
        nodes.append(qlinear_node(["x", f"C{i}", f"D{i}", offsets, ""] + extra, [f"y{i}"], K=K, N=N, bits=bits,
                                  block_size=block, packed_a=1))
    return Runner(_graph(nodes, inits, feeds, K, N, copies, ["ortllm"]), feeds, threads), copies


def run(rows: list, rng, threads: int, rounds: int, target: float, log, quick: bool = False) -> None:
    """Appends the QLinear rows (latency per projection in us, speedups, the LoRA's added %) to `rows`."""
    shapes = [(m, k, n) for m, ks in SHAPES.items() for k, n in ks]
    if quick:
        shapes = [("smollm2", 576, 960), ("tinyllama", 2048, 2560)]
    for family, K, N in shapes:
        for T in (1, 16, 64):
            scen = f"ops/qlinear/{family}_{K}x{N}_T{T}"
            built = {"MatMulNBits int4": nbits_runner(rng, T, K, N, threads, False),
                     "MatMulNBits int4 + MultiLoRA": nbits_runner(rng, T, K, N, threads, True),
                     "QLinear int4": qlinear_runner(rng, T, K, N, threads)}
            if T == 16:
                built["QLinear int4 + LoRA 4x r16"] = qlinear_runner(rng, T, K, N, threads, adapters=4)
            samples = compare({n: r.run for n, (r, _) in built.items()}, rounds, target)
            samples = {n: [v / built[n][1] for v in vals] for n, vals in samples.items()}
            for name, vals in samples.items():
                rows.append(us_row(scen, name + " (per projection)", T, "latency", vals, "us"))
            q = samples["QLinear int4"]
            rows.append(ratio_row(scen, "QLinear vs MatMulNBits", T, "speedup", samples["MatMulNBits int4"], q))
            rows.append(ratio_row(scen, "QLinear vs MatMulNBits + MultiLoRA", T, "speedup",
                                  samples["MatMulNBits int4 + MultiLoRA"], q))
            msg = ", ".join(f"{n} {np.median(v) * 1e6:.1f}us" for n, v in samples.items())
            if T == 16:
                both = np.asarray(samples["QLinear int4 + LoRA 4x r16"])
                paired = (both - np.asarray(q)) / np.asarray(q) * 100
                over = (np.median(both) - np.median(q)) / np.median(q) * 100
                rows.append({"scenario": scen, "system": "LoRA 4x r16 added to QLinear int4", "batch": T,
                             "metric": "added_latency", "median": round(float(over), 2),
                             "min": round(float(paired.min()), 2), "max": round(float(paired.max()), 2), "unit": "%"})
                msg += f", LoRA adds {over:.1f}%"
            log(f"{scen}: {msg}")
