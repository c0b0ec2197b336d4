"""The `ortllm` command line. Each verb parses its options here and calls its package.

User errors print one line (`ortllm: error: ...`) and exit 1; nothing a user does prints a traceback.
Set ORTLLM_DEBUG=1 to see tracebacks of unexpected failures.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# the registry only (names, help, defaults): each scenario's code is imported when it runs
from ortllm.bench.scenarios import DEFAULT_BATCHES, SCENARIOS, SERVE_CONCURRENCY
from ortllm.pipeline.train_config import add_arguments as add_train_arguments

from .options import Bool, Option, Parser, add_options, fill_defaults

# The verb being parsed: only its options are declared (their defaults import the config they come from, e.g.
# ortllm.pipeline.build for build and pull); None: every verb's (tests, --help of the whole command).
_VERB: list[str | None] = [None]


def _declares(*verbs: str) -> bool:
    return _VERB[0] is None or _VERB[0] in verbs


# ---------------------------------------------------------------- build

def _add_build(sub) -> None:
    p = sub.add_parser("build", help="build an artifact from a recipe, a GGUF file or a HF directory (or a model "
                                     "downloaded from a Hugging Face hub)")
    p.add_argument("model", metavar="RECIPE|PATH|hf.co/ORG/REPO[:QUANT|:FILE]")
    p.add_argument("--out", required=True, type=Path, help="artifact directory to write")
    _add_build_options(p)
    add_options(p, BUILD_VERB_OPTIONS)
    p.set_defaults(run=_run_build)


BUILD_VERB_OPTIONS = (Option("--force", "replace whatever --out holds", default=False),)


def _add_build_options(p) -> None:
    """The build options `ortllm build` and `ortllm pull` share (cli/build_options.py)."""
    if _declares("build", "pull"):
        from .build_options import BUILD_OPTIONS
        add_options(p, BUILD_OPTIONS)


def _run_build(a) -> int:
    from .build import build_artifact

    opts = _build_options(a)
    fill_defaults(a, BUILD_VERB_OPTIONS)
    build_artifact(a.model, a.out, opts, source=a.source, force=a.force,
                   log=lambda m: print(m, file=sys.stderr))
    return 0


def _build_options(a):
    from .build_options import build_options
    return build_options(a)


# ---------------------------------------------------------------- eval

def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="quality report of an artifact against its fp32 reference (docs/quality.md)")
    p.add_argument("artifact", type=Path, nargs="+",
                   help="artifact(s) to evaluate; several share one pass of the reference (reports in OUT/<name>/)")
    p.add_argument("--reference", required=True, type=Path, help="fp32 artifact of the same model")
    p.add_argument("--suite", default="fidelity,humaneval", help="comma-separated: fidelity, humaneval, adapters")
    p.add_argument("--out", required=True, type=Path, help="directory for report.json, report.md and plots")
    p.add_argument("--tokens", type=int, default=16384, help="scored tokens of the fidelity suite")
    p.add_argument("--ctx", type=int, default=2048, help="tokens per fidelity window")
    p.add_argument("--humaneval-n", type=int, default=164, help="HumanEval problems (the first N)")
    p.add_argument("--max-tokens", type=int, default=384, help="completion budget per HumanEval problem")
    p.add_argument("--pass-at-1", action=Bool, default=True,
                   help="HumanEval pass@1 by generation (--no-pass-at-1: NLL only) (default: on)")
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(run=_run_eval)


def _run_eval(a) -> int:
    from ortllm.calibration.eval import EvalOptions, evaluate, evaluate_many
    from ortllm.calibration.report import write_markdown

    opts = EvalOptions(suites=tuple(s.strip() for s in a.suite.split(",") if s.strip()), tokens=a.tokens,
                       ctx=a.ctx, humaneval_n=a.humaneval_n, max_tokens=a.max_tokens,
                       pass_at_1=a.pass_at_1, threads=a.threads)
    command = "ortllm " + " ".join(sys.argv[1:])
    if len(a.artifact) == 1:
        reports = [evaluate(a.artifact[0], a.reference, a.out, opts, command=command)]
    else:
        reports = evaluate_many(a.artifact, a.reference, a.out, opts, command=command)
    for report in reports:
        print(write_markdown(report))
    print(f"report(s) written under {a.out}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- generate

def _generate_text():
    from .generate import generate_text
    return generate_text


GENERATE_OPTIONS = (
    Option("--prompt", "the text to complete (with --chat: the user's message)", default=None),
    Option("--chat", "wrap the prompt in the model's chat template", _generate_text),
    Option("--system", "system message (with --chat)", _generate_text),
    Option("--adapter", "LoRA adapter of the artifact (ortllm adapters list)", _generate_text),
    Option("--max-tokens", "tokens to generate at most", _generate_text, metavar="N"),
    Option("--temperature", "0 = greedy", _generate_text, metavar="T"),
    Option("--seed", "same seed, same text", _generate_text, metavar="S"),
    Option("--threads", "intra-op threads", _generate_text, default_text="physical cores", metavar="N"),
)


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="print a completion for one prompt")
    p.add_argument("artifact", type=Path)
    if _declares("generate"):
        add_options(p, GENERATE_OPTIONS)
    p.set_defaults(run=_run_generate, prepare=lambda a: fill_defaults(a, GENERATE_OPTIONS))


def _run_generate(a) -> int:
    from ortllm.runtime.artifact import quality_line
    from ortllm.runtime.errors import EmptyPrompt
    from .generate import generate_text

    if a.prompt is None:
        raise EmptyPrompt("ortllm generate needs --prompt TEXT (for a chat: ortllm run MODEL)")
    if a.artifact.is_dir() and (line := quality_line(a.artifact)):
        print(f"ortllm: {line}", file=sys.stderr)

    for piece in generate_text(a.artifact, a.prompt, chat=a.chat, system=a.system, max_tokens=a.max_tokens,
                               temperature=a.temperature, seed=a.seed, threads=a.threads, adapter=a.adapter):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


# ---------------------------------------------------------------- run

def _chat_options():
    from .run import ChatOptions
    return ChatOptions


RUN_OPTIONS = tuple(Option("--" + name.replace("_", "-"), doc, _chat_options, metavar=meta) for name, doc, meta in (
    ("system", "system message of the conversation", "TEXT"),
    ("adapter", "LoRA adapter of the artifact (ortllm adapters list)", "NAME"),
    ("temperature", "0 = greedy; /set temperature T in a session", "T"),
    ("top_p", "nucleus sampling (1: off)", "P"),
    ("top_k", "sample from the K most likely tokens (0: off)", "K"),
    ("min_p", "drop tokens below P x the most likely one's probability (0: off)", "P"),
    ("repetition_penalty", "penalty on tokens already seen (1: off)", "R"),
    ("max_tokens", "tokens per reply at most", "N"),
    ("seed", "same seed, same replies", "S"))) + (
    Option("--threads", "intra-op threads", lambda: __import__("ortllm.runtime.config", fromlist=["x"]).EngineConfig,
           default_text="physical cores", metavar="N"),)


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="chat with a model in the terminal (streamed, with history), or answer one "
                                   "prompt (given, or piped on stdin); in-process, no server")
    p.add_argument("artifact", type=Path, metavar="MODEL", help="artifact directory or store name (NAME[:TAG])")
    p.add_argument("prompt", nargs="?", default=None, help="answer this and exit (default: an interactive session, "
                   "or stdin when it is not a terminal)")
    if _declares("run"):
        add_options(p, RUN_OPTIONS)
    p.set_defaults(run=_run_run, prepare=lambda a: fill_defaults(a, RUN_OPTIONS))


def _run_run(a) -> int:
    from .run import ChatOptions, run_chat
    import dataclasses
    options = ChatOptions(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ChatOptions)})
    return run_chat(a.artifact, a.prompt, options, threads=a.threads)


# ---------------------------------------------------------------- adapters

def _add_adapters(sub) -> None:
    p = sub.add_parser("adapters", help="add, list or remove LoRA adapters of an artifact")
    verbs = p.add_subparsers(dest="adapters_verb", required=True, metavar="add|list|remove|train")
    add = verbs.add_parser("add", help="convert a PEFT LoRA or DoRA (use_dora) directory into the artifact")
    add.add_argument("artifact", type=Path)
    add.add_argument("peft_dir", type=Path)
    add.add_argument("--name", required=True)
    add.add_argument("--force", action="store_true", help="replace an adapter of the same name")
    ls = verbs.add_parser("list", help="list the artifact's adapters")
    ls.add_argument("artifact", type=Path)
    rm = verbs.add_parser("remove", help="remove an adapter from the artifact")
    rm.add_argument("artifact", type=Path)
    rm.add_argument("name")
    tr = verbs.add_parser("train", help="train a LoRA (PEFT, CPU) on your chats (--data FILE.jsonl) or a generated "
                                        "task (--task) and add it (docs/adapters.md, Training on your own data)")
    tr.add_argument("artifact", type=Path)
    tr.add_argument("--name", required=True)
    add_train_arguments(tr)
    tr.add_argument("--base", default=None, help="the artifact's source, if it was not built from a recipe")
    tr.add_argument("--eval", type=int, default=100, help="--task: held-out prompts to score base vs adapter (0: skip)")
    tr.add_argument("--work-dir", type=Path, default=None,
                    help="checkpoints of the run (default: .ortllm-train/ beside the artifact; the store's tmp/)")
    tr.add_argument("--restart", action="store_true", help="start over instead of resuming this run's checkpoint")
    tr.add_argument("--force", action="store_true", help="replace an adapter of the same name")
    p.set_defaults(run=_run_adapters)


def _train_adapter(a) -> None:
    from dataclasses import replace

    from ortllm.pipeline.train_config import from_args
    from ortllm.runtime.config import physical_cores
    from .adapter_train import train_adapter

    cfg = from_args(a)
    cfg = cfg if cfg.threads else replace(cfg, threads=physical_cores())
    info, artifact = train_adapter(a.artifact, a.name, cfg, base=a.base, force=a.force,
                                   store_name=a.store_names.get(Path(a.artifact)), work_dir=a.work_dir,
                                   restart=a.restart, log=lambda m: print(m, file=sys.stderr))
    what = cfg.task or Path(cfg.data).name
    print(f"trained {a.name} on {what}: loss {info['loss_first']:.3f} -> {info['loss_last']:.3f} in {info['steps']} "
          f"steps, {info['seconds']} s ({info['cpu_seconds']} s CPU)")
    if info["eval_loss_before"] is not None:
        print(f"held-out loss ({info['eval_examples']} examples): {info['eval_loss_before']:.4f} -> "
              f"{info['eval_loss_after']:.4f}")
    if cfg.task and a.eval:
        from ortllm.calibration.adapter_eval import task_accuracy
        from ortllm.runtime.engine import Engine
        with Engine.from_artifact(artifact) as engine:
            base = task_accuracy(engine, cfg.task, None, n=a.eval)
            tuned = task_accuracy(engine, cfg.task, a.name, n=a.eval)
        print(f"{cfg.task} accuracy on {a.eval} held-out prompts: base {base.accuracy:.1%}, "
              f"{a.name} {tuned.accuracy:.1%}")


def _run_adapters(a) -> int:
    from ortllm.runtime import adapter_files as adapters

    if a.adapters_verb == "train":
        _train_adapter(a)
    elif a.adapters_verb == "add":
        e = adapters.add_adapter(a.artifact, a.peft_dir, a.name, force=a.force)
        kind = "DoRA" if e.get("dora") else "LoRA"
        print(f"added {a.name}: {kind} rank {e['rank']}, scale {e['scale']:g}, targets {', '.join(e['targets'])}")
    elif a.adapters_verb == "list":
        for name, e in sorted(adapters.list_adapters(a.artifact).items()):
            kind = "DoRA" if e.get("dora") else "LoRA"
            print(f"{name}\t{kind} rank {e['rank']}\tscale {e['scale']:g}\t{','.join(e['targets'])}\t{e['size']} bytes")
    else:
        adapters.remove_adapter(a.artifact, a.name)
        print(f"removed {a.name}")
    return 0


# ---------------------------------------------------------------- bench

def _add_bench(sub) -> None:
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
    p.set_defaults(run=_run_bench)


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


def _run_bench(a) -> int:
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


# ---------------------------------------------------------------- batch

def _add_batch(sub) -> None:
    p = sub.add_parser("batch", help="run an OpenAI Batch JSONL file through the engine (resumable; docs/batch.md)")
    p.add_argument("artifact", type=Path, metavar="ARTIFACT")
    p.add_argument("--input", required=True, type=Path, help="JSONL: {custom_id, method, url, body} per line")
    p.add_argument("--output", required=True, type=Path,
                   help="JSONL of results, appended as they finish; rerun with the same file to resume")
    p.add_argument("--max-num-seqs", type=int, default=None, help="sequences per engine step (default: engine's)")
    p.add_argument("--threads", type=int, default=None,
                   help="engine intra-op threads (default: physical cores; with --ray: per worker, 1 if unset)")
    p.add_argument("--model-name", default=None, help="the base model's `model` (default: the artifact's recipe)")
    p.add_argument("--progress", action=Bool, default=True,
                   help="a progress bar (the summary line prints either way) (default: on)")
    p.add_argument("--ray", action=Bool, default=False,
                   help="run on Ray Data, one engine per worker (pip install ray) (default: off)")
    p.add_argument("--num-workers", type=int, default=2, help="with --ray: engine actors")
    p.add_argument("--address", default=None,
                   help="with --ray: cluster to join (e.g. auto, or HEAD_IP:6379); default: a local Ray instance")
    p.set_defaults(run=_run_batch)


def _run_batch(a) -> int:
    from ortllm.batch import BatchOptions, run_batch

    opts = BatchOptions(max_num_seqs=a.max_num_seqs, threads=a.threads, model_name=a.model_name,
                        progress=a.progress, ray=a.ray, num_workers=a.num_workers, address=a.address)
    summary = run_batch(a.artifact, a.input, a.output, opts)
    return 130 if summary.interrupted else 0


# ---------------------------------------------------------------- main

def make_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line; with argv, only the options of its verb are declared (the others' imports skipped)."""
    _VERB[0] = None if argv is None else next((x for x in argv if not x.startswith("-")), "")
    parser = Parser(prog="ortllm", description="small llama-family models with many LoRA "
                                     "adapters on CPUs, on ONNX Runtime")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    _add_build(sub)
    _add_generate(sub)
    _add_run(sub)
    _add_eval(sub)
    _add_adapters(sub)
    _add_bench(sub)
    from .serve import add_serve
    add_serve(sub)
    _add_batch(sub)
    from .store_verbs import add_store_verbs
    add_store_verbs(sub, _add_build_options, _build_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = make_parser(argv).parse_args(argv)
    try:
        from .store_verbs import resolve_artifact_args
        if hasattr(args, "prepare"):
            args.prepare(args)           # options from other sources than the command line (serve: env, file)
        resolve_artifact_args(args)      # store names (NAME:TAG) -> their artifact directories
        return args.run(args)
    except KeyboardInterrupt:
        print("ortllm: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into a line for the user
        from ortllm.runtime.artifact import ArtifactError
        from ortllm.runtime.errors import OrtllmError
        from ortllm.runtime.store import with_store_repair_hint
        if isinstance(e, ArtifactError):
            e = with_store_repair_hint(e)          # a damaged store model: the pull that repairs it
        if isinstance(e, OrtllmError):
            print(f"ortllm: error: {e}", file=sys.stderr)
            return 1
        if os.environ.get("ORTLLM_DEBUG"):
            raise
        print(f"ortllm: internal error: {type(e).__name__}: {e} (rerun with ORTLLM_DEBUG=1 for details; "
              "please report it)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
