"""`serve-guidellm` scenario: `ortllm serve` and llama.cpp's own `llama-server` under GuideLLM, a load tool no one
here wrote (docs/notes/benchmarks.md, Serving under GuideLLM).

Both servers run as their users run them, on 127.0.0.1, on the same engine threads and the same number of
parallel sequences (`--parallel` on both; llama-server with continuous batching).
GuideLLM (PyPI `guidellm`, in its own venv: ci/install_peers.sh) sends synthetic prompts of PROMPT_TOKENS tokens,
counted with the artifact's own tokenizer (no hub access), asking OUTPUT_TOKENS tokens out, over its OpenAI
HTTP backend, streaming. Per concurrency level (and Poisson rate, if asked), the systems alternate
(ortllm, llama-server, ortllm, ...), each run bounded by seconds and requests.

Per system and level, from GuideLLM's JSON report (`parse_report`):
  output_tokens_per_s      GuideLLM's output tokens/s over the run                                    tok/s
  ttft_p50, ttft_p99       time to first token, per request                                           ms
  itl_p50, itl_p99         inter-token latency, per request ((end - first token) / (tokens - 1))      ms
  errors                   requests that errored (incomplete ones, cut by the run's bound, are not)   count
  goodput                  completed requests with TTFT <= slo_ttft_ms and ITL <= slo_itl_ms / s      req/s
  goodput_fraction         those requests / the completed and errored ones                            fraction
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from .errors import BenchError
from .peer_runner import GGUF_FILES, GGUF_TYPES, PEERS_VENV, REPO, assets_dir, gguf_path, model_of
from .results import row
from .child_server import ChildServer, die_with_parent, free_port
from .serve import ServeProcess

SCENARIO = "serve-guidellm"
CONCURRENCY = (1, 4, 16, 64)
PROMPT_TOKENS, OUTPUT_TOKENS = 256, 128
SLO_TTFT_MS, SLO_ITL_MS = 1000.0, 100.0
MAX_SECONDS, QUICK_MAX_SECONDS = 60.0, 20.0      # per run (one system at one level)
MAX_REQUESTS_PER_SLOT = 8                        # per run: C x this, at most
DISPATCH_DELAY_LIMIT_S = 0.2                     # GuideLLM's own threshold on its p95 root dispatch delay
LATE_ATTEMPTS = 3                                # runs of one system at one load, until one is sent on time
ORTLLM_PARALLEL = 32                             # sequences at once: ortllm serve --parallel, llama-server --parallel
SLOT_TOKENS = 512                                # llama-server's context per slot: 256 in + 128 out, with room
# llama.cpp peers: the GGUF each serves (peer_runner's files of the same weights). "llama-server*": llama.cpp's
# own C++ server (continuous batching over `--parallel` slots). "llama-cpp-python-server*": llama-cpp-python's
# Python server (`python -m llama_cpp.server`), the stand-in where llama-server is not built: one request at a
# time (no batching; later requests queue), so it shows what a Python wrapper serves, not llama.cpp's best.
SYSTEMS = {"llama-server": "llama.cpp", "llama-server-q4_0": "llama.cpp-q4_0",
           "llama-server-q8_0": "llama.cpp-q8_0", "llama-server-q4_k": "llama.cpp-q4_k",
           "llama-cpp-python-server": "llama.cpp", "llama-cpp-python-server-q4_0": "llama.cpp-q4_0",
           "llama-cpp-python-server-q8_0": "llama.cpp-q8_0"}
UNITS = {"output_tokens_per_s": "tok/s", "output_tokens_mean": "tokens", "ttft": "ms", "itl": "ms",
         "errors": "count", "completed": "count", "incomplete": "count", "goodput": "req/s",
         "goodput_fraction": "fraction", "request_throughput": "req/s"}
GUIDELLM_VENV = Path(os.environ.get("ORTLLM_GUIDELLM_VENV", REPO / ".venv-guidellm"))


def guidellm_bin() -> Path:
    """The guidellm CLI: ORTLLM_GUIDELLM, else .venv-guidellm/bin/guidellm (ci/install_peers.sh)."""
    p = Path(os.environ.get("ORTLLM_GUIDELLM", GUIDELLM_VENV / "bin" / "guidellm"))
    if not p.is_file():
        raise BenchError(f"GuideLLM is not installed at {p}: run `PEERS_ONLY=guidellm make bench-peers` "
                         "(or set ORTLLM_GUIDELLM to a guidellm executable)")
    return p


def llama_server_bin() -> Path:
    """llama.cpp's server: ORTLLM_LLAMA_SERVER, else .venv-peers/bin/llama-server (ci/install_peers.sh)."""
    p = Path(os.environ.get("ORTLLM_LLAMA_SERVER", PEERS_VENV / "bin" / "llama-server"))
    if not p.is_file():
        raise BenchError(f"llama-server is not built at {p}: run `PEERS_ONLY=llama-server make bench-peers` "
                         "(or set ORTLLM_LLAMA_SERVER to a llama-server executable)")
    return p


