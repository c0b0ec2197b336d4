"""Shared fixtures: real artifacts built once per test session, and the transformers references."""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # no model hub here: anything that tries must fail fast
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from ortllm.pipeline.recipes import get_recipe, locate_package_file
    return locate_package_file(get_recipe("smollm2-135m-instruct"))


# ORTLLM_TEST_ARTIFACTS=DIR (set by ci/run_tests.py for every job of `make test`): session artifacts are built
# once into DIR, named by recipe and options, by the first job that needs one (under a lock: the others wait for
# it; builds are atomic: a directory with a manifest.json is complete).
SHARED_ARTIFACTS = os.environ.get("ORTLLM_TEST_ARTIFACTS")


def shared_dir(tmp_path_factory, name: str, make) -> Path:
    """A session directory `name` (an artifact: it has a manifest.json) made by make(path) once: in the shared
    artifacts directory under make test (made beside it and moved into place when finished; the other jobs wait for
    it), else in this session's tmp."""
    if not SHARED_ARTIFACTS:
        out = tmp_path_factory.mktemp("artifacts") / name
        make(out)
        return out
    out = Path(SHARED_ARTIFACTS) / name
    if (out / "manifest.json").is_file():
        return out
    with open(out.with_name(out.name + ".lock"), "w") as lock:   # make test's jobs run two at a time: one builds,
        fcntl.flock(lock, fcntl.LOCK_EX)                           # the other waits for it (ci/run_tests.py)
        if not (out / "manifest.json").is_file():
            work = out.with_name(out.name + ".making")
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            make(work)
            work.rename(out)
    return out


UNMEASURED = "a test artifact whose quality no test reads: the in-build check was not run (tests/conftest.py)"


def _unmeasured(weights, art_dir, ref_dir, opts, ref_opts, tensor_report) -> dict:
    """The in-build quality check off (pipeline/build.py QualityCheck): quality.json keeps the per-tensor errors and
    says the fidelity check was skipped. The check is most of a tiny quantized build (~75 of 76 s, 2 cores)."""
    return {"build": asdict(opts), "reference": None, "fidelity": {}, "fidelity_skipped": UNMEASURED,
            "tensors": tensor_report}


def _build(tmp_path_factory, spec: str, measured: bool = True, **opts) -> Path:
    """spec built with BuildOptions(**opts) once per session (once per `make test`: shared_dir). measured=False: a
    quantized build without its in-build quality check, for tests that never read quality.json."""
    from ortllm.cli.build import build_artifact
    from ortllm.pipeline.build import BuildOptions, build
    key = ",".join(f"{k}={v}" for k, v in sorted({**opts, **({} if measured else {"unmeasured": True})}.items()))
    name = f"{spec}-{hashlib.sha256(key.encode()).hexdigest()[:12]}" if SHARED_ARTIFACTS else spec

    def make(out):
        if measured:
            build_artifact(spec, out, BuildOptions(**opts), log=lambda m: None)
        else:
            build(spec, out, BuildOptions(**opts), log=lambda m: None, quality_check=_unmeasured)
    return shared_dir(tmp_path_factory, name, make)


def isa_paths() -> list[str]:
    """The kernel paths the isa_paths tests run on, each in this process: the default path, and avx2 as well where
    the default is another (AVX-512 VNNI, AMX), so the vector code they share is checked on every host."""
    from ortllm.runtime.ops_library import ops_isa, ops_isas
    try:
        default, offered = ops_isa(), ops_isas()
    except Exception:   # noqa: BLE001 - no library: the tests that need it skip, saying why
        return []
    return [default] + (["avx2"] if default != "avx2" and "avx2" in offered else [])


def pytest_generate_tests(metafunc):
    """A test marked isa_paths runs once per isa_paths() path (an id of its own where there are several)."""
    paths = isa_paths()
    if len(paths) > 1 and metafunc.definition.get_closest_marker("isa_paths"):
        metafunc.parametrize("isa_path", paths, indirect=True)


