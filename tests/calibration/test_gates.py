"""Quality gates on SmolLM2-135M-Instruct, on held-out text, on every ops path.

Figures: paired against the same weights in fp32 on QUALITY_TOKENS held-out positions (tests/conftest.py), split
evenly over prose, code and chat from sources calibration never reads (calibration/heldout.py). A build's own
quality.json holds them for the ops path it was built on; on another path (these tests run on every path
tests/conftest.py isa_paths() names, on the same artifacts) the same windows are scored again in this process, so
every gate is checked on every path. The figures of each path, with their error bars, are in docs/quality.md.

DEFAULT_BAR: the default builds (`--quant int8`, `--quant int4`) hold KLD <= 0.005 and top-1 >= 95% in every
domain, the bar that picks the default int4 build (pipeline/build.py DEFAULT_LM_HEAD, DEFAULT_KV). GATES: each
build's gate on all domains together: PPL ratio, mean KLD, top-1 agreement.

`--kv fp8` lost its gate with the move to held-out text: it measures top-1 95.9% there (gate 96.0%; prose 95.0%,
KLD 0.011), where the calibration-like stream had given 96.6-96.9%, and an AVX2-only host had already measured
95.99% on that stream's 1,023 tokens. An e4m3 cache keeps 3 mantissa bits; the rotated int8 cache meets its own
gate with room (top-1 99.1%). fp8 stays an option, documented with its figures (docs/quality.md), like `--kv int4`;
the test below keeps the claim the docs make of it: the int8 cache is the better 8-bit cache in every domain.
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import GATE_BUILDS, QUALITY_TOKENS

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

DEFAULT_BAR = (0.005, 0.95)        # (max mean KLD, min top-1) in every domain
DEFAULT_BUILDS = ("int8", "int4")
GATES = {   # name -> (max PPL ratio, max mean KLD, min top-1 agreement), all domains together
    "int8": (1.003, 0.003, 0.975),
    "int4-b32": (1.04, None, 0.91),
    "int4": (1.04, None, 0.91),
    "kv-int8": (1.002, None, 0.985),
    "kv-fp16": (1.001, 0.0001, 0.995),   # measured: PPL 0.99998, KLD 0.000001, top-1 99.93% (docs/quality.md)
}
assert set(GATES) | {"kv-fp8", "kv-int4"} == set(GATE_BUILDS)


@pytest.fixture(scope="module")
def figures(smollm2_quantized, smollm2_engine):
    """name -> the fidelity section measured on this process's ops path."""
    from ortllm.calibration.eval import EvalOptions, run_fidelity
    from ortllm.calibration.quality import QUALITY_CTX
    from ortllm.runtime.artifact import load_artifact
    from ortllm.runtime.ops_library import ops_isa

    isa, out, rescore = ops_isa(), {}, []
    for name in [*GATES, "kv-fp8"]:
        q = json.loads((smollm2_quantized(name) / "quality.json").read_text())
        if q["isa"] == isa:
            out[name] = q["fidelity"]
        else:
            rescore.append(name)
    if rescore:
        opts = EvalOptions(suites=("fidelity",), tokens=QUALITY_TOKENS, ctx=QUALITY_CTX, progress=False)
        cands = [load_artifact(smollm2_quantized(n)) for n in rescore]
        for name, (fid, _) in zip(rescore, run_fidelity(cands, load_artifact(smollm2_engine), opts)):
            out[name] = fid
    for name, f in out.items():
        assert f["isa"] == isa, (name, f["isa"], isa)
        print(f"{name} on {isa}: " + "; ".join(
            f"{d} KLD {v['kld_mean']:.5f} top-1 {v['top1_agreement']:.4f} PPL {v['ppl_ratio']:.4f}"
            f"±{v['ppl_ratio_err']:.4f}" for d, v in [*f["domains"].items(), ("all", f)]))
    return out


def test_quality_json_is_on_heldout_text_with_a_small_error_bar(smollm2_quantized):
    q = json.loads((smollm2_quantized("int4") / "quality.json").read_text())
    f = q["fidelity"]
    assert set(f["domains"]) == {"prose", "code", "chat"} and f["tokens"] >= 4000
    assert all(v["tokens"] >= 1300 for v in f["domains"].values())
    assert f["ppl_ratio_err"] < 0.003, f
    assert all(len(s["sha256"]) == 64 for d in q["data"].values() for s in d["sources"])


@pytest.mark.parametrize("name", DEFAULT_BUILDS)
def test_default_builds_meet_the_bar_in_every_domain(figures, name):
    kld, top1 = DEFAULT_BAR
    for domain, f in figures[name]["domains"].items():
        assert f["kld_mean"] <= kld and f["top1_agreement"] >= top1, (name, domain, f)


@pytest.mark.parametrize("name", list(GATES))
def test_quality_gate(figures, name):
    f = figures[name]
    ppl, kld, top1 = GATES[name]
    assert f["ppl_ratio"] <= ppl, f
    assert kld is None or f["kld_mean"] <= kld, f
    assert f["top1_agreement"] >= top1, f


def test_int8_cache_beats_fp8_in_every_domain(figures):
    """Why the docs recommend --kv int8 over --kv fp8 (both 8-bit: the same bytes a token)."""
    i8, f8 = figures["kv-int8"]["domains"], figures["kv-fp8"]["domains"]
    for domain in i8:
        assert i8[domain]["kld_mean"] < f8[domain]["kld_mean"], domain
        assert i8[domain]["top1_agreement"] > f8[domain]["top1_agreement"], domain
