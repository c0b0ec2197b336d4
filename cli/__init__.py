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


# ---------------------------------------------------------------- build

def _add_build(sub) -> None:
    p = sub.add_parser("build", help="build an artifact from a recipe, a GGUF file or a HF directory")
    p.add_argument("model", metavar="RECIPE|PATH")
    p.add_argument("--out", required=True, type=Path, help="artifact directory to write")
    _add_build_options(p)
    p.add_argument("--force", action="store_true", help="replace whatever --out holds")
    p.set_defaults(run=_run_build)


def _add_build_options(p) -> None:
    """The build options `ortllm build` and `ortllm pull` share."""
    p.add_argument("--source", help="weights for recipes that take a local path (e.g. tinyllama-1.1b-chat)")
    p.add_argument("--quant", default=None, help="fp32|int8|int4 (default: the recipe's)")
    p.add_argument("--block-size", type=int, default=None,
                   help="quantization block size, a power of two >= 16: 16|32|64|128|256 (default: recipe's)")
    p.add_argument("--algo", default="rtn",
                   help="rtn|hqq|gptq (gptq: error feedback from calibration activations of the fp32 model)")
    p.add_argument("--calib-tokens", type=int, default=8192, metavar="N",
                   help="calibration tokens for --algo gptq and --smooth (windows of 256; default 8192)")
    p.add_argument("--smooth", type=float, default=None, metavar="ALPHA",
                   help="SmoothQuant migration strength in [0, 1] for the projections after a norm (q|k|v, gate|up); "
                        "0: off; default 0.5 for --quant int8 with int8 compute (accuracy level 4), else off")
    p.add_argument("--smooth-down", type=float, default=0.0, metavar="ALPHA",
                   help="SmoothQuant migration strength in [0, 1] for down_proj's input, carried by up_proj's rows "
                        "(GLU MLPs); default 0 (off)")
    p.add_argument("--act16", default=None, metavar="GROUPS",
                   help="projection groups whose int8 weights take int16 activation codes: a comma-separated list "
                        "of qkv, o, gate_up, down, or none (default: the family's; Gemma 3 measured in "
                        "docs/quality.md)")
    p.add_argument("--source-mix", type=int, choices=(0, 1), default=1,
                   help="--quant int4 on a GGUF: keep its tensors of types wider than 4 bits (Q5_0, Q6_K, Q8_0, ...) "
                        "int8 (1, default) or round them to int4 too (0); Q4_K tensors keep their own grid")
    p.add_argument("--symmetric", action="store_true", help="symmetric int8/int4 (no zero points)")
    p.add_argument("--accuracy-level", type=int, default=4, help="MatMulNBits accuracy_level (4: int8 compute)")
    p.add_argument("--lm-head", default=None,
                   help="fp32|int8|int4 (default: int4 for --quant int4, else fp32)")
    p.add_argument("--lm-head-algo", default=None,
                   help="rtn|hqq|gptq: the quantizer of an int4 LM head (default gptq, from the final norm's "
                        "output with a searched grid; it needs --calib-tokens > 0)")
    p.add_argument("--keep", action="append", default=[], metavar="PATTERN=fp32|int8",
                   help="keep HF tensors matching the glob wider, e.g. 'model.layers.*.mlp.down_proj.weight=int8' "
                        "(repeatable; first match wins)")
    p.add_argument("--kv", default=None, help="KV cache dtype fp32|fp16|int8|fp8|int4 (default: fp32; fp16 halves its "
                                              "bytes at no measurable quality cost, int8 and int4 cost quality on "
                                              "held-out text: docs/quality.md)")
    p.add_argument("--kv-block-size", type=int, default=16, help="tokens per paged KV block (engine graph)")
    p.add_argument("--kv-rotate", type=int, choices=(0, 1), default=1,
                   help="Hadamard-rotate keys (int4: and values) before a quantized KV cache (1, default) or not "
                        "(0, for comparison)")
    p.add_argument("--graph", default="engine",
                   help="engine (paged KV, multi-LoRA; needs the ops library) | portable (stock ONNX Runtime)")
    p.add_argument("--exporter", default="native", help="native|optimum (optimum also writes optimum/)")


