"""`ortllm bench`: the scenario registry's front door (ortllm.bench.scenarios), results.json, results.md and the
plots of a run."""
from __future__ import annotations

import sys
from pathlib import Path

# the registry only (names, help, defaults): each scenario's code is imported when it runs
from ortllm.bench.scenarios import DEFAULT_BATCHES, SCENARIOS, SERVE_CONCURRENCY

from .options import Bool


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure throughput (figures for docs/benchmarks.md)")
    p.add_argument("artifact", type=Path, nargs="?", help="engine artifact (not needed for --scenario ops)")
    p.add_argument("--scenario", default="engine",
                   help="comma-separated: " + "; ".join(f"{n} ({sc.help})" for n, sc in SCENARIOS.items()))
    p.add_argument("--batches", default=None,
                   help=f"batch sizes for the engine and peer scenarios (default {_ints(DEFAULT_BATCHES)}); "
                        f"concurrent streams for serve (default {_ints(SERVE_CONCURRENCY)})")
    p.add_argument("--peers", default=None,
                   help="comma-separated llama.cpp,onnxruntime-genai,transformers or 'all': alternate with them on "
                        "decode/prefill/long-context (all three unless some are named, or memory is) and measure "
                        "their peak RSS under memory (install them with: make bench-peers)")
    p.add_argument("--reference", type=Path, default=None, metavar="FP32_ARTIFACT",
                   help="fp32 build of ARTIFACT's recipe: score ARTIFACT and every peer on held-out text against it "
                        "(KLD, top-1, PPL ratio beside each speed row; scenario quality)")
    p.add_argument("--quality-tokens", type=int, default=4096, metavar="N",
                   help="held-out positions scored per system, prose, code and chat together (default 4096)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action=Bool, default=False, help="fewer shapes and repeats (smoke run) (default: off)")
    p.add_argument("--slo-ttft", type=float, default=1000.0, metavar="MS",
                   help="serve: goodput counts requests with time to first token <= MS (default 1000)")
    p.add_argument("--slo-tpot", type=float, default=100.0, metavar="MS",
                   help="serve: ... and time per output token <= MS (default 100)")
    p.add_argument("--out", type=Path, required=True,
                   help="directory for results.json, results.md and the PNG plots")
    p.set_defaults(run=run_bench)


def _int_list(text: str, option: str) -> tuple[int, ...]:
    from ortllm.pipeline.errors import BuildError
    try:
        values = tuple(int(b) for b in text.split(","))
    except ValueError:
        raise BuildError(f"{option} must be comma-separated integers; got {text!r}") from None
    if not values or min(values) < 1:
        raise BuildError(f"{option} must be positive integers; got {text!r}")
    return values


def _ints(values) -> str:
    return ",".join(map(str, values))


def run_bench(a) -> int:
    from ortllm.bench.results import markdown_table, write_markdown, write_results
    from ortllm.bench.scenarios import BenchRun, run_scenarios, select
    from ortllm.pipeline.errors import BuildError

    peers = [s.strip() for s in (a.peers or "").split(",") if s.strip()]
    if a.peers == "all":
        from ortllm.bench.peer_runner import SYSTEMS
        peers = list(SYSTEMS)
    scenarios = select([s.strip() for s in a.scenario.split(",") if s.strip()], peers, a.reference)
    if a.quality_tokens < 16:
        raise BuildError(f"--quality-tokens must be >= 16; got {a.quality_tokens}")
    if not (a.slo_ttft > 0 and a.slo_tpot > 0):
        raise BuildError(f"--slo-ttft and --slo-tpot must be > 0 ms; got {a.slo_ttft:g} and {a.slo_tpot:g}")
    run = BenchRun(a.artifact, a.out, batches=_int_list(a.batches or _ints(DEFAULT_BATCHES), "--batches"),
                   concurrency=_int_list(a.batches or _ints(SERVE_CONCURRENCY), "--batches"),
                   repeats=1 if a.quick else a.repeats, threads=a.threads, quick=a.quick, peers=peers,
                   slo_ttft_ms=a.slo_ttft, slo_tpot_ms=a.slo_tpot, reference=a.reference,
                   quality_tokens=a.quality_tokens)
    rows = run_scenarios(scenarios, run)
    path = write_results(a.out, rows, sections=run.sections)
    print(markdown_table(rows))
    for note in run.sections.get("best_peer_notes", ()):
        print(note)
    plots = _bench_plots(a.out, rows)
    write_markdown(a.out, rows, plots=plots, notes=run.sections.get("best_peer_notes", ()))
    print(f"results written to {path} and {path.with_name('results.md')}", file=sys.stderr)
    return 0


def _bench_plots(out: Path, rows: list[dict]) -> list[str]:
    from ortllm.bench import plots
    if not plots.available():
        print(f"ortllm: plots skipped: matplotlib is not installed; to get them: {plots.HINT}", file=sys.stderr)
        return []
    return plots.write_plots(out, rows)
