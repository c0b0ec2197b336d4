"""`ortllm bench --reference`: held-out quality beside speed, and the best peer named twice (fastest; fastest at
quality). The peers' part needs .venv-peers (make bench-peers) and skips with the reason without it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ortllm.bench import peer_runner as runner
from ortllm.bench.errors import BenchError
from ortllm.bench.quality import beside, quality_rows
from ortllm.bench.results import markdown_table, row
from ortllm.bench.scenarios import select
from ortllm.calibration.fidelity import PairedStats
from tests.test_cli import assert_user_error, ortllm

DOMAINS = ("prose", "code", "chat")


def _quality(system: str, kld: float, top1: float = 0.95, ppl: float = 1.01) -> list[dict]:
    out = []
    for domain in ("all", *DOMAINS):
        for metric, v, unit in (("kld_mean", kld, "nats"), ("top1_agreement", top1, "fraction"),
                                ("ppl_ratio", ppl, "ratio")):
            out.append(row("quality", system, 1, metric, [v], unit, domain=domain, tokens=1533, err=0.001))
    return out


def _speed(scenario: str, system: str, value: float, batch: int = 1) -> dict:
    _, _, metric, unit = runner.SCENARIO_SHAPES[scenario]
    return row(scenario, system, batch, metric, [value * 0.98, value, value * 1.01], unit)


# held-out KLD as measured on SmolLM2 (docs/quality.md): the fastest peers are the worse models
KLD = {"ortllm": 0.004, "llama.cpp-q4_0": 0.297, "llama.cpp": 0.0032, "onnxruntime-genai": 0.386,
       "transformers": 0.0}
DECODE = {"ortllm": 300.0, "llama.cpp-q4_0": 400.0, "llama.cpp": 150.0, "onnxruntime-genai": 350.0,
          "transformers": 25.0}
PREFILL = {"ortllm": 0.2, "llama.cpp-q4_0": 0.15, "llama.cpp": 1.0, "onnxruntime-genai": 0.4, "transformers": 0.7}


def _run_rows(with_quality: bool = True) -> list[dict]:
    rows = [_speed("decode", s, v) for s, v in DECODE.items()] + [_speed("prefill", s, v) for s, v in PREFILL.items()]
    rows.append(row("decode", "ortllm", 1, "python_share_of_step", [0.02], "fraction"))
    if with_quality:
        rows += [r for s, k in KLD.items() for r in _quality(s, k)]
    return beside(rows)


def test_best_peer_is_named_fastest_and_fastest_at_quality():
    best, notes = runner.best_peers(_run_rows())
    assert notes == []
    by = {(r["scenario"], r["system"]): r for r in best}
    fastest, good = by[("decode", runner.FASTEST)], by[("decode", runner.AT_QUALITY)]
    assert fastest["peer"] == "llama.cpp-q4_0" and fastest["median"] == pytest.approx(300 / 400)
    # limit 1.5 x 0.004 = 0.006: Q4_1 (0.0032) and transformers (0.0) qualify; Q4_1 is the faster of them
    assert good["peer"] == "llama.cpp" and good["median"] == pytest.approx(2.0)
    assert good["kld_limit"] == pytest.approx(0.006) and good["peer_kld_mean"] == 0.0032
    assert fastest["unit"] == good["unit"] == "x" and fastest["min"] <= fastest["median"] <= fastest["max"]
    # seconds: lower is better, the ratio is peer / ortllm
    p_fast, p_good = by[("prefill", runner.FASTEST)], by[("prefill", runner.AT_QUALITY)]
    assert p_fast["peer"] == "llama.cpp-q4_0" and p_fast["median"] == pytest.approx(0.15 / 0.2)
    assert p_good["peer"] == "transformers" and p_good["median"] == pytest.approx(0.7 / 0.2)
    assert p_good["min"] <= p_good["median"] <= p_good["max"]


def test_best_peer_at_quality_says_why_it_is_missing():
    best, notes = runner.best_peers(_run_rows(with_quality=False))
    assert {r["system"] for r in best} == {runner.FASTEST}
    assert len(notes) == 2 and all("--reference" in n for n in notes), notes
    rows = _run_rows()
    for r in rows:                       # no peer within 1.5x ortllm's KLD
        if r.get("quality") and r["system"] != "ortllm":
            r["quality"] = {**r["quality"], "kld_mean": 0.05}
    best, notes = runner.best_peers(rows)
    assert {r["system"] for r in best} == {runner.FASTEST}
    assert all("within 1.5x ortllm's (0.0040)" in n for n in notes), notes


def test_speed_table_has_quality_columns():
    table = markdown_table(_run_rows())
    lines = table.splitlines()
    assert lines[0].endswith("| unit | KLD | top-1 | PPL ratio |")
    assert "| decode | llama.cpp-q4_0 | 1 | decode_tokens_per_s | 400 |" in table
    line = next(x for x in lines if x.startswith("| decode | llama.cpp-q4_0 |"))
    assert line.endswith("| 0.2970 | 95.0% | 1.0100 |")
    share = next(x for x in lines if "python_share_of_step" in x)     # no quality of its own
    assert share.endswith("|  |  |  |")
    # the quality table: one line per system, all domains then each one
    head = next(x for x in lines if x.startswith("| system (against the fp32 reference)"))
    assert "prose: KLD / top-1 | code: KLD / top-1 | chat: KLD / top-1" in head
    assert "| llama.cpp | 1533 | 0.0032 | 95.0% | 1.0100 +- 0.0010 | 0.0032 / 95.0% |" in table
    plain = markdown_table(_run_rows(with_quality=False))
    assert "| no reference | no reference | no reference |" in plain and "system (against" not in plain


def test_quality_rows_carry_their_standard_errors():
    rng = np.random.default_rng(0)
    per = {}
    for d in DOMAINS:
        st = PairedStats()
        ref = rng.normal(size=(200, 50))
        st.add(ref + 0.3 * rng.normal(size=ref.shape), ref, rng.integers(0, 50, 200))
        per[d] = st
    rows = quality_rows("llama.cpp", per, 201, "/ref", gguf_type="Q4_1")
    assert len(rows) == 4 * 3
    assert [(r["domain"], r["metric"]) for r in rows[:3]] == [("all", m) for m in
                                                             ("kld_mean", "top1_agreement", "ppl_ratio")]
    for r in rows:
        assert r["scenario"] == "quality" and r["gguf_type"] == "Q4_1" and r["ctx"] == 201
        assert r["min"] < r["median"] < r["max"] and r["err"] > 0
        assert r["tokens"] == (600 if r["domain"] == "all" else 200)
    kld = {r["domain"]: r for r in rows if r["metric"] == "kld_mean"}
    assert kld["all"]["median"] == pytest.approx(np.mean([kld[d]["median"] for d in DOMAINS]))
    assert kld["all"]["err"] < min(kld[d]["err"] for d in DOMAINS)        # 3x the positions


def test_reference_adds_quality_and_quality_needs_a_reference(tmp_path):
    assert select(["decode"], ["llama.cpp"], tmp_path) == ["decode", "quality"]
    assert select([], ["llama.cpp"], tmp_path) == ["decode", "prefill", "long-context", "quality"]
    assert select(["quality"], ["llama.cpp"], tmp_path) == ["quality"]          # quality of the peers alone
    assert select(["serve"], [], tmp_path) == ["serve"]
    with pytest.raises(BenchError, match="needs --reference FP32_ARTIFACT"):
        select(["quality"], [])
    p = ortllm("bench", tmp_path, "--scenario", "quality", "--out", tmp_path / "out")
    assert_user_error(p, "--scenario quality needs --reference")


def test_quantized_or_foreign_reference_is_one_line(smollm2_quantized, smollm2_engine, tiny_engine, tmp_path):
    art = smollm2_quantized("kv-int8")
    p = ortllm("bench", smollm2_engine, "--scenario", "quality", "--reference", art, "--out", tmp_path)
    assert_user_error(p, "is itself quantized", "--quant fp32 --kv fp32")
    p = ortllm("bench", tiny_engine, "--scenario", "quality", "--reference", smollm2_engine, "--out", tmp_path)
    assert_user_error(p, "is another model")


@pytest.fixture(scope="module")
def quality_run(smollm2_quantized, smollm2_engine, tmp_path_factory):
    """ortllm alone (no peers) against the fp32 reference: one 512-token window per held-out domain."""
    out = tmp_path_factory.mktemp("bench-quality")
    p = ortllm("bench", smollm2_quantized("kv-int8"), "--scenario", "quality", "--reference", smollm2_engine,
               "--quality-tokens", "64", "--threads", "2", "--out", out, timeout=600)
    assert p.returncode == 0, p.stderr
    return out, json.loads((out / "results.json").read_text()), p


def test_quality_scenario_rows_and_data(quality_run):
    out, doc, p = quality_run
    rows = doc["results"]
    assert {(r["system"], r["domain"], r["metric"]) for r in rows} == {
        ("ortllm", d, m) for d in ("all", *DOMAINS) for m in ("kld_mean", "top1_agreement", "ppl_ratio")}
    q = {(r["domain"], r["metric"]): r for r in rows}
    assert q[("all", "kld_mean")]["tokens"] == 3 * 511 and q[("prose", "kld_mean")]["tokens"] == 511
    assert q[("all", "kld_mean")]["build"]["kv"] == "int8"
    # the int8 KV cache against fp32 (docs/quality.md: KLD ~0.001): small, but not zero
    assert 0 < q[("all", "kld_mean")]["median"] < 0.02 and q[("all", "top1_agreement")]["median"] > 0.9
    assert 0.98 < q[("all", "ppl_ratio")]["median"] < 1.05
    data = doc["quality_data"]
    assert set(data) == set(DOMAINS) and all(d["windows"] == 1 and d["ctx"] == 512 for d in data.values())
    assert all(len(s["sha256"]) == 64 for d in data.values() for s in d["sources"])
    md = (out / "results.md").read_text()
    assert "| system (against the fp32 reference) | positions |" in md and "| ortllm | 1533 |" in md


# ---------------------------------------------------------------- with the peers (.venv-peers)

def _need_peers(*systems):
    spec = [runner.peer_spec(s, runner.DEFAULT_MODEL) for s in systems]
    missing = [f"{s.system} ({s.missing})" for s in spec if s.missing]
    if missing:
        pytest.skip(f"peers missing: {'; '.join(missing)}: make bench-peers")


def test_peers_logits_against_the_reference(smollm2_quantized, smollm2_engine, tmp_path):
    """Every peer's logits through its driver: transformers fp32 is the same model as our fp32 reference (two
    implementations: KLD ~0, top-1 ~100%); llama.cpp's Q4_1 GGUF is what SmolLM2 ships, so it too is close."""
    _need_peers("transformers", "llama.cpp")
    p = ortllm("bench", smollm2_quantized("kv-int8"), "--scenario", "quality", "--peers", "transformers,llama.cpp",
               "--reference", smollm2_engine, "--quality-tokens", "64", "--threads", "2", "--out", tmp_path,
               timeout=900)
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    q = {(r["system"], r["domain"], r["metric"]): r["median"] for r in rows}
    assert q[("transformers", "all", "kld_mean")] < 1e-3 and q[("transformers", "all", "top1_agreement")] > 0.99
    assert q[("llama.cpp", "all", "kld_mean")] < 0.05 and q[("llama.cpp", "all", "top1_agreement")] > 0.85
    assert next(r for r in rows if r["system"] == "llama.cpp")["gguf_type"] == "Q4_1"
    assert not list((tmp_path / "peer-logs").glob("quality-logits-*"))        # the logits files are gone


def test_speed_quality_plot(tmp_path):
    from ortllm.bench import plots
    if not plots.available():
        pytest.skip("matplotlib is not installed: pip install matplotlib")
    assert plots.write_plots(tmp_path, _run_rows()) == ["decode_throughput.png", "speed_quality.png"]
    assert (tmp_path / "speed_quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "plain").mkdir()
    assert plots.write_plots(tmp_path / "plain", _run_rows(with_quality=False)) == ["decode_throughput.png"]
