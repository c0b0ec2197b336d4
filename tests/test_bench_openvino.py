"""OpenVINO GenAI as a peer of `ortllm bench` (bench/peers/openvino_driver.py): its own venv and assets, its rows
and its held-out quality. The driver's part needs .venv-peers-ov and SmolLM2's exports (make bench-peers) and skips
with the reason without them."""
from __future__ import annotations

import json

import pytest

from ortllm.bench import peer_runner as runner
from tests.test_cli import ortllm


def test_openvino_peers_run_in_their_own_venv(tmp_path, monkeypatch, capsys):
    """Each OpenVINO system reads its export under the recipe's assets and runs in OV_VENV (optimum-intel and the
    genai builder need different transformers); a missing one names the install command."""
    monkeypatch.delenv("ORTLLM_PEERS_ASSETS", raising=False)
    monkeypatch.setattr(runner, "PEERS_VENV", tmp_path / "venv")
    monkeypatch.setattr(runner, "OV_VENV", tmp_path / "ov")
    assets = tmp_path / "venv" / "models" / "tinyllama-1.1b-shape"
    for system, d in (("openvino", "openvino-int4"), ("ov-int8", "openvino-int8"),
                      ("openvino-int4-sym", "openvino-int4-sym"), ("openvino-awq", "openvino-int4-awq")):
        spec = runner.peer_spec(system, "tinyllama-1.1b-shape")
        assert spec.script == "openvino_driver.py" and spec.model_args == ["--model", str(assets / d)]
        assert spec.missing == f"no peers virtualenv at {tmp_path / 'ov'}"
    (tmp_path / "ov" / "bin").mkdir(parents=True)
    (tmp_path / "ov" / "bin" / "python").touch()
    assert runner.peer_spec("openvino", "tinyllama-1.1b-shape").missing == (
        f"no OpenVINO model at {assets / 'openvino-int4'}")
    assert runner.available(["openvino"], "tinyllama-1.1b-shape") == []
    assert "make bench-peers MODEL=tinyllama-1.1b-shape" in capsys.readouterr().err
    assert "AWQ" in runner.system_info("openvino-awq")["quant"]
    assert set(runner.OPENVINO_MODELS) <= set(runner.SYSTEMS)


def _need_openvino(*systems):
    specs = [runner.peer_spec(s, runner.DEFAULT_MODEL) for s in systems]
    missing = [f"{s.system} ({s.missing})" for s in specs if s.missing]
    if missing:
        pytest.skip(f"OpenVINO peers missing: {'; '.join(missing)}: make bench-peers PEERS_ONLY=openvino")


def test_openvino_driver_decodes_every_token(tmp_path):
    """The ContinuousBatchingPipeline driver on SmolLM2 int4 at a shrunk shape: B requests, each exactly `new`
    tokens (EOS ignored), a positive rate; the prefill row is seconds."""
    _need_openvino("openvino")
    rows = runner.run_peers(["openvino"], ["decode", "prefill"], batches=(2,), repeats=1, threads=2,
                            log_dir=tmp_path, shapes={"decode": (16, 8), "prefill": (32, 1)})
    by = {(r["scenario"], r["batch"]): r for r in rows}
    assert by[("decode", 2)]["median"] > 0 and by[("decode", 2)]["unit"] == "tok/s"
    assert 0 < by[("prefill", 1)]["median"] < 30 and by[("prefill", 1)]["quant"].startswith("int4 asymmetric")


def test_openvino_logits_against_the_reference(smollm2_quantized, smollm2_engine, tmp_path):
    """The exported IR's logits of every position (plain openvino, state reset per window): int8 weights are close
    to the fp32 reference (measured on 1,533 positions: KLD 0.0071, top-1 96.5%)."""
    _need_openvino("openvino-int8")
    p = ortllm("bench", smollm2_quantized("kv-int8"), "--scenario", "quality", "--peers", "openvino-int8",
               "--reference", smollm2_engine, "--quality-tokens", "64", "--threads", "2", "--out", tmp_path,
               timeout=900)
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    q = {(r["system"], r["domain"], r["metric"]): r["median"] for r in rows}
    assert q[("openvino-int8", "all", "kld_mean")] < 0.05, q
    assert q[("openvino-int8", "all", "top1_agreement")] > 0.85, q