def llama_cpp_python() -> Path:
    """A python whose llama_cpp has its server extras: ORTLLM_LLAMA_CPP_SERVER_PYTHON, else .venv-peers'."""
    p = Path(os.environ.get("ORTLLM_LLAMA_CPP_SERVER_PYTHON", PEERS_VENV / "bin" / "python"))
    probe = subprocess.run([str(p), "-c", "import llama_cpp.server.app"], capture_output=True, timeout=120) \
        if p.is_file() else None
    if probe is None or probe.returncode != 0:
        raise BenchError(f"llama-cpp-python's server does not import with {p}: run `PEERS_ONLY=llama-cpp-server "
                         "make bench-peers` (or set ORTLLM_LLAMA_CPP_SERVER_PYTHON to such a python)")
    return p


def peer_gguf(system: str, model: str | None) -> Path:
    """The GGUF a llama-server peer serves: the same files as the in-process llama.cpp peers."""
    if system not in SYSTEMS:
        raise BenchError(f"unknown --peers {system} for --scenario {SCENARIO}; choose from {', '.join(SYSTEMS)}")
    peer = SYSTEMS[system]
    g = gguf_path(model) if peer == "llama.cpp" else (assets_dir(model) or Path("?")) / GGUF_FILES[peer]
    if g is None or not Path(g).is_file():
        raise BenchError(f"no {GGUF_TYPES[peer]} GGUF for {system} at {g}: run `make bench-peers MODEL={model}`")
    return Path(g)


class LlamaServer(ChildServer):
    """`llama-server` in a child process on 127.0.0.1 (continuous batching, `parallel` slots of SLOT_TOKENS
    context each), or with `python` llama-cpp-python's server (bench/child_server.py); ready once it answers 200
    (model loaded)."""
    name = "llama-server"

    def __init__(self, gguf: Path, log_path: Path, threads: int, parallel: int, alias: str,
                 python: Path | None = None, start_timeout: float = 300.0, grace: float = 10.0):
        port = free_port()
        if python:                # llama-cpp-python's server: one context, requests queue (no interrupting)
            cmd = [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                   "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
                   "--n_ctx", str(SLOT_TOKENS), "--model_alias", alias, "--interrupt_requests", "False"]
            self.ready_path = "/v1/models"
        else:
            cmd = [str(llama_server_bin()), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                   "--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(parallel),
                   "--ctx-size", str(parallel * SLOT_TOKENS), "--cont-batching", "--alias", alias,
                   "--no-webui", "--metrics"]
            self.ready_path = "/health"
        super().__init__(cmd, log_path, start_timeout, grace)
        self.base = f"http://127.0.0.1:{port}"

    def _ready(self) -> str | None:
        try:
            with urllib.request.urlopen(self.base + self.ready_path, timeout=2) as r:
                return self.base if r.status == 200 else None
        except OSError:
            return None