def _run_build(a) -> int:
    from .build import build_artifact

    build_artifact(a.model, a.out, _build_options(a), source=a.source, force=a.force,
                   log=lambda m: print(m, file=sys.stderr))
    return 0


def _build_options(a):
    from ortllm.pipeline.build import BuildOptions
    from ortllm.pipeline.recipes import known_recipes

    defaults = known_recipes()[a.model].build if a.model in known_recipes() else {}
    return BuildOptions(
        quant=a.quant or defaults.get("quant", "fp32"), block_size=a.block_size or defaults.get("block_size", 32),
        algo=a.algo, lm_head=a.lm_head, lm_head_algo=a.lm_head_algo, kv=a.kv or defaults.get("kv"),
        graph=a.graph, exporter=a.exporter, kv_block_size=a.kv_block_size, symmetric=a.symmetric,
        accuracy_level=a.accuracy_level, keep=tuple(a.keep), kv_rotate=bool(a.kv_rotate),
        calib_tokens=a.calib_tokens, smooth=a.smooth, smooth_down=a.smooth_down, source_mix=bool(a.source_mix),
        act16=None if a.act16 is None else tuple(g for g in a.act16.split(",") if g and g != "none"))


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
    p.add_argument("--no-pass-at-1", action="store_true", help="HumanEval NLL only (skip generation)")
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(run=_run_eval)


def _run_eval(a) -> int:
    from ortllm.calibration.eval import EvalOptions, evaluate, evaluate_many
    from ortllm.calibration.report import write_markdown

    opts = EvalOptions(suites=tuple(s.strip() for s in a.suite.split(",") if s.strip()), tokens=a.tokens,
                       ctx=a.ctx, humaneval_n=a.humaneval_n, max_tokens=a.max_tokens,
                       pass_at_1=not a.no_pass_at_1, threads=a.threads)
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

def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="print a completion for one prompt")
    p.add_argument("artifact", type=Path)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--adapter", default=None, help="LoRA adapter of the artifact (ortllm adapters list)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    p.set_defaults(run=_run_generate)


def _run_generate(a) -> int:
    from ortllm.runtime.artifact import quality_line
    from .generate import generate_text

    if a.artifact.is_dir() and (line := quality_line(a.artifact)):
        print(f"ortllm: {line}", file=sys.stderr)

    for piece in generate_text(a.artifact, a.prompt, chat=a.chat, system=a.system, max_tokens=a.max_tokens,
                               temperature=a.temperature, seed=a.seed, threads=a.threads, adapter=a.adapter):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


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
    tr = verbs.add_parser("train", help="train a LoRA on a generated task (PEFT, CPU) and add it")
    tr.add_argument("artifact", type=Path)
    tr.add_argument("--task", required=True, help="add | upper (calibration/adapter_tasks.py)")
    tr.add_argument("--name", required=True)
    tr.add_argument("--base", default=None, help="the artifact's source, if it was not built from a recipe")
    tr.add_argument("--rank", type=int, default=16)
    tr.add_argument("--steps", type=int, default=150)
    tr.add_argument("--batch", type=int, default=8)
    tr.add_argument("--lr", type=float, default=2e-3)
    tr.add_argument("--eval", type=int, default=100, help="held-out prompts to score base vs adapter (0: skip)")
    tr.add_argument("--force", action="store_true")
    p.set_defaults(run=_run_adapters)