@pytest.fixture(autouse=True)
def isa_path(request):
    """The kernel path of the sessions (engines, op graphs) a test makes: isa_paths()' path where the test is
    parametrized over them, else the default. Session- and module-scoped fixtures (artifacts and their build-time
    checks, references made once) take the default path; every path gives the same bits but the scalar exp."""
    path = getattr(request, "param", None)
    if path is None:
        yield None
        return
    from ortllm.runtime.ops_library import sessions_on
    with sessions_on(path):
        yield path


def pytest_report_header(config):
    """The ops' kernel path this session runs on by default, and every path the isa_paths tests take."""
    try:
        from ortllm.runtime.ops_library import ops_isa
        isa = ops_isa()
    except Exception as exc:   # noqa: BLE001 - the header must not stop the session; the tests say what is wrong
        return f"ortllm ops path: unknown ({exc})"
    forced = os.environ.get("ORTLLM_OPS_ISA")
    return (f"ortllm ops path: {isa}" + (f" (forced by ORTLLM_OPS_ISA={forced})" if forced else " (this CPU's best)")
            + f"; isa_paths tests on {', '.join(isa_paths())}")


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> Path:
    """llama-tiny-random, portable fp32, with the optimum-onnx export beside it."""
    return _build(tmp_path_factory, "llama-tiny-random", graph="portable", exporter="optimum")


@pytest.fixture(scope="session")
def tiny_weights():
    """llama-tiny-random's weights (ModelWeights), for the PEFT references (tests/reference/peft_lora.py)."""
    from ortllm.pipeline.sources import load_model
    return load_model("llama-tiny-random")[1]


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory):
    """opts -> llama-tiny-random built with BuildOptions(**opts), the in-build quality check off (no test reading
    it), once per session."""
    built = {}

    def get(**opts) -> Path:
        key = tuple(sorted(opts.items()))
        if key not in built:
            built[key] = _build(tmp_path_factory, "llama-tiny-random", measured=False, **opts)
        return built[key]
    return get


@pytest.fixture(scope="session")
def tiny_int4(tiny_build) -> Path:
    """llama-tiny-random as an int4 engine artifact, RTN b32 (QLinear: int8 LoRA stacks, batch-invariant to the bit),
    the in-build quality check off."""
    return tiny_build(graph="engine", quant="int4", block_size=32)


@pytest.fixture(scope="session")
def adapted(tmp_path_factory):
    """(base artifact, {name: PEFT adapter dir}) -> a new artifact: base's files hard-linked but the weights onnx
    reads (a DoRA adapter's base weights: tests/artifact_copies.py ONNX_READS) copied, and the adapters added, in
    that order."""
    from ortllm.runtime.adapter_files import add_adapter
    from tests.artifact_copies import ONNX_READS, linked_copy

    def make(base: Path, adapters: dict[str, Path]) -> Path:
        art = linked_copy(base, tmp_path_factory.mktemp("adapted") / "art", copied=ONNX_READS)
        for name, peft_dir in adapters.items():
            add_adapter(art, peft_dir, name)
        return art
    return make


@pytest.fixture(scope="session")
def smollm2_artifact(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct, portable fp32, with the optimum-onnx export beside it."""
    return _build(tmp_path_factory, "smollm2-135m-instruct", graph="portable", exporter="optimum")


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory) -> Path:
    """llama-tiny-random, engine graph, fp32 KV."""
    return _build(tmp_path_factory, "llama-tiny-random", graph="engine")


@pytest.fixture(scope="session")
def smollm2_engine(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct, engine graph (the default build), fp32 KV."""
    return _build(tmp_path_factory, "smollm2-135m-instruct", graph="engine")


@pytest.fixture(scope="session")
def gemma3_engine(tmp_path_factory) -> Path:
    """The real Gemma 3 270M (recipe gemma3-270m), engine graph, fp32 (tests/pipeline/test_gemma3.py,
    tests/runtime/test_gemma3_invariance.py)."""
    return _build(tmp_path_factory, "gemma3-270m", graph="engine")


@pytest.fixture(scope="session")
def gemma3_int8(tmp_path_factory) -> Path:
    """Gemma 3 270M, the default int8 build (QLinear), with a short calibration and in-build check."""
    return _build(tmp_path_factory, "gemma3-270m", quant="int8", calib_tokens=1024, quality_tokens=512)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf):
    """transformers' own GGUF loader (its dequantization and q/k un-permutation, not ours), fp32."""
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name,
                                                dtype=torch.float32).eval()


