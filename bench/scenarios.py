"""The scenario registry behind `ortllm bench`, the one door to the benchmarks: each scenario's name, what it needs
and the function that makes its rows. The CLI parses the options into one BenchRun and calls run_scenarios;
results.json is written once, by the caller (results.write_results). No module of bench/ has a command line of its
own but the child processes a scenario starts on purpose (tests/test_bench_one_door.py keeps it so): the memory
scenario's fresh process (`python -m ortllm.bench.memory`), the peers' drivers in their own venvs (bench/peers/),
the servers it loads (`ortllm serve`, llama-server); bench/probes/ are one-question probes, not benchmarks.

A scenario's runner takes (BenchRun, the names asked for in its group) and returns rows
{scenario, system, batch, metric, median, min, max, unit, ...} (results.row). Scenarios of one group run in one
call: decode, prefill and long-context alternate with the peers round by round (peer_runner.run_alternating).
With --reference, "quality" joins them: ARTIFACT and every peer on the same held-out windows against the fp32
reference (bench/quality.py); its figures then stand beside each speed row, and the best peer of each speed row is
named twice, fastest and fastest at quality (peer_runner.best_peers).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import BenchError

DEFAULT_BATCHES, SERVE_CONCURRENCY = (1, 4, 8, 16, 32), (1, 4, 16)


@dataclass(frozen=True)
class BenchRun:
    """The options of one `ortllm bench` run, handed to every scenario."""
    artifact: Path | None
    out: Path
    batches: tuple[int, ...] = DEFAULT_BATCHES        # batch sizes (engine, peers)
    concurrency: tuple[int, ...] = SERVE_CONCURRENCY  # concurrent streams (serve)
    repeats: int = 3                                  # 1 with quick
    threads: int | None = None
    quick: bool = False
    peers: list[str] = field(default_factory=list)    # peer systems named with --peers
    slo_ttft_ms: float = 1000.0
    slo_tpot_ms: float = 100.0
    reference: Path | None = None                     # fp32 artifact of the same recipe: the quality scenario
    quality_tokens: int = 4096                        # held-out positions scored per system, all domains
    quality_ctx: int = 512                            # tokens per held-out window
    sections: dict = field(default_factory=dict)      # further top-level keys of results.json, filled by scenarios
    peers_model: str | None = None                    # peer scenarios without ARTIFACT: the recipe the peers run
    rates: tuple[float, ...] = ()                     # serve-guidellm: Poisson rates (req/s) after the levels
    max_seconds: float | None = None                  # serve-guidellm: per run (None: its default)
    max_requests: int | None = None                   # serve-guidellm: per run (None: its default)
    ops_only: str | None = None                       # ops: "qlinear" or "paged_attention" alone
    ops_baseline: Path | None = None                  # ops: another libortllm_ops.so, A/B on PagedAttention per call
    ops_spinning: bool = False                        # ops: PagedAttention per call on ORT's spinning pool
    resident: str = "auto"                            # peer scenarios: all systems loaded, or one at a time


@dataclass(frozen=True)
class Scenario:
    name: str
    help: str
    run: Callable[[BenchRun, list[str]], list[dict]]
    needs_artifact: bool = True
    group: str | None = None          # scenarios of one group run together in one call
    tables: Callable[[list[dict]], str] | None = None   # the scenario's own tables for results.md (its rows)


def _engine(r: BenchRun, _) -> list[dict]:
    from .engine import run
    return run(r.artifact, batches=r.batches, repeats=r.repeats, threads=r.threads)


def _peers(r: BenchRun, names: list[str]) -> list[dict]:
    """ortllm and the peers alternating; without ARTIFACT, the peers alone on --peers-model's assets."""
    from .peer_runner import DEFAULT_MODEL, run_alternating
    if r.artifact is None and not r.peers:
        raise BenchError(f"--scenario {','.join(names)} needs an ARTIFACT (an engine-graph artifact directory), or "
                         "--peers to run the peers alone")
    return run_alternating(r.artifact, r.peers, names, r.batches, r.repeats, r.threads or 2,
                           log_dir=r.out / "peer-logs", model=r.peers_model or DEFAULT_MODEL, resident=r.resident)


def _quality(r: BenchRun, _) -> list[dict]:
    from .quality import run
    return run(r.artifact, r.reference, r.peers, r.quality_tokens, r.quality_ctx, r.threads,
               log_dir=r.out / "peer-logs", sections=r.sections)


def _lora_overhead(r: BenchRun, _) -> list[dict]:
    from .lora_overhead import run_overhead
    return run_overhead(r.artifact, repeats=r.repeats, threads=r.threads, step_pairs=10 if r.quick else 100)


