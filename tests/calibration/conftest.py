"""SmolLM2 builds for the quality gates, session-scoped; the fp32 reference is the shared `smollm2_engine`.

Each quantized build carries quality.json: the paired fidelity check against the same weights in fp32,
run inside the build. The gate tests read it (QUALITY_TOKENS scored tokens, a reduced count for CI;
the full-size figures are in docs/quality.md with their commands).
"""
from __future__ import annotations


# GATE_BUILDS, QUALITY_TOKENS and the session fixture `smollm2_quantized` live in tests/conftest.py (the
# batch-invariance tests of tests/runtime use the same builds).
from tests.conftest import GATE_BUILDS, QUALITY_TOKENS  # noqa: E402,F401