def _train_adapter(a) -> None:
    import tempfile

    from ortllm.calibration.adapter_tasks import TASKS
    from ortllm.pipeline.adapter_train import TrainConfig, train_lora
    from ortllm.runtime.config import physical_cores
    from ortllm.runtime.adapter_files import add_adapter
    from ortllm.pipeline.errors import BuildError

    if a.task not in TASKS:
        raise BuildError(f"unknown --task {a.task!r}; tasks: {', '.join(TASKS)}")
    cfg = TrainConfig(task=a.task, rank=a.rank, alpha=2.0 * a.rank, steps=a.steps, batch=a.batch, lr=a.lr,
                      threads=physical_cores())
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-") as tmp:
        info = train_lora(a.artifact, Path(tmp), cfg, base=a.base, log=lambda m: print(m, file=sys.stderr))
        add_adapter(a.artifact, Path(tmp), a.name, force=a.force,
                    meta={"task": a.task, "train": {k: info[k] for k in ("loss_first", "loss_last", "seconds")}})
    print(f"trained {a.name} on {a.task}: loss {info['loss_first']:.3f} -> {info['loss_last']:.3f} "
          f"in {info['seconds']} s")
    if a.eval:
        from ortllm.calibration.adapter_eval import task_accuracy
        from ortllm.runtime.engine import Engine
        with Engine.from_artifact(a.artifact) as engine:
            base = task_accuracy(engine, a.task, None, n=a.eval)
            tuned = task_accuracy(engine, a.task, a.name, n=a.eval)
        print(f"{a.task} accuracy on {a.eval} held-out prompts: base {base.accuracy:.1%}, "
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
    p.add_argument("--quick", action="store_true", help="fewer shapes and repeats (smoke run)")
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


# ---------------------------------------------------------------- serve

def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve engine artifacts (directories or store names) over an OpenAI-compatible "
                                     "HTTP API")
    p.add_argument("artifact", type=Path, nargs="+", metavar="ARTIFACT",
                   help="one model, loaded at start; or several, each loaded on its first request")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (printed when ready)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on the API; without it, "
                   "pull / create / delete / copy / blobs / adapters are answered only on a loopback bind")
    p.add_argument("--allowed-path", action="append", default=[], type=Path, metavar="DIR",
                   help="a directory whose files requests may name (pull, /v1/adapters); repeatable (default: the "
                        "store, $ORTLLM_HOME)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a page origin (http://localhost:3000, or *) allowed to call the API; repeatable (default: "
                        "none, CORS off)")
    p.add_argument("--max-request-size", type=_size, default=1 << 20, metavar="SIZE",
                   help="largest request body, e.g. 1M (default 1M); larger get 413")
    p.add_argument("--max-upload-size", type=_size, default=1 << 30, metavar="SIZE",
                   help="largest file sent to POST /api/blobs, e.g. 512M (default 1G); larger get 413")
    p.add_argument("--max-queued", type=int, default=None, help="queued requests before 429 (default: engine's)")
    p.add_argument("--threads", type=int, default=None, help="engine intra-op threads (default: physical cores)")
    p.add_argument("--http-threads", type=int, default=64, help="concurrent HTTP requests (streams included)")
    p.add_argument("--spec-max-tokens", type=int, default=None, metavar="K",
                   help="prompt-lookup speculative decoding: up to K drafted tokens per decode row in steps of at "
                        "most 2 decode rows (default 8; 0: off)")
    p.add_argument("--decode-steps", type=int, default=None, metavar="K",
                   help="multi-step decoding: greedy decode batches run up to K model steps per schedule, text "
                        "streaming K tokens at a time (default 4; 1: off)")
    p.add_argument("--model-name", default=None, help="the `model` clients send (default: the artifact's recipe)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a generation is cancelled")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM")
    p.add_argument("--keep-alive", type=float, default=300.0, metavar="SECONDS",
                   help="with several models: unload one after this long without requests")
    p.add_argument("--memory-budget", type=float, default=None, metavar="GIB",
                   help="with several models: GiB their weights and KV pools may take (default: 80%% of RAM); "
                        "least recently used idle models are unloaded to make room")
    r = p.add_argument_group("scale-out on Ray Serve (pip install 'ortllm[ray]'; docs/service.md)")
    r.add_argument("--ray", action="store_true", help="run engine replicas as a Ray Serve application, routed "
                   "by adapter residency and prompt prefix")
    r.add_argument("--address", default=None, help="cluster to join (e.g. auto, or ray://HEAD:10001); default: "
                   "a local Ray instance")
    r.add_argument("--replicas", type=int, default=2, help="engine replicas (default 2)")
    r.add_argument("--min-replicas", type=int, default=None, help="autoscale between --min-replicas and "
                   "--max-replicas instead of a fixed --replicas")
    r.add_argument("--max-replicas", type=int, default=None)
    r.add_argument("--threads-per-replica", type=int, default=1, help="each replica's engine threads = the CPUs "
                   "Ray reserves for it (default 1)")
    p.set_defaults(run=_run_serve)


