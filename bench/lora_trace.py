"""lora-trace scenario: requests arriving with gamma-distributed gaps, each for an adapter drawn Zipf (s = 1) over 4
or 16 adapters of ranks 8/16/32 (bench/adapter_trace.py); metric throughput and time to first token; on the base
model alternating (the LoRA's end-to-end overhead) and on the peers (bench/trace_peers.py): llama.cpp served one
adapter set per batch as llama-server does, OpenVINO GenAI one adapter set per pipeline.
Adapters are synthetic (bench/synthetic_adapters.py), written into a copy of the artifact.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from ortllm.runtime.config import SchedulerConfig
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

from .adapter_trace import TRACE_RATE, TRACE_SLOTS, make_trace, trace_summary
from .engine import PLAIN
from .errors import BenchError
from .results import row
from .synthetic_adapters import with_adapters
from .trace_peers import trace_peer

SATURATED_RATE = 16.0     # a queue builds on every model here: throughput is each system's capacity
SUSTAINED_SHARE = 0.5     # the scenario's second rate: half the base model's capacity on the saturated trace
BASE_SYSTEM = "ortllm (base model)"
LORA_VS_BASE = "ortllm LoRA / base"  # run_trace's rows of the LoRA's overhead against BASE_SYSTEM


def replay_ortllm(engine: Engine, trace: list[dict], names: list[str] | None) -> dict:
    """Submit each request at its arrival time (greedy, EOS ignored), with its adapter (names=None: on the base
    model); TTFT and latency from the submit to the first and last token; wall from the start to the last token."""
    handles, t0 = [], time.monotonic()
    for r in trace:
        time.sleep(max(0.0, t0 + r["at"] - time.monotonic()))
        handles.append(engine.submit(r["prompt"], SamplingParams(max_tokens=r["max_tokens"], temperature=0.0,
                                                                 ignore_eos=True,
                                                                 adapter=names[r["adapter"]] if names else None)))
    outs = [h.result() for h in handles]
    if any(len(o.token_ids) != r["max_tokens"] for o, r in zip(outs, trace)):
        raise RuntimeError("ortllm generated fewer tokens than the trace asks for")
    return trace_summary([h.first_token_time - h.submitted for h in handles],
                         [h.token_times[-1] - h.submitted for h in handles], sum(len(o.token_ids) for o in outs),
                         max(h.token_times[-1] for h in handles) - t0)


TRACE_METRICS = (("throughput", "tok/s"), ("ttft_p50", "s"), ("ttft_p99", "s"), ("latency_p50", "s"),
                 ("latency_p99", "s"))


def run_trace(artifact: Path, n_adapters: int, requests: int = 64, rate: float = TRACE_RATE,
              threads: int | None = None, seed: int = 0, peers: list[str] = (), repeats: int = 1,
              base: bool = True, engine_overrides: dict | None = None) -> list[dict]:
    """The Zipf trace over n_adapters (ranks 8/16/32 in turn, LoRA on q, k, v, o) on ortllm, with `base` the same trace
    (arrivals, prompts, lengths) on the base model, and for each peer named (trace_peer: llama.cpp GGUF systems,
    OpenVINO ones) the same trace on it, alternating ortllm, base, peer, ortllm, ... `repeats` times. Rows per
    system: throughput, TTFT and request latency p50/p99; with `base`, "ortllm LoRA / base" rows: the LoRA's
    end-to-end overhead in % per alternating pair (throughput: base / LoRA - 1; latency p50 and p99: LoRA / base - 1);
    with a peer, "ortllm / PEER" rows: throughput ratio (> 1: ortllm faster) and latency p99 ratio (PEER / ortllm: > 1
    means ortllm's is lower). engine_overrides: EngineConfig keys for ortllm's engine (bench/probes/adapter_cap.py:
    max_adapters_per_batch, max_slots); max_queued is at least the trace's length unless given there."""
    ranks = [(8, 16, 32)[k % 3] for k in range(n_adapters)]
    # A replay submits each request at its arrival whatever the backlog, so a saturated trace may have nearly all of
    # them waiting: that is the load it measures, not one to refuse (the engine's default bound, 256, made a longer
    # trace on a slow host end in Overloaded). The queue bound is the trace's length unless the caller sets one.
    overrides = {"max_queued": max(requests, SchedulerConfig.max_queued), **({"threads": threads} if threads else {}),
                 **(engine_overrides or {})}
    scen = f"lora-trace ({n_adapters} adapters, {rate:.3g} req/s)"
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-trace-") as tmp:
        art, names = with_adapters(Path(artifact), Path(tmp), ranks)
        peer_sides = []
        for p in peers:
            try:
                peer_sides.append(trace_peer(p, Path(artifact), {n: Path(tmp) / f"peft{k}" for k, n in
                                                                 enumerate(names)}, Path(tmp), threads or 2))
            except BenchError as e:
                print(f"warning: peer {p} skipped: {e}", file=sys.stderr)
        with Engine.from_artifact(art, max_num_seqs=TRACE_SLOTS, **PLAIN, **overrides) as engine:
            trace = make_trace(n_adapters, requests, rate, engine.vocab_size, seed)
            got: dict[str, list[dict]] = {"ortllm": [], **({BASE_SYSTEM: []} if base else {}),
                                          **{p.system: [] for p in peer_sides}}
            for _ in range(repeats):
                got["ortllm"].append(replay_ortllm(engine, trace, names))
                if base:
                    got[BASE_SYSTEM].append(replay_ortllm(engine, trace, None))
                for p in list(peer_sides):
                    try:
                        got[p.system].append(p.replay(trace, names))
                    except BenchError as e:          # e.g. a pipeline per adapter that does not fit in memory
                        print(f"warning: peer {p.system} dropped from this trace: {e}", file=sys.stderr)
                        peer_sides.remove(p)
                        del got[p.system]
    rows, per_call = [], {p.system: p.PER_CALL for p in peer_sides}
    mine = got["ortllm"]
    for system, runs in got.items():
        extra = {"requests": requests, "rate": rate, "new_tokens": sum(r["max_tokens"] for r in trace),
                 "threads": threads or 2 if system not in ("ortllm", BASE_SYSTEM) else threads}
        for metric, unit in TRACE_METRICS:
            rows.append(row(scen, system, TRACE_SLOTS, metric, [r[metric] for r in runs], unit, **extra))
        if system == BASE_SYSTEM:
            pairs = list(zip(mine, runs))
            rows.append(row(scen, LORA_VS_BASE, TRACE_SLOTS, "throughput_overhead_pct",
                            [b["throughput"] / a["throughput"] - 1 for a, b in pairs], "%", scale=100))
            for m in ("latency_p50", "latency_p99"):
                rows.append(row(scen, LORA_VS_BASE, TRACE_SLOTS, f"{m}_overhead_pct",
                                [a[m] / b[m] - 1 for a, b in pairs], "%", scale=100))
        elif system != "ortllm":
            rows.append(row(scen, system, TRACE_SLOTS, per_call[system], [r["tokens_per_decode"] for r in runs],
                            "tokens", **extra))
            rows.append(row(scen, system, TRACE_SLOTS, "adapter_switches", [r["adapter_switches"] for r in runs],
                            "switches", **extra))
            rows.append(row(scen, f"ortllm / {system}", TRACE_SLOTS, "throughput_ratio",
                            [a["throughput"] / b["throughput"] for a, b in zip(mine, runs)], "x"))
            rows.append(row(scen, f"ortllm / {system}", TRACE_SLOTS, "latency_p99_ratio",
                            [b["latency_p99"] / a["latency_p99"] for a, b in zip(mine, runs)], "x"))
            rows.append(row(scen, f"ortllm / {system}", TRACE_SLOTS, "ttft_p99_ratio",
                            [b["ttft_p99"] / a["ttft_p99"] for a, b in zip(mine, runs)], "x"))
    return rows


def rate_at(rows: list[dict], share: float) -> float:
    """Requests/s that load the base model to `share` of its capacity: its throughput on a saturated replay
    (rows of run_trace) over the trace's mean new tokens per request."""
    base = next(r for r in rows if r["system"] == BASE_SYSTEM and r["metric"] == "throughput")
    return share * base["median"] / (base["new_tokens"] / base["requests"])
