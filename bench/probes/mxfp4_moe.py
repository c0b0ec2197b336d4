"""One gpt-oss-20b-shaped MoE layer on the MoE op in three weight formats: mxfp4 (the 4-bit code into the 2 x e2m1
table, MXFP4 kept exact: 4.5 bits a weight), int8 on MXFP4's grid (today's exact form: 9 bits, d and m) and affine
int4 (the build's default re-quantization: 5 bits, d and m).

    .venv/bin/python bench/probes/mxfp4_moe.py [--hidden 2880] [--inter 2880] [--experts 32] [--top-k 4]
                                              [--tokens 1,16] [--threads 2] [--rounds 7] [--calls 5]

The weights are random MXFP4 experts made in the engine layout an expert at a time (codes any nibble, block exponents
2^-9..2^-5): mxfp4 packs them as they are; int8-exact holds the same values (the table's, as int8 codes, d the same
power of two, m 0), so the two must give the same bits, which is checked at every T before anything is timed; int4
reads the same nibbles as affine codes with a random fp16 m (other values, the same bytes a weight as the build's
int4). The routing: each token's top-k of --experts drawn at random, softmax weights. Medians over --rounds of the
mean of --calls calls, the formats alternating in each round; at B = 1 the bytes a call reads (top-k experts'
gate|up and down) over the time. Dev tooling: run it on an idle machine.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ortllm.bench.op_graphs import moe_model, session
from ortllm.pipeline.qlinear_pack import pack
from ortllm.pipeline.quant_grid import MXFP4, MXFP4_TABLE, QuantizedWeight, unpack_bits

BLOCK = 32
FORMATS = ("mxfp4", "int8-exact", "int4")


def expert_weights(rng, n: int, k: int) -> dict[str, QuantizedWeight]:
    """One projection [n, k] of one expert in the three formats (QuantizedWeight, MatMulNBits byte order)."""
    kb = k // BLOCK
    nibbles = rng.integers(0, 256, (n, kb, BLOCK // 2), dtype=np.uint8)
    scale = np.ldexp(np.float32(1), rng.integers(-9, -4, n * kb)).astype(np.float32)
    values = MXFP4_TABLE[unpack_bits(nibbles, 4)].astype(np.int16)              # [n, kb, 32] in -12..12
    return {"mxfp4": QuantizedWeight(n, k, 4, BLOCK, nibbles, scale, None, format=MXFP4),
            "int8-exact": QuantizedWeight(n, k, 8, BLOCK, (values + 128).astype(np.uint8), scale,
                                          np.zeros((n, kb), np.float16)),
            "int4": QuantizedWeight(n, k, 4, BLOCK, nibbles, scale,
                                    (rng.standard_normal((n, kb)) * 0.01).astype(np.float16))}


def layer(rng, E: int, H: int, I: int) -> dict[str, dict[str, np.ndarray]]:  # noqa: E741 - the expert FFN width
    """format -> the MoE op's stacked inputs (gate_up_*, down_*), filled an expert at a time (no fp32 copy)."""
    feeds: dict[str, dict[str, np.ndarray]] = {f: {} for f in FORMATS}
    for e in range(E):
        for name, (n, k) in (("gate_up", (2 * I, H)), ("down", (H, I))):
            for fmt, q in expert_weights(rng, n, k).items():
                p = pack(q)
                parts = {"codes": p.codes, "scales": p.scales, "offsets": p.offsets}
                for part, a in parts.items():
                    if a is None:
                        continue
                    key = f"{name}_{part}"
                    if key not in feeds[fmt]:
                        feeds[fmt][key] = np.empty((E, *a.shape), a.dtype)
                    feeds[fmt][key][e] = a
    return feeds


def runner(feeds: dict[str, np.ndarray], fmt: str, H: int, I: int, E: int, threads: int):  # noqa: E741
    attrs = {"weight_format": "mxfp4"} if fmt == "mxfp4" else {}
    sess = session(moe_model(["x", "expert", "weight", *feeds], H=H, I=I, E=E, bits=8 if fmt == "int8-exact" else 4,
                             block_size=BLOCK, **attrs), threads=threads)
    return lambda x, ids, w: sess.run(None, {"x": x, "expert": ids, "weight": w, **feeds})[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/probes/mxfp4_moe.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--inter", type=int, default=2880, help="each expert's FFN width")
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5, help="calls a round, a format's figure their mean")
    args = ap.parse_args(argv)
    H, I, E, k = args.hidden, args.inter, args.experts, args.top_k  # noqa: E741
    rng = np.random.default_rng(0)
    feeds = layer(rng, E, H, I)
    run = {f: runner(feeds[f], f, H, I, E, args.threads) for f in FORMATS}
    expert_bytes = {f: sum(a.nbytes for a in feeds[f].values()) // E for f in FORMATS}
    bits = {f: 8 * expert_bytes[f] / (3 * H * I) for f in FORMATS}
    print(f"hidden {H}, expert FFN {I}, {E} experts, top-{k}, blocks of {BLOCK}, {args.threads} threads; ms a call, "
          f"median of {args.rounds} rounds x {args.calls} calls; bits a weight: "
          + ", ".join(f"{f} {bits[f]:.2f}" for f in FORMATS))
    print("T | distinct experts | " + " | ".join(FORMATS) + " | int8-exact/mxfp4 | int4/mxfp4 | B=1 GB/s "
          + "/".join(FORMATS))
    for T in (int(t) for t in args.tokens.split(",")):
        x = rng.standard_normal((T, H), dtype=np.float32)
        ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int64)
        w = rng.random((T, k)).astype(np.float32)
        w /= w.sum(1, keepdims=True)
        outs = {f: run[f](x, ids, w) for f in FORMATS}
        if not np.array_equal(outs["mxfp4"], outs["int8-exact"]):
            raise SystemExit(f"T={T}: mxfp4 and int8-exact (the same values) differ: "
                             f"{np.abs(outs['mxfp4'] - outs['int8-exact']).max()}")
        times: dict[str, list[float]] = {f: [] for f in FORMATS}
        for r in range(args.rounds):
            for f in (FORMATS if r % 2 == 0 else FORMATS[::-1]):
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    run[f](x, ids, w)
                times[f].append((time.perf_counter() - t0) / args.calls * 1e3)
        ms = {f: statistics.median(v) for f, v in times.items()}
        distinct = len(np.unique(ids))
        gbs = "/".join(f"{distinct * expert_bytes[f] / (ms[f] * 1e-3) / 1e9:.1f}" for f in FORMATS) if T == 1 else "-"
        print(f"{T} | {distinct} | " + " | ".join(f"{ms[f]:.3f}" for f in FORMATS)
              + f" | {ms['int8-exact'] / ms['mxfp4']:.2f} | {ms['int4'] / ms['mxfp4']:.2f} | {gbs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
