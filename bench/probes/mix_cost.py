"""What adapter mixes cost QLinear alone: one call at TinyLlama's shapes (q|k|v 2048 -> 2560, o 2048 -> 2048 with the
residual epilogue), int4 block 32, 16 decode rows, 4 adapters of rank 16 on every segment; per round each form runs
`calls` times, the forms in turn (order reversed every other round), medians over rounds.

    .venv/bin/python bench/probes/mix_cost.py [--rounds 9] [--calls 200] [--threads 1]

Timed by the calling thread's CPU time (with --threads 1, the default, the whole call runs on it, so the waits of a
shared machine do not count; wall time with more threads). Forms: base (no adapter), every row on adapter a, on b,
on the mix a*0.7 + b*0.3; row i on adapter i % 4, and every row mixing 2 of the 4 (the 6 pairs in turn). Prints each
form's microseconds per call and LoRA overhead over the base (per round: form / base - 1), and per round the two
ratios lora-mix holds (overhead(a + b) / (overhead(a) + overhead(b)); overhead(2 of 4 mixed) / overhead(4 adapters))
with their min and max. The engine-step form of the same comparison is `ortllm bench ART --scenario lora-mix`.
Dev tooling.
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
PAIRS = [(i, j) for i in range(SLOTS) for j in range(i + 1, SLOTS)]


def stacks(rng, k: int, widths: list[int]) -> dict[str, np.ndarray]:
    return {"lora_scale": rng.uniform(0.5, 2.0, SLOTS).astype(np.float32),
            **lora_stack_feeds(rng, k, widths, SLOTS, RANK)}


def forms() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """token_adapter [16, M] and token_adapter_weight [16, M] of each form."""
    def rows(terms):   # terms(i) -> [(slot, weight), ...] of row i
        m = max(1, *(len(terms(i)) for i in range(ROWS)))
        ta = np.full((ROWS, m), -1, np.int32)
        wt = np.zeros((ROWS, m), np.float32)
        for i in range(ROWS):
            for k, (s, w) in enumerate(terms(i)):
                ta[i, k], wt[i, k] = s, w
        return ta, wt
    return {"base": rows(lambda i: []), "a": rows(lambda i: [(0, 1.0)]), "b": rows(lambda i: [(1, 1.0)]),
            "a*0.7+b*0.3": rows(lambda i: [(0, 0.7), (1, 0.3)]), "4 adapters": rows(lambda i: [(i % SLOTS, 1.0)]),
            "2 of 4 mixed": rows(lambda i: [(PAIRS[i % 6][0], 0.6), (PAIRS[i % 6][1], 0.4)])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    clock_name = "CPU" if a.threads == 1 else "wall"
    print(f"isa {ops_isa()}, {a.threads} threads ({clock_name} time), {ROWS} rows, {SLOTS} adapters of rank {RANK}, "
          "int4 block 32")
    for label, k, widths, epi in (("q|k|v 2048->2560", 2048, [2048, 256, 256], "none"),
                                  ("o 2048->2048 residual", 2048, [2048], "residual")):
        rng = np.random.default_rng(0)
        w = pack(RTNQuantizer(4, 32, False).quantize(rng.standard_normal((sum(widths), k), dtype=np.float32) * 0.05))
        feeds = {"x": rng.standard_normal((ROWS, k), dtype=np.float32), "codes": w.codes, "scales": w.scales,
                 "offsets": w.offsets, **stacks(rng, k, widths)}
        if epi == "residual":
            feeds["residual"] = rng.standard_normal((ROWS, w.n), dtype=np.float32)
        attrs = dict(K=w.k, N=w.n, bits=4, block_size=32, epilogue=epi, packed_a=1, norm_eps=1e-5, lora_layer=-1)
        names = sorted(feeds) + ["token_adapter", "token_adapter_weight"]
        s = session(qlinear_model(names, **attrs), a.threads)
        fs = forms()
        times: dict[str, list[float]] = {n: [] for n in fs}
        for r in range(a.rounds):
            for name in (list(fs) if r % 2 == 0 else list(reversed(fs))):
                f = feeds | {"token_adapter": fs[name][0], "token_adapter_weight": fs[name][1]}
                s.run(None, f)
                clock = time.thread_time if a.threads == 1 else time.perf_counter
                t0 = clock()
                for _ in range(a.calls):
                    s.run(None, f)
                times[name].append((clock() - t0) / a.calls * 1e6)
        base = np.asarray(times["base"])
        over = {n: np.asarray(t) / base - 1 for n, t in times.items()}
        for name, ts in times.items():
            o = over[name] * 100
            print(f"{label:22s} {name:13s} {statistics.median(ts):8.1f} us  overhead {np.median(o):+6.1f}% "
                  f"(min {o.min():+.1f}, max {o.max():+.1f})")
        mix = over["a*0.7+b*0.3"] / (over["a"] + over["b"])
        two = over["2 of 4 mixed"] / over["4 adapters"]
        print(f"{label:22s} mix / (a + b) median {np.median(mix):.2f} (min {mix.min():.2f}, max {mix.max():.2f}); "
              f"2 of 4 mixed / 4 adapters median {np.median(two):.2f} (min {two.min():.2f}, max {two.max():.2f})")


if __name__ == "__main__":
    main()
