"""SmolLM2 builds for the quality gates, session-scoped; the fp32 reference is the shared `smollm2_engine`.

Each quantized build carries quality.json: the paired fidelity check against the same weights in fp32,
run inside the build. The gate tests read it (QUALITY_TOKENS scored tokens, a reduced count for CI;
the full-size figures are in docs/quality.md with their commands).
"""
from __future__ import annotations

import pytest

QUALITY_TOKENS = 1024

GATE_BUILDS = {
    "int8": dict(quant="int8"),                         # the default: int8 compute with SmoothQuant (smooth.py)
    "int4-b32": dict(quant="int4", block_size=32, algo="hqq", lm_head="int8"),
    "kv-int8": dict(kv="int8"),
    "kv-fp8": dict(kv="fp8"),
}


@pytest.fixture(scope="session")
def smollm2_quantized(tmp_path_factory):
    """name -> artifact path, built on first use."""
    from ortllm.cli.build import build_artifact as build
    from ortllm.pipeline.build import BuildOptions

    built = {}

    def get(name: str):
        if name not in built:
            out = tmp_path_factory.mktemp("quantized") / name
            build("smollm2-135m-instruct", out, BuildOptions(quality_tokens=QUALITY_TOKENS, **GATE_BUILDS[name]),
                  log=lambda m: None)
            built[name] = out
        return built[name]
    return get