# SmolLM2 builds for the quality gates (tests/calibration) and the batch-invariance tests (tests/runtime),
# built once per session on first use. Each quantized build carries quality.json: the paired fidelity
# check against the same weights in fp32 on held-out text (calibration/heldout.py), run inside the build on
# QUALITY_TOKENS scored positions (the default: 1,365 per domain; full-size figures in docs/quality.md).
QUALITY_TOKENS = 4096

GATE_BUILDS = {
    "int8": dict(quant="int8"),     # the default: int8 compute with SmoothQuant (smooth.py), int8 head, fp16 KV
    "int4-b32": dict(quant="int4", block_size=32, algo="hqq", lm_head="int8", kv="fp32"),   # the weights alone
    "int4": dict(quant="int4"),                         # the default int4 build: RTN b32, int8 head, fp16 KV
    "kv-int8": dict(kv="int8"),
    "kv-fp16": dict(kv="fp16"),     # the fp32 cache at half the bytes: its gate leaves it nothing to lose
    "kv-fp8": dict(kv="fp8"),       # no gate on held-out text (tests/calibration/test_gates.py says why)
    "kv-int4": dict(kv="int4", quality_tokens=512),   # no gate: it fails the 8-bit caches' (docs/quality.md);
}                                                      # invariance tests only, so a short in-build check


@pytest.fixture(scope="session")
def smollm2_quantized(tmp_path_factory):
    """name -> artifact path, built on first use."""
    built = {}

    def get(name: str):
        if name not in built:
            built[name] = _build(tmp_path_factory, "smollm2-135m-instruct",
                                 **{"quality_tokens": QUALITY_TOKENS, **GATE_BUILDS[name]})
        return built[name]
    return get


@pytest.fixture(scope="session")
def harmony_tokenizer_dir(tmp_path_factory) -> Path:
    """o200k_harmony's tokenizer files as a gpt-oss HF directory without any gets them (pipeline/tiktoken_vocab.py),
    made once a session (~20 s)."""
    from ortllm.pipeline.tiktoken_vocab import hf_dir_tokenizer
    empty, out = tmp_path_factory.mktemp("gpt_oss_without_tokenizer"), tmp_path_factory.mktemp("o200k_harmony")
    info = hf_dir_tokenizer(empty, out, "gpt_oss", 201088)
    assert info.eos_token_ids == (200002, 199999, 200012) and info.vocab_size == 201088
    return out


@pytest.fixture(scope="session")
def harmony_encoding(tmp_path_factory):
    """openai-harmony's gpt-oss encoding, offline (tests/reference/harmony_ref.py)."""
    from tests.reference.harmony_ref import harmony_encoding
    return harmony_encoding(tmp_path_factory.mktemp("tiktoken_encodings"))


@pytest.fixture(scope="session")
def gpt_oss_harmony_artifact(tmp_path_factory, harmony_tokenizer_dir) -> Path:
    """A tiny random gpt-oss with o200k_harmony (tests/reference/harmony_ref.py), fp32 (~35 s to make)."""
    from tests.reference.harmony_ref import make_gpt_oss_artifact
    return shared_dir(tmp_path_factory, "gpt-oss-harmony-tiny",
                      lambda out: make_gpt_oss_artifact(out, harmony_tokenizer_dir))
