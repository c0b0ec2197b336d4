"""`ortllm eval`: report fields, plots, identical reruns, and the refusal of another model's reference."""
from __future__ import annotations

import json

import pytest

from ortllm.calibration.eval import EvalError, EvalOptions, evaluate
from ortllm.cli import main


def test_eval_cli_writes_report_and_plots(smollm2_quantized, smollm2_engine, tmp_path):
    out = tmp_path / "report"
    rc = main(["eval", str(smollm2_quantized("int4-b32")), "--reference", str(smollm2_engine), "--out", str(out),
               "--suite", "fidelity,humaneval", "--tokens", "255", "--ctx", "256", "--humaneval-n", "2",
               "--max-tokens", "48"])
    assert rc == 0
    r = json.loads((out / "report.json").read_text())
    assert {"kld_mean", "kld_p99", "top1_agreement", "ppl_ratio", "ppl_ratio_err", "tokens"} <= set(r["fidelity"])
    # 255 asked for: one window of 256 tokens (255 scored positions) per held-out domain
    assert r["fidelity"]["tokens"] == 3 * 255
    assert {d: v["tokens"] for d, v in r["fidelity"]["domains"].items()} == {"prose": 255, "code": 255, "chat": 255}
    assert set(r["fidelity"]["data"]) == {"prose", "code", "chat"}
    assert all(len(s["sha256"]) == 64 for d in r["fidelity"]["data"].values() for s in d["sources"])
    assert {"nll_per_token", "pass_at_1", "n"} <= set(r["humaneval"]) and r["humaneval"]["n"] == 2
    assert 0 < r["humaneval"]["nll_per_token"] < 5
    assert (out / "report.md").read_text().startswith("# ortllm eval")
    for png in ("kld_hist.png", "tensor_error.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_is_identical_on_rerun(smollm2_quantized, smollm2_engine, tmp_path):
    opts = EvalOptions(suites=("fidelity",), tokens=63, ctx=64, progress=False)
    a = evaluate(smollm2_quantized("kv-int8"), smollm2_engine, tmp_path / "a", opts)
    b = evaluate(smollm2_quantized("kv-int8"), smollm2_engine, tmp_path / "b", opts)
    assert a["fidelity"] == b["fidelity"]
    assert (tmp_path / "a" / "kld_hist.png").read_bytes() == (tmp_path / "b" / "kld_hist.png").read_bytes()


def test_reference_of_another_model_is_refused(tiny_engine, smollm2_engine, tmp_path):
    with pytest.raises(EvalError, match="is another model"):
        evaluate(tiny_engine, smollm2_engine, tmp_path, EvalOptions(suites=("fidelity",), tokens=16, ctx=16))


def test_bad_suite_is_one_line_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--reference", str(tmp_path), "--out", str(tmp_path),
                 "--suite", "vibes"]) == 1
    assert "--suite takes" in capsys.readouterr().err
