"""`ortllm bench`: the scenario registry's front door (ortllm.bench.scenarios), results.json, results.md and the
plots of a run; and the docs' figure tables rendered from their results files (--render-figures)."""
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
    p.add_argument("--resident", choices=["auto", "all", "one"], default="auto",
                   help="decode/prefill/long-context with --peers: 'all' keeps every system loaded and alternates "
                        "them sample by sample; 'one' loads one system at a time and alternates them round by round "
                        "(models that do not fit in memory together); 'auto' picks 'one' when the model files exceed "
                        "90%% of the free memory (default auto)")
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
    p.add_argument("--peers-model", default=None, metavar="RECIPE",
                   help="the peer scenarios without ARTIFACT: the recipe whose peer assets the peers run alone "
                        "(default smollm2-135m-instruct)")
    p.add_argument("--rates", default=None, metavar="R,R",
                   help="serve-guidellm: Poisson arrival rates (req/s) to run after the concurrency levels")
    p.add_argument("--max-seconds", type=float, default=None, metavar="S",
                   help="serve-guidellm: seconds per run, one system at one load (default 60; 20 with --quick)")
    p.add_argument("--max-requests", type=int, default=None, metavar="N",
                   help="serve-guidellm: requests per run (default 8 x the concurrency; for a rate, rate x seconds)")
    p.add_argument("--ops-only", choices=["qlinear", "paged_attention"], default=None,
                   help="ops: that part alone (the whole ops scenario takes minutes)")
    p.add_argument("--ops-baseline", type=Path, default=None, metavar="LIBRARY",
                   help="ops: another libortllm_ops.so for the PagedAttention per-call case to alternate with (A/B)")
    p.add_argument("--ops-spinning", action=Bool, default=False,
                   help="ops: the PagedAttention per-call case on ORT's default spinning pool (the engine's setting) "
                        "(default: off)")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for results.json, results.md and the PNG plots (required to run scenarios)")
    p.add_argument("--render-figures", type=Path, nargs="+", default=None, metavar="PAGE",
                   help="run no scenario: rewrite the <!-- figures: NAME --> tables of these markdown pages from "
                        "their results files (bench/figures.py; make figures)")
    p.add_argument("--write-gguf", default=None, metavar="TYPE[,TYPE]",
                   help="run no scenario: write llama.cpp's GGUFs (q4_0, q8_0, f16, f32) of --peers-model's weights "
                        "into its peer assets, tensor by tensor, quantized as written (no fp32 copy: the MoE shape "
                        "recipes; bench/gguf_weights.py, make bench-moe-gguf)")
    p.add_argument("--check", action="store_true",
                   help="with --render-figures: change nothing; exit 1 naming the pages whose tables are stale")
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


def _floats(text: str | None, option: str) -> tuple[float, ...]:
    from ortllm.pipeline.errors import BuildError
    try:
        values = tuple(float(x) for x in (text or "").split(",") if x.strip())
    except ValueError:
        raise BuildError(f"{option} must be comma-separated numbers; got {text!r}") from None
    if any(v <= 0 for v in values):
        raise BuildError(f"{option} must be > 0; got {text!r}")
    return values


def render_figures(pages: list[Path], check: bool) -> int:
    from ortllm.bench.figures import render_pages
    from ortllm.pipeline.errors import BuildError
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        raise BuildError(f"--render-figures: no such page {', '.join(missing)}")
    stale = render_pages(pages, check)
    if stale:
        print(("stale figures (run ortllm bench --render-figures on them): " if check else "rewrote: ")
              + ", ".join(map(str, stale)), file=sys.stderr)
    return 1 if stale and check else 0


def write_gguf(model: str | None, types: str) -> int:
    """--write-gguf: one JSON summary line per file on stdout (tensor types, bytes, seconds, peak RSS)."""
    import json

    from ortllm.bench.gguf_weights import write_peer_ggufs
    from ortllm.pipeline.errors import BuildError
    if not model:
        raise BuildError("--write-gguf needs --peers-model RECIPE: the recipe whose weights to write")
    for summary in write_peer_ggufs(model, [t.strip() for t in types.split(",") if t.strip()],
                                    log=lambda m: print(m, file=sys.stderr)):
        print(json.dumps(summary), flush=True)
    return 0


def run_bench(a) -> int:
    from ortllm.bench.results import markdown_table, write_markdown, write_results
    from ortllm.bench.scenarios import BenchRun, run_scenarios, scenario_tables, select
    from ortllm.pipeline.errors import BuildError

    if a.render_figures:
        return render_figures(a.render_figures, a.check)
    if a.write_gguf:
        return write_gguf(a.peers_model, a.write_gguf)
    if a.check:
        raise BuildError("--check goes with --render-figures PAGE ...")
    if a.out is None:
        raise BuildError("ortllm bench needs --out DIR (where results.json, results.md and the plots go)")

    peers = [s.strip() for s in (a.peers or "").split(",") if s.strip()]
    if a.peers == "all":
        from ortllm.bench.peer_runner import SYSTEMS
        peers = list(SYSTEMS)
    scenarios = select([s.strip() for s in a.scenario.split(",") if s.strip()], peers, a.reference)
    if a.quality_tokens < 16:
        raise BuildError(f"--quality-tokens must be >= 16; got {a.quality_tokens}")
    if not (a.slo_ttft > 0 and a.slo_tpot > 0):
        raise BuildError(f"--slo-ttft and --slo-tpot must be > 0 ms; got {a.slo_ttft:g} and {a.slo_tpot:g}")
    if a.max_seconds is not None and a.max_seconds <= 0 or a.max_requests is not None and a.max_requests < 1:
        raise BuildError(f"--max-seconds must be > 0 and --max-requests >= 1; got {a.max_seconds} and "
                         f"{a.max_requests}")
    run = BenchRun(a.artifact, a.out, batches=_int_list(a.batches or _ints(DEFAULT_BATCHES), "--batches"),
                   concurrency=_int_list(a.batches or _ints(SERVE_CONCURRENCY), "--batches"),
                   repeats=1 if a.quick else a.repeats, threads=a.threads, quick=a.quick, peers=peers,
                   slo_ttft_ms=a.slo_ttft, slo_tpot_ms=a.slo_tpot, reference=a.reference,
                   quality_tokens=a.quality_tokens, peers_model=a.peers_model, rates=_floats(a.rates, "--rates"),
                   max_seconds=a.max_seconds, max_requests=a.max_requests, ops_only=a.ops_only,
                   ops_baseline=a.ops_baseline, ops_spinning=a.ops_spinning, resident=a.resident)
    rows = run_scenarios(scenarios, run)
    path = write_results(a.out, rows, sections=run.sections)
    print(markdown_table(rows))
    for note in run.sections.get("best_peer_notes", ()):
        print(note)
    plots = _bench_plots(a.out, rows)
    write_markdown(a.out, rows, plots=plots, notes=run.sections.get("best_peer_notes", ()),
                   tables=scenario_tables(scenarios, rows))
    print(f"results written to {path} and {path.with_name('results.md')}", file=sys.stderr)
    return 0


def _bench_plots(out: Path, rows: list[dict]) -> list[str]:
    from ortllm.bench import plots
    if not plots.available():
        print(f"ortllm: plots skipped: matplotlib is not installed; to get them: {plots.HINT}", file=sys.stderr)
        return []
    return plots.write_plots(out, rows)
