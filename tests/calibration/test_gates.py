"""Quality gates on SmolLM2-135M-Instruct: the issue's thresholds, with one recalibration (kv-fp8, below).

Figures come from each artifact's quality.json (paired against the same weights in fp32, conftest's
QUALITY_TOKENS tokens). The int8 gate checks the default int8 build: int8 compute (accuracy_level 4) with
SmoothQuant on the projections after a norm, which takes the full-size PPL ratio from 1.0047 (fails) to
passing (docs/quality.md). SmolLM2's weights already went through Q4_1 (block 32) in the GGUF, so the int4
block-32 figures sit on a grid the quantizer can reproduce. int4-b32-head4 is the default int4 build and holds the int4
gate with it: an int4 LM head (GPTQ with a searched grid; an RTN int4 head fails the gate, docs/quality.md, "int4 LM
head") and the rotated int8 KV cache.

kv-fp8 is recalibrated once, as the issue allows, on its first honest full-size run (16,384 tokens, ctx
2048, c5cee48: PPL ratio 1.0063, top-1 96.57%; docs/quality.md): the issue's 1.002 / 98.5% is out of reach
for an e4m3 cache (3 mantissa bits: on the same rotated keys its rounding error is several times int8's;
full-size mean KLD 0.0052 against int8's 0.0003), and the int8 cache is the one that meets it. The new
thresholds leave room for the noise of CI's 1023-token stream, which measured 1.0084 ± 0.0043 / KLD 0.0050 /
96.87% in one pytest session and 1.0118 ± 0.0050 / 0.0063 / 96.68% in the full suite of a clean clone (the
corpus text differs with what the session imported before; docs/quality.md), and still fail fp8 without the
rotation (full size: KLD 0.0091, top-1 95.91%).
"""
from __future__ import annotations

import json

import pytest

GATES = {   # name -> (max PPL ratio, max mean KLD, min top-1 agreement)
    "int8": (1.003, 0.003, 0.975),
    "int4-b32": (1.04, None, 0.91),
    "int4-b32-head4": (1.04, None, 0.91),   # the default int4 build (int4 head, int8 KV) holds the int4 gate
    "kv-int8": (1.002, None, 0.985),
    "kv-fp8": (1.015, 0.008, 0.960),    # recalibrated (the issue's: 1.002, None, 0.985), see above
}


@pytest.mark.parametrize("name", list(GATES))
def test_quality_gate(smollm2_quantized, name):
    art = smollm2_quantized(name)
    manifest = json.loads((art / "manifest.json").read_text())
    assert "quality.json" in manifest["files"]
    f = json.loads((art / "quality.json").read_text())["fidelity"]
    ppl, kld, top1 = GATES[name]
    assert f["ppl_ratio"] <= ppl, f
    assert kld is None or f["kld_mean"] <= kld, f
    assert f["top1_agreement"] >= top1, f