def _size(text: str) -> int:
    """'1048576', '512K', '1M', '4G' (binary units) -> bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    num, unit = text.strip().upper().removesuffix("IB").removesuffix("B"), ""
    if num and num[-1] in units:
        num, unit = num[:-1], num[-1]
    try:
        return int(float(num) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is a number of bytes with K, M or G; got {text!r}") from None


def _run_serve(a) -> int:
    from ortllm.service import logs
    from ortllm.service.config import ServiceConfig
    from ortllm.service.server import serve

    overrides = {k: v for k, v in (("max_queued", a.max_queued), ("threads", a.threads)) if v is not None}
    for name in ("spec_max_tokens", "decode_steps"):
        if getattr(a, name) is not None:
            overrides[name] = getattr(a, name)
    from .store_verbs import served_models
    models = served_models(a)           # ((name, artifact dir), ...): store names as given, else recipe names
    config = ServiceConfig(artifact=a.artifact[0] if len(models) == 1 else None, host=a.host, port=a.port,
                           api_key=a.api_key, model_name=a.model_name or (models[0][0] if len(models) == 1 else None),
                           http_threads=a.http_threads, request_timeout_s=a.request_timeout,
                           drain_timeout_s=a.drain_timeout, engine_overrides=overrides,
                           models=models if len(models) > 1 else (), keep_alive_s=a.keep_alive,
                           memory_budget_bytes=int(a.memory_budget * 2**30) if a.memory_budget else None,
                           allowed_paths=tuple(a.allowed_path), cors_origins=tuple(a.cors_origin),
                           max_body_bytes=a.max_request_size, max_upload_bytes=a.max_upload_size)
    logs.configure()
    if a.ray:
        from ortllm.runtime.errors import ConfigError
        from ortllm.service.ray_serve import RayOptions, serve_forever
        if len(models) != 1:
            raise ConfigError("ortllm serve --ray: serve one model per Ray application")
        if a.threads is not None:
            raise ConfigError("ortllm serve --ray: give --threads-per-replica, not --threads")
        return serve_forever(config, RayOptions(address=a.address, replicas=a.replicas, min_replicas=a.min_replicas,
                                                max_replicas=a.max_replicas,
                                                threads_per_replica=a.threads_per_replica))
    return serve(config)


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
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the summary line still prints)")
    p.add_argument("--ray", action="store_true", help="run on Ray Data, one engine per worker (pip install ray)")
    p.add_argument("--num-workers", type=int, default=2, help="with --ray: engine actors")
    p.add_argument("--address", default=None,
                   help="with --ray: cluster to join (e.g. auto, or HEAD_IP:6379); default: a local Ray instance")
    p.set_defaults(run=_run_batch)


def _run_batch(a) -> int:
    from ortllm.batch import BatchOptions, run_batch

    opts = BatchOptions(max_num_seqs=a.max_num_seqs, threads=a.threads, model_name=a.model_name,
                        progress=not a.no_progress, ray=a.ray, num_workers=a.num_workers, address=a.address)
    summary = run_batch(a.artifact, a.input, a.output, opts)
    return 130 if summary.interrupted else 0


# ---------------------------------------------------------------- main

def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortllm", description="small llama-family models with many LoRA "
                                     "adapters on CPUs, on ONNX Runtime")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    _add_build(sub)
    _add_generate(sub)
    _add_eval(sub)
    _add_adapters(sub)
    _add_bench(sub)
    _add_serve(sub)
    _add_batch(sub)
    from .store_verbs import add_store_verbs
    add_store_verbs(sub, _add_build_options, _build_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        from .store_verbs import resolve_artifact_args
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