def guidellm_config(url: str, model: str, processor: Path, out: Path, concurrency: int | None = None,
                    rate: float | None = None, max_seconds: float = MAX_SECONDS, max_requests: int | None = None,
                    slo_ttft_ms: float = SLO_TTFT_MS, slo_itl_ms: float = SLO_ITL_MS, validate: bool = True,
                    seed: int = 42) -> dict:
    """GuideLLM's scenario file of one run (`guidellm run --scenario FILE`): its OpenAI HTTP backend
    on /v1/completions, streaming; synthetic prompts counted with `processor`'s tokenizer, drawn with `seed` (the
    same seed, the same prompts in the same order: run_seed); a closed loop of
    `concurrency` streams, or Poisson arrivals at `rate` req/s; bounded by seconds and requests; its goodput at
    the SLO (its `tpot_ms` objective is the per-request inter-token latency); the JSON report at `out`."""
    profile = {"kind": "concurrent", "streams": [int(concurrency)]} if rate is None else \
        {"kind": "poisson", "rate": [float(rate)]}
    constraints = [{"kind": "max_duration", "seconds": float(max_seconds)}]
    if max_requests:
        constraints.append({"kind": "max_requests", "count": int(max_requests)})
    return {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": model, "request_format": "/v1/completions",
                    "stream": True, "validate_backend": validate},     # validate: GET /health first
        "tokenizer": {"kind": "huggingface_auto", "model": str(processor)},
        "profile": profile,
        "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}],
        "seed": {"kind": "static", "value": int(seed)},
        "constraints": constraints,
        "outputs": [{"kind": "json", "path": str(out)}],
        "metrics": {"kind": "generative", "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_itl_ms}},
    }}


def run_seed(round_: int, load_index: int, loads: int) -> int:
    """GuideLLM's seed for one (round, load): the same for every system at that load, another for every load and
    round, so no server meets a prompt it has served before. With one seed for all runs, each level's prompts
    repeated the earlier levels' from the start: the servers' prefix caches held 240-255 of each prompt's 256 tokens
    until a faster system ran past what it had seen (then 0), so the systems' TTFTs measured different work."""
    return 1000 + round_ * loads + load_index


def _dist(metrics: dict, name: str) -> dict:
    """GuideLLM's StatusDistributionSummary `name`, its successful requests' part ({} if absent)."""
    return (metrics.get(name) or {}).get("successful") or {}


def parse_report(doc: dict) -> list[dict]:
    """GuideLLM's JSON report -> per benchmark (one per run here) {metric: value} in the module docstring's
    terms, plus "streams" or "rate" (the load it ran at)."""
    out = []
    for b in doc.get("benchmarks") or ():
        m, totals = b["metrics"], b["metrics"]["request_totals"]
        ok, errored = int(totals.get("successful", 0)), int(totals.get("errored", 0))
        strategy = (b.get("config") or {}).get("strategy") or {}
        duration = float(b.get("duration") or 0.0)
        tok = _dist(m, "output_token_count").get("total_sum")
        r = {"output_tokens_per_s": tok / duration if tok is not None and duration > 0 else
             _dist(m, "output_tokens_per_second").get("mean", 0.0),
             "request_throughput": ok / duration if duration > 0 else 0.0, "errors": float(errored),
             "completed": ok, "incomplete": int(totals.get("incomplete", 0)), "duration_s": duration,
             "output_tokens_mean": float(_dist(m, "output_token_count").get("mean", 0.0))}
        for key, name in (("ttft", "time_to_first_token_ms"), ("itl", "inter_token_latency_ms")):
            pct = (_dist(m, name).get("percentiles") or {}) if ok else {}   # none completed: no latency
            for q in ("p50", "p99"):
                if q in pct:
                    r[f"{key}_{q}"] = float(pct[q])
        attained = m.get("slo_attainment")
        if attained is not None:
            decided = int(m.get("slo_determined_requests") or 0)
            r["goodput_fraction"] = float(attained)
            r["goodput"] = attained * decided / duration if duration > 0 else 0.0
        delay = (m.get("root_dispatch_delay") or {}).get("percentiles") or {}
        if "p95" in delay:
            r["dispatch_delay_p95_s"] = float(delay["p95"])    # how late GuideLLM sent its requests (not a metric)
        if "streams" in strategy:
            r["streams"] = int(strategy["streams"])
        if "rate" in strategy:
            r["rate"] = float(strategy["rate"])
        out.append(r)
    return out


