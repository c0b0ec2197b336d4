"""QLinear int4 at one token (a B = 1 decode projection): the weight stream's GB/s per shape and thread count, for
A/B runs of ops libraries (ORTLLM_OPS_LIBRARY=path) or prefetch hints (ORTLLM_OPS_PREFETCH=t0|nta).

    .venv/bin/python bench/probes/qlinear_gemv.py [--shapes 4096x6144,4096x28672,14336x4096] [--threads 1,2]

Each graph holds enough independent projections of x (bench/qlinear.py qlinear_runner: b32, scale + offset) to
stream ~160 MB of weights a run, so they come from memory as in a decode step. Prints, per thread count, the median of
11 runs per shape as GB/s of the bytes a projection reads (0.5 a weight of codes + 4/32 of fp16 scale and offset).
Compare with bench/probes/read_bandwidth.cc on the same machine. Default shapes: Llama 3.1 8B's q|k|v, gate|up, down.
Dev tooling.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ortllm.bench import qlinear
from ortllm.runtime.ops_library import ops_isa, ops_prefetch

BYTES_PER_WEIGHT = 0.5 + 4 / 32


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x6144,4096x28672,14336x4096", help="KxN,... (input x output width)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--runs", type=int, default=11)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    print(f"ops {ops_isa()}, prefetch {ops_prefetch()}")
    for threads in (int(t) for t in a.threads.split(",")):
        rates = []
        for k, n in shapes:
            runner, copies = qlinear.qlinear_runner(rng, 1, k, n, threads, stream_bytes=160 << 20)
            for _ in range(3):
                runner.run()
            times = []
            for _ in range(a.runs):
                t = time.perf_counter()
                runner.run()
                times.append(time.perf_counter() - t)
            rates.append(k * n * BYTES_PER_WEIGHT * copies / statistics.median(times) / 1e9)
        print(f"{threads} thread(s): " + ", ".join(f"{k}x{n} {r:.2f} GB/s" for (k, n), r in zip(shapes, rates)),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
