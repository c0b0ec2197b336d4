"""SmoothQuant (pipeline/smooth.py): exact in fp32 (the rescaled norm and projections compute the same
function as the originals), scales from the calibration's channel RMS, and the build's refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ortllm.pipeline.build import BuildOptions
from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.smooth import SMOOTHED, S_RANGE, smooth_weights, smoothing_scales
from ortllm.pipeline.weights import norm_names
from ortllm.pipeline.sources import load_model
from tests.test_cli import assert_user_error, ortllm


def _norm_then_project(h, g, ws, eps):
    """[T, K] hidden -> RMSNorm * g -> each W [N, K]: NumPy float64."""
    x = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps) * g
    return [x @ w.T.astype(np.float64) for w in ws]


def test_smoothing_preserves_every_smoothed_projection():
    _, weights = load_model("llama-tiny-random")
    cfg = weights.config
    rng = np.random.default_rng(0)
    rms = rng.uniform(0.01, 30.0, cfg.hidden_size)          # outlier channels, as after a real norm
    smoothed, report = smooth_weights(weights, 0.5, lambda name: rms)
    assert len(report) == cfg.num_layers * len(SMOOTHED)
    h = rng.standard_normal((5, cfg.hidden_size))
    for i in range(cfg.num_layers):
        for role, targets in SMOOTHED.items():
            g = f"model.layers.{i}.{norm_names(cfg)[role]}.weight"
            names = [f"model.layers.{i}.{t}.weight" for t in targets]
            want = _norm_then_project(h, weights.tensors[g], [weights.tensors[n] for n in names], cfg.rms_norm_eps)
            got = _norm_then_project(h, smoothed.tensors[g], [smoothed.tensors[n] for n in names], cfg.rms_norm_eps)
            for a, b in zip(want, got):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())
            assert not np.array_equal(smoothed.tensors[g], weights.tensors[g])
    untouched = [n for n in weights.tensors
                 if "o_proj" in n or "down_proj" in n or "embed" in n or n == "model.norm.weight"]
    # builds stream (pipeline/weights.py LazyTensors): an untouched tensor is read again from the same source, so
    # it is the same values, not the same array object
    assert untouched and all(np.array_equal(smoothed.tensors[n], weights.tensors[n]) for n in untouched)


def test_a_lazy_source_stays_lazy_with_the_same_values():
    """Smoothing weights read on access (a streamed build's LazyTensors) reads each weight once for its column maxima
    and holds none: every smoothed tensor is made when read, equal to the eager dict's, with --smooth-down and an
    act16 group taken back (pipeline/build._unsmooth_act16) too."""
    from ortllm.pipeline.build import _unsmooth_act16
    from ortllm.pipeline.weights import LazyTensors, ModelWeights

    _, weights = load_model("llama-tiny-random")
    eager = {n: np.array(weights.tensors[n]) for n in weights.tensors}
    reads: list[str] = []
    lazy = LazyTensors()
    for n, arr in eager.items():
        lazy.add(n, arr.shape, lambda n=n, arr=arr: reads.append(n) or arr.copy())
    rms = np.random.default_rng(0).uniform(0.01, 30.0, weights.config.hidden_size)
    down_rms = np.random.default_rng(1).uniform(0.01, 30.0, weights.config.intermediate_size)

    def rms_of(name: str) -> np.ndarray:
        return down_rms if "down_proj" in name else rms

    out = {}
    for kind, tensors in (("eager", dict(eager)), ("lazy", lazy)):
        src = ModelWeights(weights.config, tensors)
        smoothed, scales = smooth_weights(src, 0.5, rms_of, down_alpha=0.3)
        out[kind] = _unsmooth_act16(src, smoothed, scales, ("qkv",))[0].tensors
    assert isinstance(out["lazy"], LazyTensors) and not out["lazy"]._held
    scaled = [n for n in eager if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
                                               "up_proj.weight", "down_proj.weight"))]
    assert sorted(reads) == sorted(scaled), "each weight with a scale read once, for its column maxima"
    for n in eager:
        assert np.array_equal(out["lazy"][n], out["eager"][n]), n


def test_scales_balance_activation_and_weight_ranges():
    """alpha 0.5: after smoothing, channel j's activation RMS and weight max are equal up to one common factor."""
    rms = np.array([0.1, 1.0, 10.0, 100.0])
    w = np.array([[1.0, 0.5, 2.0, 0.01], [-3.0, 0.1, 0.5, 0.02]])
    s = smoothing_scales(rms, [w], 0.5).astype(np.float64)
    act, wmax = rms / s, np.abs(w * s).max(0)
    np.testing.assert_allclose(act / wmax, (act / wmax)[0], rtol=1e-5)
    assert np.isclose(np.exp(np.mean(np.log(s))), 1.0, rtol=1e-5)
    assert np.array_equal(smoothing_scales(rms, [w], 0.0) > 0, [True] * 4)          # alpha 0: weights only
    dead = smoothing_scales(np.array([0.0, 1.0]), [np.ones((2, 2))], 0.5)           # a channel never active
    assert np.all((dead >= S_RANGE[0]) & (dead <= S_RANGE[1]))


def test_default_is_int8_with_int8_compute_only():
    assert BuildOptions(quant="int8").smooth_alpha == 0.5
    assert BuildOptions(quant="int8", accuracy_level=0).smooth_alpha == 0.0
    assert BuildOptions(quant="int4").smooth_alpha == 0.0
    assert BuildOptions(quant="int8", algo="gptq").smooth_alpha == 0.0
    assert BuildOptions(quant="int4", smooth=0.3).smooth_alpha == 0.3
    for bad, needle in ((dict(quant="int8", smooth=1.5), "in [0, 1]"), (dict(smooth=0.5), "add --quant"),
                        (dict(quant="int8", algo="gptq", smooth=0.5), "do not combine"),
                        (dict(quant="int8", calib_tokens=0), "--smooth needs calibration data")):
        with pytest.raises(BuildError) as e:
            BuildOptions(**bad)
        assert needle in str(e.value) and "\n" not in str(e.value)


def test_smoothed_int8_build_records_its_calibration(tmp_path):
    out = tmp_path / "i8"
    p = ortllm("build", "llama-tiny-random", "--quant", "int8", "--calib-tokens", "300", "--out", out)
    assert p.returncode == 0, p.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    sq = manifest["calibration"]["smoothquant"]
    assert sq["alpha"] == 0.5 and sq["norms"] == 2 * manifest["model"]["num_layers"]
    assert manifest["calibration"]["tokens"] == 300 and "gptq" not in manifest["calibration"]
    quality = json.loads((out / "quality.json").read_text())
    assert quality["calibration"]["smoothquant"]["alpha"] == 0.5
    assert_user_error(ortllm("build", "llama-tiny-random", "--quant", "int8", "--smooth", "2", "--out", tmp_path / "x"),
                      "--smooth must be a migration strength in [0, 1]")