def late_dispatch(run: dict) -> str | None:
    """Why a parsed run is not the load it asked for, or None. GuideLLM 0.8.1 sometimes sends a Poisson run's
    requests all at once (on 2026-11-29, 4 of 12 rate runs: e.g. 15 requests of a 0.25 req/s run within 0.2 s by
    the server's log), and then reports a p95 root dispatch delay the size of a Unix time; its own warning's
    threshold is 0.2 s. In those runs every request's `targeted_start` is a sum of exponential gaps from 0, not from
    the run's start: the arrival offset the workers share (guidellm/scheduler/strategies.py, AsyncPoissonStrategy)
    still held its initial -1.0 when they drew their times. Its init_processes_start releases the workers (the start
    event) before it sets that offset, a race its busy main process can lose for the whole short run. Such a run
    is run again (LATE_ATTEMPTS). Only Poisson runs are judged so: at 64 closed-loop streams on 2 busy cores
    GuideLLM itself sends 0.2-0.3 s late (p95; TinyLlama shape, 2026-11-29), the same for every system, and the
    load is still its 64 streams."""
    delay = run.get("dispatch_delay_p95_s")
    if "rate" not in run or delay is None or delay <= DISPATCH_DELAY_LIMIT_S:
        return None      # a closed loop's load is its streams: a late send there is the load tool's own overhead
    return (f"GuideLLM sent its requests late (p95 dispatch delay {delay:.3g} s, over its own {DISPATCH_DELAY_LIMIT_S}"
            " s threshold): not the load asked for, so the run is not counted")


def run_guidellm(url: str, model: str, processor: Path, work: Path, name: str, timeout: float,
                 **load) -> dict:
    """One bounded GuideLLM run (guidellm_config's `load`); its parsed benchmark (parse_report). The scenario
    file, the report and GuideLLM's console go to work/name.{json,report.json,log}."""
    work.mkdir(parents=True, exist_ok=True)
    cfg, report, log = work / f"{name}.json", work / f"{name}.report.json", work / f"{name}.log"
    cfg.write_text(json.dumps(guidellm_config(url, model, processor, report, **load), indent=2))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with open(log, "w") as f:
        try:
            p = subprocess.run([str(guidellm_bin()), "run", "--scenario", str(cfg),
                                "--disable-console-interactive"], stdout=f, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env, timeout=timeout, preexec_fn=die_with_parent())
        except subprocess.TimeoutExpired:
            raise BenchError(f"GuideLLM did not finish within {timeout:.0f} s (log: {log})") from None
    if p.returncode != 0 or not report.is_file():
        tail = (log.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"GuideLLM exited with {p.returncode}: {tail} (log: {log})")
    runs = parse_report(json.loads(report.read_text()))
    if len(runs) != 1:
        raise BenchError(f"GuideLLM's report {report} holds {len(runs)} benchmarks, expected 1")
    return runs[0]


def _warm(url: str) -> None:
    """One short request: the server's first-request costs (allocations, caches) stay out of the runs."""
    from .client import stream_completion
    stream_completion(url, "Hello, my name is", 8, timeout=120.0)


