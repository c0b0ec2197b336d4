"""GPTQ: against RTN on the output error it minimises, against a plain one-column-at-a-time loop, the
activation capture against a NumPy forward of the first layer norm, and a tiny end-to-end build."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from ortllm.cli.build import build_artifact as build
from ortllm.pipeline.build import BuildOptions
from ortllm.pipeline.calib_activations import Calibration
from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.gptq import DAMP, gptq_quantize
from ortllm.pipeline.quantize import QuantPlan, dequantize, make_quantizer
from ortllm.pipeline.sources import load_model


def _layer(seed: int, n: int = 64, k: int = 256, t: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """W [n, k] and inputs X [t, k] with correlated, unevenly scaled features (as after an RMSNorm)."""
    rng = np.random.default_rng(seed)
    mix = np.eye(k) + 0.8 * rng.standard_normal((k, k)) / np.sqrt(k)
    x = (rng.standard_normal((t, k)) @ mix * rng.uniform(0.2, 3.0, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 0.1, (n, 1))).astype(np.float32)
    return w, x


def _hessian(x: np.ndarray) -> np.ndarray:
    return 2.0 * x.T.astype(np.float64) @ x / len(x)


def _out_err(x: np.ndarray, w: np.ndarray, w_hat: np.ndarray) -> float:
    return float(np.linalg.norm(x @ (w_hat - w).T) / np.linalg.norm(x @ w.T))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block_size", [32, 128])
def test_gptq_output_error_not_above_rtn(bits, symmetric, block_size):
    """On the calibration inputs themselves GPTQ's ||X W^T - X W_q^T|| is below RTN's (same grid family),
    while its weight error is above (it trades one for the other); out_rel is that output error."""
    w, x = _layer(bits * 100 + block_size + symmetric)
    g = gptq_quantize(w, _hessian(x), bits, block_size, symmetric)
    r = make_quantizer("rtn", bits, block_size, symmetric).quantize(w)
    assert (g.offsets is None) == symmetric and g.scales.shape == r.scales.shape and g.data.shape == r.data.shape
    e_g, e_r = _out_err(x, w, dequantize(g)), _out_err(x, w, dequantize(r))
    assert g.out_rel == pytest.approx(e_g, rel=1e-3)
    assert e_g <= 0.9 * e_r, (e_g, e_r)
    assert g.rms_rel >= r.rms_rel


def _plain_gptq(w: np.ndarray, h: np.ndarray, bits: int, block_size: int, symmetric: bool) -> np.ndarray:
    """The paper's Algorithm 1 without lazy batches, in float64: one column at a time over the whole matrix;
    the block grid from the updated weights when the loop enters a block. Returns the dequantized W."""
    n, k = w.shape
    h = h + DAMP * np.mean(np.diag(h)) * np.eye(k)
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    mid, qmax = 1 << (bits - 1), (1 << bits) - 1
    w, out = w.astype(np.float64), np.zeros((n, k))
    for j in range(k):
        if j % block_size == 0:
            blk = w[:, j:j + block_size]
            if symmetric:
                scale = np.abs(blk).max(1) / (mid - 1)
                scale = np.where(scale == 0, 1, scale).astype(np.float32)
                lo = -mid * scale
            else:
                scale = ((blk.max(1) - blk.min(1)) / qmax).astype(np.float32)
                scale = np.where(scale == 0, 1, scale)
                lo = (blk.min(1) + mid * scale).astype(np.float16).astype(np.float64) - mid * scale
        out[:, j] = np.clip(np.rint((w[:, j] - lo) / scale), 0, qmax) * scale + lo
        err = (w[:, j] - out[:, j]) / u[j, j]
        w[:, j + 1:] -= np.outer(err, u[j, j + 1:])
    return out


@pytest.mark.parametrize("symmetric", [True, False])
def test_gptq_matches_the_plain_column_loop(symmetric):
    """Lazy batches (chunks of 128), float32 and the per-block grid give what the plain loop gives: the same
    codes but for rounding ties flipped by float32, the same output error."""
    w, x = _layer(7, n=32, k=320)                   # 320: three chunks, the last partial
    h = _hessian(x)
    got = dequantize(gptq_quantize(w, h, 4, 64, symmetric))
    ref = _plain_gptq(w, h, 4, 64, symmetric)
    step = np.abs(ref).max() / 7
    assert np.mean(np.abs(got - ref) < 1e-3 * step) > 0.99
    assert _out_err(x, w, got) == pytest.approx(_out_err(x, w, ref), rel=5e-3)


@pytest.mark.parametrize("search", [False, True])
def test_gptq_dead_inputs_and_a_partial_block(search):
    """An input no calibration token excites keeps its weights (quantized on the grid, not zeroed; a searched grid,
    which weighs it by the dampening alone, may clip it by up to one step), and K = 200 (not a multiple of 64)
    packs like RTN: zero-padded last block."""
    w, x = _layer(11, n=16, k=200)
    x[:, [3, 150]] = 0
    q = gptq_quantize(w, _hessian(x), 4, 64, False, search=search)
    w_hat = dequantize(q)
    assert w_hat.shape == w.shape and np.isfinite(w_hat).all()
    assert q.data.shape == (16, 4, 32)
    step = q.scales.reshape(16, 4)
    for col in (3, 150):
        assert np.all(np.abs(w_hat[:, col] - w[:, col]) <= step[:, col // 64] * (1.0 if search else 0.5) + 1e-3)


class _FakeCalibration:
    def __init__(self, x):
        self.h, self.asked = _hessian(x), []

    def hessian(self, name):
        self.asked.append(name)
        return self.h


def test_plan_routes_gptq_and_keeps_an_int8_head_rtn():
    w, x = _layer(3, n=48, k=64)
    cal = _FakeCalibration(x)
    plan = QuantPlan(quant="int4", lm_head="int8", algo="gptq", block_size=32, calibration=cal)
    assert plan.needs_calibration
    plan.quantize("model.layers.0.mlp.up_proj.weight", w)
    plan.quantize("lm_head.weight", w)
    assert plan.report["model.layers.0.mlp.up_proj.weight"]["algo"] == "gptq"
    assert "out_rel" in plan.report["model.layers.0.mlp.up_proj.weight"]
    assert plan.report["lm_head.weight"]["algo"] == "rtn" and plan.report["lm_head.weight"]["bits"] == 8
    assert cal.asked == ["model.layers.0.mlp.up_proj.weight"]
    sym = QuantPlan(quant="int4", algo="gptq", symmetric=True, calibration=cal)
    assert sym.quantize("model.layers.0.mlp.up_proj.weight", w).offsets is None
    assert sym.report["model.layers.0.mlp.up_proj.weight"]["algo"] == "gptq"
    assert not QuantPlan(quant="fp32", lm_head="int8", algo="gptq").needs_calibration
    with pytest.raises(BuildError, match="needs calibration activations") as e:
        QuantPlan(quant="int4", algo="gptq").quantize("model.layers.0.mlp.up_proj.weight", w)
    assert "\n" not in str(e.value)


def test_plan_routes_the_head_algo_apart_from_the_body():
    """An int4 head is GPTQ'd (searched grid) by default whatever the body's --algo: only the head asks for (and
    captures) calibration inputs, so an RTN body stays RTN (exact on SmolLM2's Q4_1 grid); --lm-head-algo picks
    another; an int8 head stays RTN whatever the head algo."""
    w, x = _layer(4, n=48, k=64)
    for algo in ("rtn", "hqq"):
        cal = _FakeCalibration(x)
        plan = QuantPlan(quant="int4", lm_head="int4", algo=algo, block_size=32, calibration=cal)
        assert plan.calibration_names == ("lm_head.weight",)
        plan.quantize("model.layers.0.mlp.up_proj.weight", w)
        plan.quantize("lm_head.weight", w)
        assert plan.report["model.layers.0.mlp.up_proj.weight"]["algo"] == algo
        head = plan.report["lm_head.weight"]
        assert head["algo"] == "gptq" and "out_rel" in head and head["grid"].startswith("weighted search")
        assert cal.asked == ["lm_head.weight"]
    rtn_head = QuantPlan(quant="int4", lm_head="int4", lm_head_algo="rtn")
    assert not rtn_head.needs_calibration
    rtn_head.quantize("lm_head.weight", w)
    assert rtn_head.report["lm_head.weight"]["algo"] == "rtn" and "grid" not in rtn_head.report["lm_head.weight"]
    assert QuantPlan(quant="int4", lm_head="int4", algo="gptq", lm_head_algo="rtn").calibration_names is None
    assert not QuantPlan(quant="int4", lm_head="int8", lm_head_algo="gptq").needs_calibration
    assert QuantPlan(quant="fp32", lm_head="int4", algo="gptq").calibration_names == ("lm_head.weight",)
    with pytest.raises(BuildError, match="--lm-head-algo must be one of"):
        QuantPlan(quant="int4", lm_head="int4", lm_head_algo="awq")


def test_capture_matches_a_numpy_first_layer(tmp_path):
    """H of layer 0's q|k|v input is 2/n sum x x^T of RMSNorm(embedding) (a NumPy forward); capturing in one
    pass or one input per pass (a tiny memory budget) gives the same Hessians, and a capture restricted to the
    head's input the same head Hessian."""
    _, weights = load_model("llama-tiny-random")
    cfg, t = weights.config, weights.tensors
    one = Calibration(weights, 300, tmp_path / "one", log=lambda m: None)
    try:
        h = one.hessian("model.layers.0.self_attn.k_proj.weight")
        ids = np.concatenate([np.asarray(win) for win in one.data.windows])
        assert len(ids) == 300 and [len(win) for win in one.data.windows] == [256, 44]
        e = t["model.embed_tokens.weight"][ids].astype(np.float64)
        norm_w = t["model.layers.0.input_layernorm.weight"]
        xn = e / np.sqrt(np.mean(e * e, -1, keepdims=True) + cfg.rms_norm_eps) * norm_w
        np.testing.assert_allclose(h, 2.0 * xn.T @ xn / 300, rtol=1e-4, atol=1e-6 * np.abs(h).max())
        names = ["model.layers.1.mlp.down_proj.weight", "lm_head.weight", "model.layers.0.self_attn.o_proj.weight"]
        full = {n: one.hessian(n) for n in names}
        assert one.passes == 1
        assert full["model.layers.1.mlp.down_proj.weight"].shape == (cfg.intermediate_size,) * 2
    finally:
        one.close()
    assert not (tmp_path / "one").exists()
    small = Calibration(weights, 300, tmp_path / "small", budget_bytes=1, log=lambda m: None)
    try:
        assert len(small.groups) == 4 * cfg.num_layers + 1
        for n in names:
            np.testing.assert_allclose(small.hessian(n), full[n], rtol=1e-6)
        assert small.passes == 3
    finally:
        small.close()
    head = Calibration(weights, 300, tmp_path / "head", log=lambda m: None, names=("lm_head.weight",))
    try:       # a GPTQ head alone fetches and sums only the final norm's output
        assert head.order == ["/lm_head/Gemm"] and head.groups == [["/lm_head/Gemm"]]
        np.testing.assert_allclose(head.hessian("lm_head.weight"), full["lm_head.weight"], rtol=1e-6)
        with pytest.raises(BuildError, match="no calibration input for tensor model.layers.0"):
            head.hessian("model.layers.0.self_attn.o_proj.weight")
    finally:
        head.close()
    diag = Calibration(weights, 300, tmp_path / "diag", budget_bytes=1, log=lambda m: None, diagonal_only=True)
    try:       # SmoothQuant alone: the channels' RMS from sums of squares, every input in one pass, no Hessian
        for n in names:
            np.testing.assert_allclose(diag.channel_rms(n), np.sqrt(np.diag(full[n]) / 2.0), rtol=1e-5)
        assert diag.passes == 1
        with pytest.raises(RuntimeError, match="channel_rms only"):
            diag.hessian(names[0])
    finally:
        diag.close()


def test_gptq_tiny_build(tmp_path):
    """llama-tiny-random int4 GPTQ with an int4 LM head (GPTQ'd from the final norm output): every projection
    MatMulNBits, each tensor reported at 4 bits with its calibration output error (and the embedding's int8 gather
    copy, RTN: a quantized head means no fp32 table stays resident), the calibration identity in the manifest
    and quality.json, no scratch directory left."""
    out = tmp_path / "tiny-gptq"
    opts = BuildOptions(quant="int4", algo="gptq", block_size=16, lm_head="int4", quality_tokens=64, calib_tokens=512)
    manifest = build("llama-tiny-random", out, opts, log=lambda m: None)
    q = json.loads((out / "quality.json").read_text())
    embed = q["tensors"].pop("model.embed_tokens.weight")
    assert embed["bits"] == 8 and embed["algo"] == "rtn"
    assert len(q["tensors"]) == 7 * 2 + 1
    assert all(v["bits"] == 4 and v["algo"] == "gptq" and 0 < v["out_rel"] < 0.2 for v in q["tensors"].values())
    assert q["fidelity"]["tokens"] == 3 * 64 and q["fidelity"]["top1_agreement"] > 0.5
    assert q["calibration"]["tokens"] == 512 and len(q["calibration"]["sha256"]["tokens"]) == 64
    assert manifest["calibration"] == q["calibration"] and manifest["build"]["calib_tokens"] == 512
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 2 * 4 + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-gptq"]       # scratch dirs are gone
