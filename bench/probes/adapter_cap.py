"""What the engine's cap on distinct adapters a step costs on a saturated Zipf trace: the lora-trace scenario's trace
(bench/lora.py make_trace: gamma arrivals at 16 requests/s, Zipf s = 1 over N adapters) replayed on the adapters
and on the base model, for each cap in turn, round by round in one run (an engine per cap, all loaded at the start).

    .venv/bin/python bench/probes/adapter_cap.py ARTIFACT [--adapters 16] [--rounds 3] [--requests 64]
        [--threads 2] [--caps 4/8,8/16,16/16]

A cap is max_adapters_per_batch/max_slots. Prints each round's LoRA and base throughput and p99 latency, then per
cap the median overhead (base / LoRA throughput - 1; LoRA / base p99 latency - 1). Dev tooling; the figures and
what they decided are in docs/adapters.md ("The Zipf trace").
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from ortllm.bench.lora import PLAIN, TRACE_SLOTS, _with_adapters, make_trace, replay_ortllm
from ortllm.runtime.engine import Engine


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
    ranks = [(8, 16, 32)[k % 3] for k in range(args.adapters)]
    res: dict[tuple, list[tuple]] = {c: [] for c in caps}
    with tempfile.TemporaryDirectory(prefix="ortllm-adapter-cap-") as tmp:
        art, names = _with_adapters(args.artifact, Path(tmp), ranks)
        engines = {c: Engine.from_artifact(art, max_num_seqs=TRACE_SLOTS, max_adapters_per_batch=c[0],
                                           max_slots=c[1], threads=args.threads, **PLAIN) for c in caps}
        try:
            trace = make_trace(args.adapters, args.requests, 16.0, engines[caps[0]].runner.vocab_size)
            for r in range(args.rounds):
                for c in caps:
                    x = replay_ortllm(engines[c], trace, names)
                    b = replay_ortllm(engines[c], trace, None)
                    res[c].append((x["throughput"], b["throughput"], x["latency_p99"], b["latency_p99"]))
                    print(f"round {r} cap {c[0]}/{c[1]}: LoRA {x['throughput']:.1f} base {b['throughput']:.1f} "
                          f"tok/s ({100 * (b['throughput'] / x['throughput'] - 1):+.1f}%), p99 "
                          f"{x['latency_p99']:.2f} vs {b['latency_p99']:.2f} s", flush=True)
        finally:
            for e in engines.values():
                e.close()
    for c, v in res.items():
        ov = [100 * (b / x - 1) for x, b, _, _ in v]
        p99 = [100 * (xp / bp - 1) for _, _, xp, bp in v]
        print(f"cap {c[0]}/{c[1]}: throughput overhead median {np.median(ov):.1f}% {[round(o, 1) for o in ov]}; "
              f"p99 latency overhead median {np.median(p99):.1f}%")


if __name__ == "__main__":
    main()
