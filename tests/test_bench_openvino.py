"""OpenVINO GenAI as a peer of `ortllm bench` (bench/peers/openvino_driver.py, openvino_lora_driver.py): its own
venv and assets, its rows, its held-out quality and its LoRA adapters in the Zipf trace. The drivers' part needs
.venv-peers-ov and SmolLM2's exports (make bench-peers) and skips with the reason without them."""
from __future__ import annotations

import json

import numpy as np
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


def _log_softmax_at(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """log p(ids[i] | ids[:i]) for i = 1 .. n-1 from every position's logits [n, vocab]."""
    z = logits[:-1].astype(np.float64)
    z = z - z.max(1, keepdims=True)
    lse = np.log(np.exp(z).sum(1))
    return z[np.arange(len(ids) - 1), ids[1:]] - lse


def test_openvino_applies_a_peft_adapter_as_ortllm_does(smollm2_engine, tmp_path):
    """The OpenVINO trace driver loads our PEFT files with GenAI's own Adapter and switches to an adapter the way the
    replay does: the adapter's effect on every prompt token's log-probability (adapter - base, 63 positions) must
    follow ortllm's on the same adapter (fp32 engine against OpenVINO's int8 export of the same weights), in shape
    (correlation) and in size (the least-squares slope: alpha passed as PEFT's lora_alpha / r; a driver passing 1
    would give ~0.5)."""
    from ortllm.bench.synthetic_adapters import link_copy, write_peft_lora
    from ortllm.bench.trace_peers import OpenVinoTrace
    from ortllm.runtime.adapter_files import add_adapter
    from ortllm.runtime.artifact import read_manifest
    from ortllm.runtime.engine import Engine
    from tests.test_bench_lora_trace import _ours

    _need_openvino("openvino-int8")
    art = link_copy(smollm2_engine, tmp_path / "art")
    peft = write_peft_lora(tmp_path / "x", read_manifest(art).model, 16, seed=5, b_scale=0.05)
    add_adapter(art, peft, "x")
    ids = np.random.default_rng(1).integers(3, 49152, 64).tolist()
    with Engine.from_artifact(art, enable_prefix_cache=False, spec_max_tokens=0, threads=2) as engine:
        ours = {a: _log_softmax_at(_ours(engine, ids, a), ids) for a in (None, "x")}
    peer = OpenVinoTrace(art, {"x": peft}, tmp_path, threads=2, system="openvino-int8")
    theirs = {a: peer.prompt_logprobs(ids, a) for a in (None, "x")}
    mine, its = ours["x"] - ours[None], theirs["x"] - theirs[None]
    corr = float(np.corrcoef(mine, its)[0, 1])
    slope = float(mine @ its / (mine @ mine))
    print(f"adapter effect on log-probabilities: mean |ortllm| {np.abs(mine).mean():.3f}, corr {corr:.3f}, "
          f"slope {slope:.3f}")
    assert np.abs(mine).mean() > 0.05, "the adapter barely changes the log-probabilities"
    assert corr >= 0.9, corr
    assert 0.8 <= slope <= 1.25, slope


def test_trace_replays_on_openvino_both_ways(smollm2_engine):
    """A short saturated trace (8 requests over 4 adapters) on ortllm and on OpenVINO GenAI in both modes: every
    metric row, the ratios; one pipeline switches adapters (at least once: the trace asks for several), a pipeline
    per adapter never does."""
    from ortllm.bench.lora_trace import run_trace

    _need_openvino("openvino")
    rows = run_trace(smollm2_engine, 4, requests=8, rate=16.0, threads=2, base=False,
                     peers=["openvino", "openvino/pipelines"])
    by = {(r["system"], r["metric"]): r for r in rows}
    for system in ("ortllm", "openvino", "openvino (a pipeline per adapter)"):
        assert by[(system, "throughput")]["median"] > 0
        for m in ("ttft", "latency"):
            p50, p99 = by[(system, f"{m}_p50")]["median"], by[(system, f"{m}_p99")]["median"]
            assert 0 < p50 <= p99, (system, m, p50, p99)
        if system != "ortllm":
            assert by[(f"ortllm / {system}", "throughput_ratio")]["median"] > 0
            assert by[(system, "tokens_per_step")]["median"] >= 1
    assert by[("openvino", "adapter_switches")]["median"] >= 1
    assert by[("openvino (a pipeline per adapter)", "adapter_switches")]["median"] == 0


def test_trace_peer_names(tmp_path, monkeypatch):
    """--peers names of the adapter trace: llama.cpp GGUF systems, OpenVINO exports with an optional /switch or
    /pipelines; anything else is refused naming what is accepted, and a missing venv is a BenchError (run_trace turns
    it into a warning and runs without that peer)."""
    from ortllm.bench.errors import BenchError
    from ortllm.bench.trace_peers import trace_peer

    monkeypatch.setattr(runner, "OV_VENV", tmp_path / "no-ov")
    monkeypatch.setattr(runner, "PEERS_VENV", tmp_path / "no-peers")
    for bad in ("transformers", "openvino/fast", "llama.cpp/pipelines"):
        with pytest.raises(BenchError) as e:
            trace_peer(bad, tmp_path, {}, tmp_path, 2)
        assert "has no lora-trace driver" in str(e.value) and "/pipelines" in str(e.value)
    for missing in ("openvino-int8/pipelines", "ov-int8", "q4_0"):
        with pytest.raises(BenchError) as e:
            trace_peer(missing, tmp_path, {}, tmp_path, 2)
        assert "peer for this artifact" in str(e.value)