def _lora_mix(r: BenchRun, _) -> list[dict]:
    from .lora_mix import run_mix
    return run_mix(r.artifact, rounds=r.repeats, threads=r.threads, pairs=10 if r.quick else 100)


def _lora_trace(r: BenchRun, _) -> list[dict]:
    """For 4 and 16 adapters: the trace at a rate that saturates every system (throughput is capacity), then at
    half the base model's capacity measured there (latency at a load the model sustains); each with the same trace
    on the base model alternating (the LoRA's end-to-end overhead) and with --peers (llama.cpp, OpenVINO) on each,
    `repeats` times."""
    from .lora_trace import SATURATED_RATE, SUSTAINED_SHARE, rate_at, run_trace
    requests, rows = 16 if r.quick else 64, []
    for n in (4, 16):
        saturated = run_trace(r.artifact, n, requests=requests, rate=SATURATED_RATE, threads=r.threads,
                              peers=r.peers, repeats=r.repeats)
        rows += saturated
        rows += run_trace(r.artifact, n, requests=requests, rate=rate_at(saturated, SUSTAINED_SHARE),
                          threads=r.threads, peers=r.peers, repeats=r.repeats)
    return rows


def _lora_swap(r: BenchRun, _) -> list[dict]:
    from .lora_swap import run_swap
    return run_swap(r.artifact, repeats=r.repeats, threads=r.threads)


def _ops(r: BenchRun, _) -> list[dict]:
    from .ops import run
    return run(r.out, threads=r.threads or 2, quick=r.quick, only=r.ops_only, baseline=r.ops_baseline,
               spinning=r.ops_spinning)


def _ops_tables(rows: list[dict]) -> str:
    from .ops import markdown
    return markdown({"results": [x for x in rows if x["scenario"].startswith("ops/")]})


def _serve(r: BenchRun, _) -> list[dict]:
    from .serve import run
    return run(r.artifact, r.concurrency, repeats=r.repeats, threads=r.threads, quick=r.quick,
               slo_ttft_ms=r.slo_ttft_ms, slo_tpot_ms=r.slo_tpot_ms, log_dir=r.out / "serve-logs")


def _serve_guidellm(r: BenchRun, _) -> list[dict]:
    from .serve_guidellm import CONCURRENCY, run
    levels = CONCURRENCY if r.concurrency == SERVE_CONCURRENCY else r.concurrency
    return run(r.artifact, r.peers, levels, rates=r.rates, threads=r.threads or 2, repeats=r.repeats,
               quick=r.quick, slo_ttft_ms=r.slo_ttft_ms, slo_itl_ms=r.slo_tpot_ms, max_seconds=r.max_seconds,
               max_requests=r.max_requests, log_dir=r.out / "guidellm-logs")


def _http_engine(r: BenchRun, _) -> list[dict]:
    from .http_engine import STREAMS, run
    levels = (STREAMS,) if r.concurrency == SERVE_CONCURRENCY else r.concurrency
    return [x for streams in levels for x in run(r.artifact, streams, repeats=r.repeats, threads=r.threads)]


def _serve_ray(r: BenchRun, _) -> list[dict]:
    from .serve_ray import run
    return run(r.artifact, rounds=r.repeats, log_dir=r.out / "serve-ray-logs")


def _memory(r: BenchRun, _) -> list[dict]:
    from .memory import run
    return run(r.artifact, repeats=r.repeats, threads=r.threads, quick=r.quick, peers=r.peers,
               log_dir=r.out / "peer-logs")


