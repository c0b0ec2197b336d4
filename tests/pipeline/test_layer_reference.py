"""The fp32 model run one layer at a time, for models whose fp32 copy does not fit in memory, against the whole fp32
graphs it stands in for: the quality check's reference (pipeline/layer_reference.py) gives the whole fp32 engine
graph's logits bit for bit on every family's small random model (dense, mixture of experts, gpt-oss's sinks and
windows, Gemma's norms and softcap), and on SmolLM2 the very quality.json figures; the calibration pass
(calib_activations.LayerCalibration) gives the whole portable graph's Hessians to fp32 rounding, in one pass.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from ortllm.calibration.fidelity import draft_artifact, make_scorer
from ortllm.calibration.quality import WHOLE_REFERENCE, in_build_quality
from ortllm.cli.build import build_artifact
from ortllm.pipeline.build import BuildOptions, write_graph
from ortllm.pipeline.calib_activations import Calibration, LayerCalibration
from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.layer_reference import LayerReference
from ortllm.pipeline.sources import load_model
from ortllm.runtime import contract as C
from tests.reference.hf_families import FAMILIES, GPT_OSS, MOE_FAMILIES, save_hf_dir, tiny_model

FP32 = BuildOptions(quant="fp32", lm_head="fp32", kv="fp32")


def _whole_and_streamed(weights, tmp: Path, windows: list[list[int]]):
    """(whole fp32 engine graph's scorer, the layer-by-layer one) over the same windows."""
    opts = FP32.for_model(weights.config)
    whole = tmp / "whole"
    whole.mkdir()
    write_graph(weights, whole, opts, None, {})
    art = draft_artifact(whole, {"graph": "engine", "model": weights.config.to_dict(), "build": asdict(opts)})
    ref = LayerReference(weights, tmp / "stages", opts.kv_block_size, log=lambda m: None)
    return make_scorer(art, max(map(len, windows))), ref.scorer(windows), ref


@pytest.mark.parametrize("name", sorted(FAMILIES) + sorted(MOE_FAMILIES) + sorted(GPT_OSS))
def test_the_stages_give_the_whole_graphs_bits(name, tmp_path):
    """Each window (longer than every sliding window here) through embed, each layer and the head as graphs of their
    own equals the whole fp32 engine graph's logits exactly, and nothing stays in the scratch directory."""
    _, weights = load_model(str(save_hf_dir(tiny_model(name), tmp_path / "hf")))
    rng = np.random.default_rng(3)
    windows = [rng.integers(3, weights.config.vocab_size, n).tolist() for n in (45, 17)]
    whole, streamed, ref = _whole_and_streamed(weights, tmp_path, windows)
    for w in windows:
        a = np.concatenate(list(whole.logits(w, 512)))
        b = np.concatenate(list(streamed.logits(w, 16)))      # the head in chunks of 16 rows
        assert a.shape == b.shape == (len(w), weights.config.vocab_size)
        assert np.array_equal(a, b), f"{name}: max |diff| {np.abs(a - b).max()}"
    ref.close()
    assert not (tmp_path / "stages").exists()
    with pytest.raises(KeyError, match="only the windows it was given"):
        next(streamed.logits([5, 6, 7]))


def test_smollm2_quality_is_the_same_either_way(smollm2_quantized, tmp_path):
    """The real SmolLM2 int4 build's in-build check (512 held-out positions) against the whole fp32 reference and
    against the layer-by-layer one: every figure of quality.json's fidelity section is the same number."""
    art = smollm2_quantized("int4")
    _, weights = load_model("smollm2-135m-instruct")
    manifest = json.loads((art / C.MANIFEST).read_text())
    opts = replace(BuildOptions(**{**manifest["build"], "keep": tuple(manifest["build"]["keep"]),
                                   "act16": tuple(manifest["build"]["act16"])}), quality_tokens=512)
    ref_opts = replace(opts, quant="fp32", lm_head="fp32", kv="fp32", keep=(), smooth=None, smooth_down=0.0,
                       act16=())
    whole = tmp_path / "whole"
    whole.mkdir()
    write_graph(weights, whole, ref_opts, None, {})
    full = in_build_quality(weights, art, whole, opts, ref_opts, {})
    ref = LayerReference(weights, tmp_path / "stages", opts.kv_block_size, log=lambda m: None)
    layered = in_build_quality(weights, art, ref, opts, ref_opts, {})
    ref.close()
    assert full["reference"] == WHOLE_REFERENCE and "one layer at a time" in layered["reference"]
    assert full["fidelity"]["tokens"] >= 500
    assert layered["fidelity"] == full["fidelity"]


def test_layer_calibration_gives_the_whole_graphs_hessians(tmp_path):
    """Every projection input's X^T X (and the LM head's) summed layer by layer equals the whole portable graph's to
    fp32 rounding; the builders' layer-by-layer requests take one pass, a request behind it a second; groups are
    whole layers; SmoothQuant's diagonal alone likewise."""
    _, weights = load_model("llama-tiny-random")
    names = [f"model.layers.{i}.{t}.weight" for i in range(weights.config.num_layers)
             for t in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")] + ["lm_head.weight"]
    whole = Calibration(weights, 300, tmp_path / "whole", log=lambda m: None)
    want = {n: whole.hessian(n).copy() for n in names}
    whole.close()
    layered = LayerCalibration(weights, 300, tmp_path / "layers", budget_bytes=1, log=lambda m: None)
    try:
        assert all(len({k.split("/")[2] for k in g}) == 1 for g in layered.groups)   # one layer (or the head) each
        for n in names:
            h = layered.hessian(n)
            np.testing.assert_allclose(h, want[n], rtol=2e-5, atol=1e-6 * np.abs(want[n]).max())
        assert layered.passes == 1
        layered.hessian(names[0])
        assert layered.passes == 2                   # layer 0 again: a new pass from the embedding
    finally:
        layered.close()
    assert not (tmp_path / "layers").exists()
    diag = LayerCalibration(weights, 300, tmp_path / "diag", log=lambda m: None, diagonal_only=True)
    try:
        for n in names:
            np.testing.assert_allclose(diag.channel_rms(n), np.sqrt(np.diag(want[n]) / 2.0), rtol=2e-5)
        assert diag.passes == 1 and diag.groups == [diag.order]
    finally:
        diag.close()


def test_the_build_flag(tmp_path):
    """`--fp32-reference layers` on quantized builds: the int4 build's quality.json names the layer-by-layer
    reference and holds the figures the whole reference gives; the int8 build (SmoothQuant's calibration pass) says
    its fp32 model ran layer by layer and smooths by the same scales to fp32 rounding; an unknown choice is refused
    before anything is built."""
    from safetensors.numpy import load_file

    out = {}
    for how in ("full", "layers"):
        for quant in ("int4", "int8"):
            build_artifact("llama-tiny-random", tmp_path / f"{quant}-{how}",
                           BuildOptions(quant=quant, quality_tokens=128, calib_tokens=256), fp32_reference=how,
                           log=lambda m: None)
            out[quant, how] = json.loads((tmp_path / f"{quant}-{how}" / C.QUALITY).read_text())
    assert "one layer at a time" in out["int4", "layers"]["reference"]
    assert out["int4", "layers"]["fidelity"] == out["int4", "full"]["fidelity"]
    assert "fp32_model" not in out["int8", "full"]["calibration"]
    assert "one layer at a time" in out["int8", "layers"]["calibration"]["fp32_model"]
    full, layers = (load_file(str(tmp_path / f"int8-{how}" / C.SMOOTHING)) for how in ("full", "layers"))
    assert full.keys() == layers.keys() and full
    for k in full:
        np.testing.assert_allclose(layers[k], full[k], rtol=1e-4)
    with pytest.raises(BuildError, match="--fp32-reference 'half'.*auto, full, layers"):
        build_artifact("llama-tiny-random", tmp_path / "bad", BuildOptions(quant="int4"), fp32_reference="half",
                       log=lambda m: None)
    assert not (tmp_path / "bad").exists()


def test_a_shape_recipe_measured_on_request(tmp_path, monkeypatch):
    """A recipe of random weights skips the check under auto (quality.json says why and how to run it); with
    --fp32-reference layers the check runs, and quality.json says its figures are the check's cost, not a quality."""
    import dataclasses

    from ortllm.pipeline import sources
    from ortllm.pipeline.recipes import get_recipe

    base = get_recipe("llama-tiny-random")
    shape = dataclasses.replace(base, name="tiny-shape", source={**base.source, "fidelity_check": False})
    monkeypatch.setattr(sources, "known_recipes", lambda: {"tiny-shape": shape})
    for how in ("auto", "layers"):
        build_artifact("tiny-shape", tmp_path / how, BuildOptions(quant="int4", quality_tokens=64),
                       fp32_reference=how, log=lambda m: None)
    auto, layers = (json.loads((tmp_path / how / C.QUALITY).read_text()) for how in ("auto", "layers"))
    assert auto["fidelity"] == {} and "--fp32-reference layers" in auto["fidelity_skipped"]
    assert layers["fidelity"]["tokens"] >= 60 and "one layer at a time" in layers["reference"]
    assert "not a quality" in layers["fidelity_note"]
