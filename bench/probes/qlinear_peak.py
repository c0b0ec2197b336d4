"""QLinear on many tokens (a prefill chunk, a batched decode step): its int8 multiply-adds per second on each
kernel path this CPU offers, and their share of the path's int8 peak.

    .venv/bin/python bench/probes/qlinear_peak.py [--tokens 512] [--shapes 2048x2560,2048x11264,5632x2048]
                                                 [--threads 1,2] [--paths avx2,...] [--ghz 2.5]
                                                 [--bits 4|8] [--block 32|64|128|256]

Each shape KxN is one projection (TinyLlama's q|k|v, gate|up and down by default), int4 with offsets or --bits 8
without, in blocks of --block (one float step per block and output; default 32), in the engine's layout
(bench/qlinear.py qlinear_runner), run on T tokens; a multiply-add is one weight times one activation code, T * K * N
a call. The paths run alternating, each session on its own path in this one process
(ops_library.sessions_on), medians of --runs calls after a warm-up; the figure is the call's wall time, so run it on
an idle machine. Peak = cores x GHz x int8 MACs per cycle per core: avx2 64 (two 256-bit vpmaddubsw a cycle, 32
products each), avx512vnni 128 (two 512-bit vpdpbusd a cycle on a server core with two FMA units; 64 with one),
amx 1,024 (one 16 x 16 x 64 tile multiply every 16 cycles); the scalar path has none. GHz: --ghz, else the
"cpu MHz" /proc/cpuinfo reports (the nominal clock; a core that boosts above it makes the share look higher).
Dev tooling.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from ortllm.bench import qlinear
from ortllm.runtime.ops_library import ops_isas, sessions_on

MACS_PER_CYCLE = {"avx2": 64, "avx512vnni": 128, "amx": 1024}


def cpu_ghz() -> float | None:
    """The first "cpu MHz" line of /proc/cpuinfo, in GHz (None where there is none)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":", 1)[1]) / 1000
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--shapes", default="2048x2560,2048x11264,5632x2048", help="KxN,... (input x output width)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--paths", default=None, help="comma-separated kernel paths (default: every one offered)")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--block", type=int, default=qlinear.BLOCK, help="elements of K per block (a float step each)")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4, help="weight bits (4 with offsets, 8 without)")
    p.add_argument("--ghz", type=float, default=None, help="the clock for the peak (default: /proc/cpuinfo)")
    a = p.parse_args(argv)
    paths = a.paths.split(",") if a.paths else list(ops_isas())
    ghz = a.ghz or cpu_ghz()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    print(f"T = {a.tokens}, int{a.bits} b{a.block}, paths {', '.join(paths)}, clock {ghz} GHz")
    for threads in (int(t) for t in a.threads.split(",")):
        for k, n in shapes:
            runners = {}
            for path in paths:
                with sessions_on(path):   # the same weights (same seed) on every path
                    runners[path] = qlinear.qlinear_runner(np.random.default_rng(0), a.tokens, k, n, threads,
                                                           stream_bytes=k * n, block=a.block, bits=a.bits)
            for runner, _ in runners.values():
                runner.run()
            times = {path: [] for path in paths}
            for _ in range(a.runs):
                for path, (runner, copies) in runners.items():
                    t = time.perf_counter()
                    runner.run()
                    times[path].append((time.perf_counter() - t) / copies)
            cells = []
            for path in paths:
                rate = a.tokens * k * n / statistics.median(times[path])
                peak = threads * ghz * 1e9 * MACS_PER_CYCLE[path] if ghz and path in MACS_PER_CYCLE else None
                share = f" = {100 * rate / peak:.0f}% of {peak / 1e12:.2f} T" if peak else ""
                cells.append(f"{path} {rate / 1e9:.1f} G MAC/s{share}")
            print(f"{threads} thread(s) {k}x{n}: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