def _speculative(r: BenchRun, _) -> list[dict]:
    from .speculative import run
    batches = (1, 8) if r.batches == DEFAULT_BATCHES else r.batches
    return run(r.artifact, batches=list(batches), repeats=r.repeats, threads=r.threads)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("engine", "decode B=1..32, prefill 512, in process", _engine),
    Scenario("decode", "64-token prompts, 128 new tokens (alternating with --peers; without ARTIFACT, the peers "
             "alone on --peers-model)", _peers, group="peers", needs_artifact=False),
    Scenario("prefill", "a 512-token prompt (alternating with --peers)", _peers, group="peers",
             needs_artifact=False),
    Scenario("long-context", "decode after a 1984-token prompt (alternating with --peers)", _peers,
             group="peers", needs_artifact=False),
    Scenario("quality", "held-out KLD, top-1 and PPL ratio of ARTIFACT and each --peers system against --reference "
             "(prose, code, chat; added to the peer scenarios when --reference is given)", _quality),
    Scenario("lora-overhead", "16 sequences over 0/1/2/4 adapters of rank 8/16/32", _lora_overhead),
    Scenario("lora-mix", "adapter mixes: a, b and a*0.7 + b*0.3 on every row; 4 adapters and every row mixing 2 "
             "of them, paired decode steps", _lora_mix),
    Scenario("lora-trace", "Zipf over 4 and 16 adapters (with --peers llama.cpp: against llama.cpp served one "
             "adapter set per batch, as its server does; --peers openvino[-int8][/pipelines]: against OpenVINO GenAI "
             "switching one pipeline's adapter between batches, or a pipeline per adapter)", _lora_trace),
    Scenario("lora-swap", "time to first token of a request whose adapter is in a slot, in host RAM or on disk, "
             "idle, beside 16 decoding requests and queued behind them (prefetch)", _lora_swap),
    Scenario("ops", "the custom ops against ORT's stock kernels (their docs tables in results.md)", _ops,
             needs_artifact=False, tables=_ops_tables),
    Scenario("speculative", "prompt-lookup drafts on vs off, alternating, on input-grounded and open-ended chat "
             "prompts (B=1 and 8 unless --batches)", _speculative),
    Scenario("serve", "HTTP load on `ortllm serve`: TTFT/TPOT/ITL p50/p90/p99, throughput, goodput", _serve),
    Scenario("serve-guidellm", "`ortllm serve` and --peers llama-server[-q4_0,-q8_0] (llama.cpp's own server, "
             "same slots and threads) under GuideLLM: 256 in, 128 out at 1, 4, 16, 64 streams; tok/s, TTFT/ITL "
             "p50/p99, errors, goodput at the SLO (ITL against --slo-tpot)", _serve_guidellm),
    Scenario("memory", "KV bytes per token, peak RSS at load and after a B=16 decode, in a fresh process",
             _memory),
    Scenario("http-engine", "16 streaming HTTP clients on `ortllm serve`'s app against the same engine in process "
             "(--batches: the streams): the service's tok/s ratio, TTFT, inter-chunk gaps", _http_engine),
    Scenario("serve-ray", "`ortllm serve --ray` (2 replicas x 1 thread) against one process x 2 threads, "
             "alternating, 16 streams (needs ray; make bench-ray)", _serve_ray),
)}
PEER_SCENARIOS = tuple(n for n, s in SCENARIOS.items() if s.group == "peers")


def select(names: list[str], peers: list[str], reference: Path | None = None) -> list[str]:
    """The scenarios to run, checked; --peers alone (no peer scenario, memory or lora-trace) means every peer
    scenario, and --reference adds quality to the peer scenarios."""
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise BenchError(f"unknown --scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if peers and not set(names) & {*PEER_SCENARIOS, "quality", "memory", "lora-trace", "serve-guidellm"}:
        names = [*names, *PEER_SCENARIOS]
    if reference is not None and set(names) & set(PEER_SCENARIOS) and "quality" not in names:
        names = [*names, "quality"]
    if "quality" in names and reference is None:
        raise BenchError("--scenario quality needs --reference FP32_ARTIFACT: an fp32 build of ARTIFACT's recipe "
                         "(ortllm build RECIPE --quant fp32 --kv fp32 --out FP32)")
    return names


def scenario_tables(names: list[str], rows: list[dict]) -> list[str]:
    """The tables of results.md that the named scenarios lay out themselves (Scenario.tables), in registry order."""
    return [sc.tables(rows) for n, sc in SCENARIOS.items() if n in names and sc.tables is not None]


def run_scenarios(names: list[str], run: BenchRun) -> list[dict]:
    """Rows of every named scenario, in registry order; a group's scenarios in one call. Then the peer scenarios'
    speed rows get their system's quality (quality.beside) and each one's best peer (peer_runner.best_peers;
    the lines saying why one has no row go to run.sections["best_peer_notes"])."""
    names = select(names, run.peers, run.reference)
    if run.artifact is None and any(SCENARIOS[n].needs_artifact for n in names):
        raise BenchError(f"--scenario {','.join(names)} needs an ARTIFACT (an engine-graph artifact directory)")
    if "quality" in names:
        from .quality import check_reference
        check_reference(run.artifact, run.reference)           # before any long run: a wrong reference fails now
    rows: list[dict] = []
    done: set[str] = set()
    for name, sc in SCENARIOS.items():
        if name not in names or (sc.group and sc.group in done):
            continue
        together = [n for n in SCENARIOS if n in names and SCENARIOS[n].group == sc.group] if sc.group else [name]
        rows += sc.run(run, together)
        if sc.group:
            done.add(sc.group)
    if set(names) & set(PEER_SCENARIOS):
        from .peer_runner import best_peers
        from .quality import beside
        best, notes = best_peers(beside(rows))
        rows += best
        if notes:
            run.sections["best_peer_notes"] = notes
    return rows
