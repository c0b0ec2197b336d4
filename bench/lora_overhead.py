"""lora-overhead scenario: the cost of adapters in mixed batches (docs/architecture.md, Benchmarks).

16 concurrent sequences decoding, all base vs spread over 1, 2, 4 distinct adapters of rank 8, 16 or 32 (LoRA on
q, k, v, o), measured two ways:
  - end to end: each configuration's batch of requests runs right after a base batch; decode tokens/s and the
    ratio to that neighbour. Runs last seconds, and on a shared VM throughput drifts by tens of percent
    over seconds, so a handful of pairs cannot resolve a few percent;
  - paired steps (bench/paired_steps.py): the same decode step (16 sequences at context 128) run with all tokens on
    the base and with the adapters, alternating step by step; step throughput ratio = base time / LoRA time.
Adapters are synthetic (bench/synthetic_adapters.py), written into a copy of the artifact.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ortllm.runtime.engine import Engine

from .engine import PLAIN, decode_run
from .paired_steps import paired_steps
from .results import row
from .synthetic_adapters import with_adapters


def run_overhead(artifact: Path, ranks=(8, 16, 32), counts=(1, 2, 4), batch: int = 16, repeats: int = 3,
                 threads: int | None = None, step_pairs: int = 100) -> list[dict]:
    """End to end: each configuration (rank r, n distinct adapters) runs right after a base run of the same
    batch, and its ratio is taken to that neighbour. Then `step_pairs` paired steps per configuration."""
    rng = np.random.default_rng(0)
    overrides = {"threads": threads} if threads else {}
    configs = [(r, n) for r in ranks for n in counts]
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-bench-") as tmp:
        art, names = with_adapters(Path(artifact), Path(tmp), [r for r in ranks for _ in range(max(counts))])
        by_rank = {r: names[k * max(counts):(k + 1) * max(counts)] for k, r in enumerate(ranks)}
        with Engine.from_artifact(art, max_num_seqs=batch, max_adapters_per_batch=max(counts),
                                  enable_prefix_cache=False, **PLAIN, **overrides) as engine:
            decode_run(engine, batch, rng, new_tokens=8)                      # warm-up
            base: list[float] = []
            tps: dict[tuple, list[float]] = {c: [] for c in configs}
            ratio: dict[tuple, list[float]] = {c: [] for c in configs}
            for _ in range(repeats):                                         # base, (8, 1), base, (8, 2), ...
                for r, n in configs:
                    b = decode_run(engine, batch, rng, new_tokens=64)[0]
                    x = decode_run(engine, batch, rng, by_rank[r][:n], new_tokens=64)[0]
                    base.append(b)
                    tps[(r, n)].append(x)
                    ratio[(r, n)].append(x / b)
            steps = {c: paired_steps(engine, by_rank[c[0]][:c[1]], batch, pairs=step_pairs) for c in configs}
    rows = [row("lora-overhead", "ortllm", batch, "decode_tokens_per_s (base)", base, "tok/s")]
    for (r, n) in configs:
        name = f"{n} adapters rank {r}"
        b, x = steps[(r, n)]
        rows.append(row("lora-overhead", "ortllm", batch, f"decode_tokens_per_s ({name})", tps[(r, n)], "tok/s"))
        rows.append(row("lora-overhead", "ortllm", batch, f"throughput_vs_base ({name})", ratio[(r, n)], "ratio"))
        rows.append(row("lora-overhead", "ortllm", batch, f"step_ms (base, paired with {name})", (b * 1e3).tolist(),
                        "ms"))
        rows.append(row("lora-overhead", "ortllm", batch, f"step_ms ({name})", (x * 1e3).tolist(), "ms"))
        q25, q75 = np.percentile(b / x, [25, 75])
        rows.append(row("lora-overhead", "ortllm", batch, f"step_throughput_vs_base ({name})", (b / x).tolist(),
                        "ratio", p25=float(q25), p75=float(q75)))
    return rows
