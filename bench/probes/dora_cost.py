"""What DoRA rows cost QLinear: one call at SmolLM2's shapes (q|k|v 576 -> 960, gate|up 576 -> 3072 with SwiGLU),
16 decode rows over 4 adapters of rank 16, the same adapters as plain LoRA and as DoRA, alternating, medians.

    .venv/bin/python bench/probes/dora_cost.py [--rounds 7] [--calls 400] [--threads 2]

Prints, per shape, microseconds per call for: LoRA rows without the DoRA inputs, LoRA rows with them bound (the flag
read only), and DoRA rows (the scales applied in the epilogue). Dev tooling.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ortllm.bench.op_graphs import qlinear_model, session
from ortllm.bench.qlinear import lora_stack_feeds
from ortllm.pipeline.qlinear_pack import pack
from ortllm.pipeline.quantize import RTNQuantizer
from ortllm.runtime.ops_library import ops_isa

ROWS, SLOTS, RANK = 16, 4, 16


def lora_stacks(rng, k: int, widths: list[int]) -> dict[str, np.ndarray]:
    """QLinear's LoRA inputs: every row on one of SLOTS adapters of rank RANK (bench/qlinear.py)."""
    return {"token_adapter": rng.integers(0, SLOTS, ROWS).astype(np.int32),
            "lora_scale": rng.uniform(0.5, 2.0, SLOTS).astype(np.float32),
            **lora_stack_feeds(rng, k, widths, SLOTS, RANK)}


def case(k, widths, epilogue, threads):
    rng = np.random.default_rng(0)
    w = pack(RTNQuantizer(4, 32, False).quantize(rng.standard_normal((sum(widths), k), dtype=np.float32) * 0.05))
    x = rng.standard_normal((ROWS, k), dtype=np.float32)
    g = {f"dora_scale{j}": rng.uniform(0.9, 1.1, (SLOTS, wd)).astype(np.float32) for j, wd in enumerate(widths)}
    feeds = {"x": x, "codes": w.codes, "scales": w.scales, "offsets": w.offsets, **lora_stacks(rng, k, widths)}
    forms = {"lora": feeds, "lora+flags": feeds | {"dora": np.zeros(SLOTS, np.int32)} | g,
             "dora": feeds | {"dora": np.ones(SLOTS, np.int32)} | g}
    attrs = dict(K=w.k, N=w.n, bits=w.bits, block_size=w.block_size, epilogue=epilogue, packed_a=1, norm_eps=1e-5,
                 lora_layer=-1)
    return {name: (session(qlinear_model(sorted(f), **attrs), threads), f) for name, f in forms.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(f"isa {ops_isa()}, {a.threads} threads, 16 rows, 4 adapters of rank 16, int4 block 32")
    for label, k, widths, epi in (("q|k|v 576->960", 576, [576, 192, 192], "none"),
                                  ("gate|up 576->3072 swiglu", 576, [1536, 1536], "swiglu")):
        forms = case(k, widths, epi, a.threads)
        times = {n: [] for n in forms}
        for _ in range(a.rounds):
            for name, (s, f) in forms.items():
                s.run(None, f)
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    s.run(None, f)
                times[name].append((time.perf_counter() - t0) / a.calls * 1e6)
        base = statistics.median(times["lora"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{label:26s} {name:11s} {med:7.1f} us (min {min(ts):.1f}, max {max(ts):.1f})  "
                  f"{(med / base - 1) * 100:+5.1f}%")


if __name__ == "__main__":
    main()
