"""Shared fixtures: real artifacts built once per test session, and the transformers references."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # no model hub here: anything that tries must fail fast
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from ortllm.pipeline.recipes import get_recipe, locate_package_file
    return locate_package_file(get_recipe("smollm2-135m-instruct"))


def _build(tmp_path_factory, spec: str, **opts) -> Path:
    from ortllm.cli.build import build_artifact
    from ortllm.pipeline.build import BuildOptions
    out = tmp_path_factory.mktemp("artifacts") / spec
    build_artifact(spec, out, BuildOptions(**opts), log=lambda m: None)
    return out


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> Path:
    """llama-tiny-random, portable fp32, with the optimum-onnx export beside it."""
    return _build(tmp_path_factory, "llama-tiny-random", graph="portable", exporter="optimum")


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
def smollm2_hf(smollm2_gguf):
    """transformers' own GGUF loader (its dequantization and q/k un-permutation, not ours), fp32."""
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name,
                                                dtype=torch.float32).eval()


# SmolLM2 builds for the quality gates (tests/calibration) and the batch-invariance tests (tests/runtime),
# built once per session on first use. Each quantized build carries quality.json: the paired fidelity
# check against the same weights in fp32, run inside the build on QUALITY_TOKENS tokens (reduced for CI;
# full-size figures in docs/quality.md with their commands).
QUALITY_TOKENS = 1024

GATE_BUILDS = {
    "int8": dict(quant="int8"),                         # the default: int8 compute with SmoothQuant (smooth.py)
    "int4-b32": dict(quant="int4", block_size=32, algo="hqq", lm_head="int8", kv="fp32"),   # the weights alone
    "int4-b32-head4": dict(quant="int4", block_size=32),   # the default int4 build: int4 head (GPTQ, searched grid),
                                                            # int8 KV
    "kv-int8": dict(kv="int8"),
    "kv-fp8": dict(kv="fp8"),
    "kv-int4": dict(kv="int4"),     # no gate: it fails the 8-bit caches' (docs/quality.md); invariance tests only
}


@pytest.fixture(scope="session")
def smollm2_quantized(tmp_path_factory):
    """name -> artifact path, built on first use."""
    built = {}

    def get(name: str):
        if name not in built:
            built[name] = _build(tmp_path_factory, "smollm2-135m-instruct", quality_tokens=QUALITY_TOKENS,
                                 **GATE_BUILDS[name])
        return built[name]
    return get
