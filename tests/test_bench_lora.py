"""`ortllm bench --scenario lora-overhead` and `lora-trace` on the tiny engine artifact: one paired row per (rank,
adapters) configuration; the trace's rows on the LoRA and the base model. Plumbing only (a 2-layer model): the
figures themselves are in docs/adapters.md."""
from __future__ import annotations

import json

import numpy as np

from ortllm.bench.adapter_trace import make_trace
from ortllm.bench.lora_trace import run_trace
from ortllm.runtime.config import SchedulerConfig
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


def test_lora_trace_rows(tiny_engine, tmp_path):
    """`ortllm bench --scenario lora-trace` without peers (plumbing; the figures are in docs/adapters.md): for 4
    and 16 adapters a saturated trace and one at half the base model's measured capacity, each replayed on the
    base model too, with the LoRA's end-to-end overhead rows."""
    p = ortllm("bench", tiny_engine, "--scenario", "lora-trace", "--quick", "--threads", "1", "--out", tmp_path,
               timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    scens = sorted({r["scenario"] for r in rows})
    assert len(scens) == 4 and sum("16 req/s" in s for s in scens) == 2, scens
    by = {(r["scenario"], r["system"], r["metric"]): r for r in rows}
    for scen in scens:
        for system in ("ortllm", "ortllm (base model)"):
            assert by[(scen, system, "throughput")]["median"] > 0
            assert 0 < by[(scen, system, "latency_p50")]["median"] <= by[(scen, system, "latency_p99")]["median"]
        for m in ("throughput_overhead_pct", "latency_p50_overhead_pct", "latency_p99_overhead_pct"):
            assert by[(scen, "ortllm LoRA / base", m)]["unit"] == "%"
    for n in (4, 16):
        sat = by[(f"lora-trace ({n} adapters, 16 req/s)", "ortllm (base model)", "throughput")]["median"]
        half = next(r for r in rows if r["scenario"].startswith(f"lora-trace ({n} adapters")
                    and "16 req/s" not in r["scenario"])
        mean_new = np.mean([r["max_tokens"] for r in make_trace(n, 16, 1.0, 100)])     # --quick: 16 requests
        assert abs(half["rate"] * mean_new / sat - 0.5) < 1e-9, (half["rate"], mean_new, sat)


def test_a_trace_longer_than_the_engines_queue_bound_replays(tiny_engine):
    """A saturated replay submits every request at its arrival: with more requests than the engine's default queue
    bound arriving at once, they all wait (the load the trace measures) instead of the replay ending in Overloaded."""
    requests = SchedulerConfig.max_queued + 40
    rows = run_trace(tiny_engine, 2, requests=requests, rate=10_000.0, threads=1, base=False)
    by = {r["metric"]: r for r in rows if r["system"] == "ortllm"}
    assert by["throughput"]["median"] > 0 and by["throughput"]["requests"] == requests
    assert 0 < by["latency_p50"]["median"] <= by["latency_p99"]["median"]


def test_lora_mix_rows(tiny_engine, tmp_path):
    """`ortllm bench --scenario lora-mix` (plumbing on the tiny model; the figures are in docs/adapters.md): one
    overhead row per configuration (a round each with --quick) and the two ratios the mixes are held to."""
    p = ortllm("bench", tiny_engine, "--scenario", "lora-mix", "--quick", "--threads", "1", "--out", tmp_path,
               timeout=300)
    assert p.returncode == 0, p.stderr
    rows = {r["metric"]: r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    for c in ("adapter a", "adapter b", "mix a*0.7 + b*0.3", "4 adapters", "2 of 4 mixed"):
        assert rows[f"step_overhead ({c})"]["unit"] == "%" and rows[f"step_overhead ({c})"]["n"] == 1
    assert rows["mix_vs_sum_of_singles"]["unit"] == rows["mixed_2of4_vs_4_adapters"]["unit"] == "ratio"
