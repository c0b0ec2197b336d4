"""What the engine's cap on distinct adapters a step costs on a saturated Zipf trace: the lora-trace scenario's
replay (bench/lora_trace.py run_trace: gamma arrivals at 16 requests/s, Zipf s = 1 over N adapters, on the
adapters and on the base model) with each cap in turn, round by round in one run.

    .venv/bin/python bench/probes/adapter_cap.py ARTIFACT [--adapters 16] [--rounds 3] [--requests 64]
        [--threads 2] [--caps 4/8,8/16,16/16]

A cap is max_adapters_per_batch/max_slots. Prints each round's LoRA and base throughput and the overhead, then per
cap the median overheads (base / LoRA throughput - 1; LoRA / base p99 latency - 1). Dev tooling; the figures and
what they decided are in docs/notes/adapters.md ("The Zipf trace against llama.cpp ...").
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ortllm.bench.lora_trace import BASE_SYSTEM, LORA_VS_BASE, SATURATED_RATE, run_trace


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench/probes/adapter_cap.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--adapters", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--caps", default="4/8,8/16,16/16", help="max_adapters_per_batch/max_slots, comma-separated")
    args = ap.parse_args()
    caps = [tuple(int(v) for v in c.split("/")) for c in args.caps.split(",")]
    overheads: dict[tuple, list[tuple[float, float]]] = {c: [] for c in caps}
    for r in range(args.rounds):
        for c in caps:
            rows = run_trace(args.artifact, args.adapters, requests=args.requests, rate=SATURATED_RATE,
                             threads=args.threads, engine_overrides={"max_adapters_per_batch": c[0], "max_slots": c[1]})
            got = {(row["system"], row["metric"]): row["median"] for row in rows}
            tp, p99 = got[(LORA_VS_BASE, "throughput_overhead_pct")], got[(LORA_VS_BASE, "latency_p99_overhead_pct")]
            overheads[c].append((tp, p99))
            print(f"round {r} cap {c[0]}/{c[1]}: LoRA {got[('ortllm', 'throughput')]:.1f} base "
                  f"{got[(BASE_SYSTEM, 'throughput')]:.1f} tok/s ({tp:+.1f}%), p99 {p99:+.1f}%", flush=True)
    for c, v in overheads.items():
        print(f"cap {c[0]}/{c[1]}: throughput overhead median {np.median([t for t, _ in v]):.1f}% "
              f"{[round(t, 1) for t, _ in v]}; p99 latency overhead median {np.median([p for _, p in v]):.1f}%")


if __name__ == "__main__":
    main()