def run(artifact: Path, peers: list[str], concurrency=CONCURRENCY, rates=(), threads: int | None = 2,
        repeats: int = 1, quick: bool = False, slo_ttft_ms: float = SLO_TTFT_MS, slo_itl_ms: float = SLO_ITL_MS,
        max_seconds: float | None = None, max_requests: int | None = None, log_dir: Path | None = None,
        progress=None) -> list[dict]:
    """`ortllm serve` on the artifact and one llama-server per peer (all up for the whole run), each loaded by
    GuideLLM at every concurrency level and Poisson rate, the systems alternating within each level, `repeats`
    times; every server stopped at the end (always). Rows {scenario "serve-guidellm", system, batch =
    concurrency (0 for a Poisson rate, then "rate"), metric, median, min, max, unit, ...}."""
    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    artifact, threads = Path(artifact), threads or 2
    model = model_of(artifact) or artifact.name           # the `model` ortllm serve answers to by default
    ggufs = {s: peer_gguf(s, model) for s in peers}          # every peer checked before anything starts
    guidellm_bin()
    if any(not s.startswith("llama-cpp-python") for s in ggufs):
        llama_server_bin()
    python = llama_cpp_python() if any(s.startswith("llama-cpp-python") for s in ggufs) else None
    max_seconds = max_seconds or (QUICK_MAX_SECONDS if quick else MAX_SECONDS)
    loads = [{"concurrency": int(c)} for c in sorted({int(c) for c in concurrency})] + \
        [{"rate": float(r)} for r in rates]
    work = Path(log_dir or tempfile.mkdtemp(prefix="ortllm-bench-guidellm-"))
    samples: dict[tuple, list[float]] = {}
    load_avg: dict[tuple, list[float]] = {}
    late_runs = 0                                          # runs GuideLLM sent late, run again (late_dispatch)
    with ExitStack() as stack:
        ortllm = stack.enter_context(ServeProcess(artifact, work / "ortllm-serve.log", threads=threads,
                                                  http_threads=max(64, 2 * max([1, *map(int, concurrency)])),
                                                  parallel=ORTLLM_PARALLEL))
        urls = {"ortllm": ortllm.url}
        for s, g in ggufs.items():
            urls[s] = stack.enter_context(LlamaServer(g, work / f"{s}.log", threads, ORTLLM_PARALLEL, model,
                                                      python if s.startswith("llama-cpp-python") else None)).url
        for url in urls.values():
            _warm(url)
        for r in range(repeats):
            for i, load in enumerate(loads):
                c, rate = load.get("concurrency"), load.get("rate")
                tag = f"c{c}" if rate is None else f"rate{rate:g}"
                cap = max_requests or (c * MAX_REQUESTS_PER_SLOT if rate is None else max(1, int(rate * max_seconds)))
                order = list(urls) if r % 2 == 0 else list(urls)[::-1]
                for system in order:
                    for attempt in range(LATE_ATTEMPTS):
                        la = os.getloadavg()[0]
                        got = run_guidellm(urls[system], model, artifact, work, f"{system}-{tag}-r{r}-a{attempt}",
                                           timeout=max_seconds + 300, max_seconds=max_seconds, max_requests=cap,
                                           slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms,
                                           validate=not system.startswith("llama-cpp-python"),   # no /health
                                           seed=run_seed(r, i, len(loads)), **load)
                        late = late_dispatch(got)
                        if not late:
                            break
                        late_runs += 1
                        progress(f"serve-guidellm {system} {tag} round {r + 1}/{repeats}, attempt {attempt + 1}/"
                                 f"{LATE_ATTEMPTS}: {late} (log: {work})")
                    if late:
                        continue
                    key = (system, c or 0, rate)
                    load_avg.setdefault(key, []).append(la)
                    for metric, v in got.items():
                        if metric in UNITS or metric.rsplit("_", 1)[0] in UNITS:
                            samples.setdefault((*key, metric), []).append(v)
                    progress(f"serve-guidellm {system} {tag} round {r + 1}/{repeats}: {got['completed']} done, "
                             f"{got['incomplete']} cut by the bound, {got['errors']:.0f} errors; "
                             f"{got['output_tokens_per_s']:.4g} tok/s, TTFT p99 {got.get('ttft_p99', float('nan')):.4g}"
                             f" ms; GuideLLM's p95 dispatch delay {got.get('dispatch_delay_p95_s', float('nan')):.2g}"
                             f" s; load average {la:.1f}")
    extra = {"slo_ttft_ms": slo_ttft_ms, "slo_itl_ms": slo_itl_ms, "prompt_tokens": PROMPT_TOKENS,
             "max_tokens": OUTPUT_TOKENS, "threads": threads, "parallel": ORTLLM_PARALLEL, "max_seconds": max_seconds,
             "load_tool": _guidellm_version(), "late_runs_discarded": late_runs}
    rows = []
    for (system, c, rate, metric), xs in samples.items():
        more = {"gguf_type": GGUF_TYPES[SYSTEMS[system]]} if system in SYSTEMS else {}
        if rate is not None:
            more["rate"] = rate
        rows.append(row(SCENARIO, system, c, metric, xs, unit(metric), load_average=load_avg[(system, c, rate)],
                        **more, **extra))
    return rows


def unit(metric: str) -> str:
    """ttft_p99 -> ms, goodput -> req/s, ..."""
    return UNITS.get(metric) or UNITS[metric.rsplit("_", 1)[0]]


def _guidellm_version() -> str:
    """"guidellm X.Y.Z", from its venv's metadata (the load tool each row names)."""
    try:
        p = subprocess.run([str(guidellm_bin().parent / "python"), "-c",
                            "import importlib.metadata as m; print(m.version('guidellm'))"],
                           capture_output=True, text=True, timeout=60)
        return f"guidellm {p.stdout.strip() or '?'}"
    except (OSError, subprocess.SubprocessError):
        return "guidellm ?"
