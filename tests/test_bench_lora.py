"""`ortllm bench --scenario lora-overhead` on the tiny engine artifact: one paired row per (rank, adapters)
configuration. Plumbing only (a 2-layer model): the figures themselves are in docs/benchmarks.md."""
from __future__ import annotations

import json

from tests.test_cli import ortllm


def test_lora_overhead_rows(tiny_engine, tmp_path):
    p = ortllm("bench", tiny_engine, "--scenario", "lora-overhead", "--quick", "--threads", "1",
               "--out", tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = {r["metric"]: r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    assert rows["decode_tokens_per_s (base)"]["n"] == 9              # one base run beside each configuration
    for rank in (8, 16, 32):
        for n in (1, 2, 4):
            name = f"{n} adapters rank {rank}"
            tps, ratio = rows[f"decode_tokens_per_s ({name})"], rows[f"throughput_vs_base ({name})"]
            assert tps["unit"] == "tok/s" and tps["median"] > 0 and tps["n"] == 1
            assert ratio["unit"] == "ratio" and 0 < ratio["median"] < 10
            steps = rows[f"step_throughput_vs_base ({name})"]                  # 10 paired steps with --quick
            assert steps["n"] == 10 and 0 < steps["p25"] <= steps["median"] <= steps["p75"] < 10
            base_ms, lora_ms = rows[f"step_ms (base, paired with {name})"], rows[f"step_ms ({name})"]
            assert base_ms["n"] == lora_ms["n"] == 10 and base_ms["median"] > 0 and lora_ms["median"] > 0
