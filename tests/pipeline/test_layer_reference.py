"""The in-build quality check's fp32 reference run one layer at a time (pipeline/layer_reference.py), for models whose
fp32 copy does not fit in memory, against the whole fp32 engine graph it stands in for: the same logits, bit for bit,
on every family's small random model (dense, mixture of experts, gpt-oss's sinks and windows, Gemma's norms and
softcap), and on SmolLM2 the very quality.json figures of the check run either way.
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


def test_the_build_flag(tmp_path):
    """`--quality-reference layers` on a quantized build: quality.json names the layer-by-layer reference and holds
    the figures the whole reference gives; an unknown choice is refused before anything is built."""
    out = {}
    for how in ("full", "layers"):
        build_artifact("llama-tiny-random", tmp_path / how, BuildOptions(quant="int4", quality_tokens=128),
                       quality_reference=how, log=lambda m: None)
        out[how] = json.loads((tmp_path / how / C.QUALITY).read_text())
    assert "one layer at a time" in out["layers"]["reference"]
    assert out["layers"]["fidelity"] == out["full"]["fidelity"]
    with pytest.raises(BuildError, match="--quality-reference 'half'.*auto, full, layers"):
        build_artifact("llama-tiny-random", tmp_path / "bad", BuildOptions(quant="int4"), quality_reference="half",
                       log=lambda m: None)
    assert not (tmp_path / "bad").exists()
