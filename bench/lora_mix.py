"""lora-mix scenario: the cost of adapter mixes (SamplingParams(adapters={...})), by paired steps
(bench/paired_steps.py: 16 sequences at context 128, rank 16 on q, k, v, o): every row on adapter a, on b, on the
mix a*0.7 + b*0.3; request i on adapter i % 4, and every row mixing 2 of the 4 (the 6 pairs in turn). Rows: each
configuration's step overhead against its own interleaved base steps, per round (the configurations alternate, their
order reversed every other round), and per round the two ratios the mixes must keep:
overhead(a + b) / (overhead(a) + overhead(b)) <= 1, and overhead(2 of 4 mixed) / overhead(4 adapters) <= 2.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

from .engine import PLAIN
from .paired_steps import paired_steps
from .results import row
from .synthetic_adapters import with_adapters


def mix_configs(names: list[str]) -> dict[str, list]:
    """lora-mix's configurations over 4 adapters: each row's AdapterSpec, cycled over the batch."""
    def mix(*terms):
        return SamplingParams(adapters=dict(terms)).validate().adapter_mix
    a, b = names[:2]
    pairs = [(names[i], names[j]) for i in range(4) for j in range(i + 1, 4)]      # the 6 pairs of 4
    return {"adapter a": [a], "adapter b": [b], "mix a*0.7 + b*0.3": [mix((a, 0.7), (b, 0.3))],
            "4 adapters": names[:4], "2 of 4 mixed": [mix((x, 0.6), (y, 0.4)) for x, y in pairs]}


def run_mix(artifact: Path, rank: int = 16, batch: int = 16, rounds: int = 3, pairs: int = 100,
            threads: int | None = None) -> list[dict]:
    """The lora-mix scenario (module docstring): paired steps per configuration, `rounds` rounds alternating the
    configurations; the overhead of a round is the median over its pairs of LoRA step / base step - 1."""
    overrides = {"threads": threads} if threads else {}
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-mix-") as tmp:
        art, names = with_adapters(Path(artifact), Path(tmp), [rank] * 4)
        configs = mix_configs(names)
        over: dict[str, list[float]] = {c: [] for c in configs}
        with Engine.from_artifact(art, max_num_seqs=batch, max_adapters_per_batch=4, enable_prefix_cache=False,
                                  **PLAIN, **overrides) as engine:
            for k in range(rounds):
                for c in (list(configs) if k % 2 == 0 else list(reversed(configs))):
                    b, x = paired_steps(engine, configs[c], batch, pairs=pairs, seed=k)
                    over[c].append(float(np.median(x / b)) - 1)
    scen, extra = "lora-mix", {"rank": rank, "pairs": pairs}
    rows = [row(scen, "ortllm", batch, f"step_overhead ({c})", v, "%", scale=100, **extra) for c, v in over.items()]
    o = {c: np.asarray(v) for c, v in over.items()}
    rows.append(row(scen, "ortllm", batch, "mix_vs_sum_of_singles", o["mix a*0.7 + b*0.3"] / (
        o["adapter a"] + o["adapter b"]), "ratio", **extra))
    rows.append(row(scen, "ortllm", batch, "mixed_2of4_vs_4_adapters", o["2 of 4 mixed"] / o["4 adapters"], "ratio",
                    **extra))
    return rows
