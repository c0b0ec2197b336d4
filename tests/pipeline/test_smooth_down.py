"""SmoothQuant of down_proj's input through up_proj's rows (--smooth-down, pipeline/smooth.py): exact in fp32 on a
GLU MLP (SiLU and GELU-tanh), composed with the norm-side smoothing, and its refusals. Off by default: on Gemma 3
270M int8 it moves held-out KLD from code to prose (docs/quality-gemma3.md)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ortllm.pipeline.build import BuildOptions
from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.smooth import smooth_weights
from ortllm.pipeline.sources import load_model
from tests.test_cli import assert_user_error, ortllm


def _mlp(x, w, i, act):
    """[T, H] (the MLP's normed input) -> down(act(gate) * up), NumPy float64."""
    p = f"model.layers.{i}.mlp."
    gate, up = (x @ w[p + n + ".weight"].T.astype(np.float64) for n in ("gate_proj", "up_proj"))
    a = gate / (1 + np.exp(-gate)) if act == "silu" else \
        0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
    return (a * up) @ w[p + "down_proj.weight"].T.astype(np.float64)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_down_smoothing_is_exact_in_fp32(alpha, act):
    _, weights = load_model("llama-tiny-random")
    cfg = weights.config
    rng = np.random.default_rng(1)
    rms = {"h": rng.uniform(0.01, 30.0, cfg.hidden_size), "i": rng.uniform(0.01, 300.0, cfg.intermediate_size)}
    smoothed, report = smooth_weights(weights, alpha, lambda n: rms["i" if "down_proj" in n else "h"], 0.5)
    x = rng.standard_normal((6, cfg.hidden_size))
    for i in range(cfg.num_layers):
        up, down = (f"model.layers.{i}.mlp.{n}_proj.weight" for n in ("up", "down"))
        assert up in report and not np.array_equal(smoothed.tensors[down], weights.tensors[down])
        if alpha:     # gate|up's columns took the norm's scale: feed each its own norm output
            g = f"model.layers.{i}.post_attention_layernorm.weight"
            xs, xo = x * (smoothed.tensors[g] / weights.tensors[g]), x
        else:
            xs = xo = x
        want, got = _mlp(xo, weights.tensors, i, act), _mlp(xs, smoothed.tensors, i, act)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert len(report) == cfg.num_layers * (3 if alpha else 1)


def test_refusals():
    assert BuildOptions(quant="int8").smooth_down == 0.0
    for bad, needle in ((dict(quant="int8", smooth_down=1.5), "in [0, 1]"), (dict(smooth_down=0.5), "add --quant"),
                        (dict(quant="int8", algo="gptq", smooth_down=0.5), "do not combine"),
                        (dict(quant="int8", smooth=0, smooth_down=0.5, calib_tokens=0),
                         "--smooth-down needs calibration data")):
        with pytest.raises(BuildError) as e:
            BuildOptions(**bad)
        assert needle in str(e.value) and "\n" not in str(e.value)


def test_int8_build_with_down_smoothing_records_it(tmp_path):
    out = tmp_path / "i8"
    p = ortllm("build", "llama-tiny-random", "--quant", "int8", "--smooth-down", "0.5", "--calib-tokens", "300",
               "--out", out)
    assert p.returncode == 0, p.stderr
    sq = json.loads((out / "manifest.json").read_text())["calibration"]["smoothquant"]
    assert sq["alpha"] == 0.5 and sq["down_alpha"] == 0.5
    assert_user_error(ortllm("build", "llama-tiny-random", "--smooth-down", "0.5", "--out", tmp_path / "x"),
                      "--smooth-down rescales quantized projections")
