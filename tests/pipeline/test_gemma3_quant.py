"""Gemma 3's quantized builds, without building Gemma: a Q4_K tensor's own 4-bit grid recovered exactly, the int4
plan keeping a GGUF's wider tensors int8 (llama.cpp's Q4_K_M mix), and --act16 putting layer projections on int16
activation codes (QLinear act_bits 16, with its LoRA) on a small engine graph served next to the act_bits 8 one.
docs/quality-gemma3.md has the figures these choices were made by."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from ortllm.pipeline.build import BuildOptions
from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.families import FAMILIES, default_act16
from ortllm.pipeline.quant_grid import dequantize, on_grid
from ortllm.pipeline.quantize import QuantPlan, RTNQuantizer
from ortllm.pipeline.sources import q4k_grid, source_grid


def q4k_bytes(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random Q4_K blocks (llama.cpp's layout: d, dmin fp16, 12 bytes of 6-bit sub-block scales and mins, 128 bytes of
    codes, sub-block 2j in the low nibbles of bytes 32j.., 2j + 1 in the high ones) for an [n, k] tensor -> raw uint8
    [n, k / 256 * 144] and the codes [n, k] they hold."""
    nb = n * k // 256
    d = rng.uniform(1e-3, 4e-3, nb).astype(np.float16)
    dmin = rng.uniform(1e-3, 4e-3, nb).astype(np.float16)
    sc, mn = rng.integers(1, 64, (nb, 8)), rng.integers(0, 64, (nb, 8))     # sc 0: any code is the same value
    scales = np.zeros((nb, 12), np.uint8)
    scales[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    codes = rng.integers(0, 16, (nb, 8, 32)).astype(np.uint8)
    qs = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(nb, 128)
    raw = np.concatenate([d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2), scales, qs], axis=1)
    return raw.reshape(n, -1), codes.reshape(n, k)


def test_q4k_grid_is_recovered_without_a_second_rounding():
    """Each 32-wide sub-block maps onto the int4 offset form: the codes are the GGUF's own (shifted by whole steps
    where that shrinks the offset), the only error the fp16
    rounding of the scale and offset (SmolLM2's Q4_1 shows 0.0000 in quality.json); RTN's min..max re-rounding
    costs ~100x more. Weights moved off the grid (a fix-up, smoothing) are refused, and RTN takes them."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    rng = np.random.default_rng(0)
    n, k = 24, 512
    raw, codes = q4k_bytes(rng, n, k)
    w = gguf_dequantize(raw, GGMLQuantizationType.Q4_K).reshape(n, k).astype(np.float32)
    scale, low = q4k_grid(raw, [n, k])
    assert scale.shape == low.shape == (n, k // 32)
    q = on_grid(w, scale, low, 4)
    assert q is not None
    got = (q.data[..., None] >> np.array([0, 4], np.uint8)) & 0x0F      # low nibble first
    shift = got.reshape(n, k // 32, 32).astype(int) - codes.reshape(n, k // 32, 32)   # whole steps a block (on_grid)
    np.testing.assert_array_equal(shift, np.broadcast_to(shift[..., :1], shift.shape))
    rtn = RTNQuantizer(4, 32, symmetric=False).quantize(w)
    assert q.rms_rel < 1e-3 and rtn.rms_rel > 30 * q.rms_rel, (q.rms_rel, rtn.rms_rel)
    np.testing.assert_allclose(dequantize(q), w, atol=2e-3 * float(np.abs(w).max()))
    assert on_grid(w * np.float32(1.01), scale, low, 4) is None
    assert on_grid(w[:, :480], scale, low, 4) is None

    plan = QuantPlan(quant="int4", source_types={"model.layers.0.self_attn.o_proj.weight": "Q4_K"},
                     source_grids={"model.layers.0.self_attn.o_proj.weight": (scale, low)})
    q2 = plan.quantize("model.layers.0.self_attn.o_proj.weight", w)
    assert plan.report["model.layers.0.self_attn.o_proj.weight"]["algo"] == "source grid (Q4_K)"
    assert q2.rms_rel == q.rms_rel
    plan.quantize("model.layers.0.self_attn.o_proj.weight", w * np.float32(1.01))
    assert plan.report["model.layers.0.self_attn.o_proj.weight"]["algo"] == "rtn"


def test_q5_0_and_q8_0_grids_are_exact_in_int8():
    """A Q5_0 block is d * (q - 16), a Q8_0 block d * q (d of either sign): in the int8 offset form with scale |d|
    (a Q5_0 block's codes shifted by whole steps to offset 0) they are the GGUF's values exactly; in int4 a Q5_0
    grid does not fit and RTN takes it."""
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(1)
    n, k = 16, 256
    for kind, zero, size in (("Q5_0", 16, 22), ("Q8_0", 128, 34)):
        d = (rng.uniform(1e-3, 4e-3, n * k // 32) * rng.choice([-1, 1], n * k // 32)).astype(np.float16)   # d < 0 too
        q = rng.integers(0, 32 if kind == "Q5_0" else 256, (n * k // 32, 32))
        w = ((q - zero) * d.astype(np.float32)[:, None]).reshape(n, k).astype(np.float32)
        dd = d.view(np.uint8).reshape(-1, 2)
        if kind == "Q8_0":      # d, then 32 int8 codes
            raw = np.concatenate([dd, (q - zero).astype(np.int8).view(np.uint8)], axis=1)
        else:                   # d, the 32 high bits, then element j's low nibble (j < 16) beside j + 16's
            qh = (((q >> 4) & 1) << np.arange(32)).sum(1).astype("<u4").view(np.uint8).reshape(-1, 4)
            raw = np.concatenate([dd, qh, ((q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)).astype(np.uint8)], axis=1)
        np.testing.assert_array_equal(quants.dequantize(raw, getattr(GGMLQuantizationType, kind)).reshape(n, k), w)
        grid = source_grid(kind, raw, [n, k])
        assert raw.reshape(-1).size == n * k // 32 * size
        q8 = on_grid(w, *grid, 8)
        assert q8.rms_rel == 0.0, kind
        if kind == "Q5_0":     # codes shifted into 0..255 with the offset at 0
            assert not q8.offsets.astype(np.float32).any()
        assert (on_grid(w, *grid, 4) is None) == (kind == "Q5_0" or int(q.max() - q.min()) > 15)


def test_int4_plan_keeps_wider_gguf_tensors_int8():
    """--quant int4 on a GGUF: Q5_0 / Q6_K / Q8_0 tensors stay int8, Q4_K and Q4_1 ones (SmolLM2's) and float
    sources (HF directories) get int4; --source-mix 0 and --keep still decide; the LM head follows --lm-head."""
    types = {"a.q_proj.weight": "Q5_0", "a.down_proj.weight": "Q6_K", "a.v_proj.weight": "Q8_0",
             "a.o_proj.weight": "Q4_K", "b.o_proj.weight": "Q4_1", "c.o_proj.weight": "F32", "lm_head.weight": "Q6_K"}
    plan = QuantPlan(quant="int4", lm_head="int8", source_types=types)
    assert {n: plan.dtype_for(n) for n in types} == {
        "a.q_proj.weight": "int8", "a.down_proj.weight": "int8", "a.v_proj.weight": "int8", "a.o_proj.weight": "int4",
        "b.o_proj.weight": "int4", "c.o_proj.weight": "int4", "lm_head.weight": "int8"}
    assert QuantPlan(quant="int4", source_types=types, source_mix=False).dtype_for("a.q_proj.weight") == "int4"
    keep = (("a.q_proj.weight", "fp32"),)
    assert QuantPlan(quant="int4", source_types=types, keep=keep).dtype_for("a.q_proj.weight") == "fp32"
    assert QuantPlan(quant="int8", source_types=types).dtype_for("a.o_proj.weight") == "int8"


def test_act16_option_and_family_default():
    assert BuildOptions(quant="int8", act16=["qkv", "down"]).quant_plan().act16 == ("qkv", "down")
    with pytest.raises(BuildError, match="--act16 takes a comma-separated list of qkv, o, gate_up, down"):
        BuildOptions(quant="int8", act16=("k_proj",))
    plan = BuildOptions(quant="int8", act16=("qkv",)).quant_plan()
    qkv = [f"/model/layers.3/attn/{t}_proj" for t in "qkv"]
    assert plan.act16_for(qkv) and not plan.act16_for(["/model/layers.3/mlp/down_proj"])
    assert FAMILIES["llama"].act16 == ()      # SmolLM2 and every llama build: the int8 codes, as before
    assert default_act16(type("C", (), {"arch": "unknown"})()) == ()


def test_gemma3_int4_smooths_by_default():
    """Gemma 3's int4 build smooths the MLP's norm unless --smooth says otherwise (it meets the default quality bar
    in every domain with it, code's KLD misses it without); other families and quantizations keep their rules, and
    GPTQ (whose Hessians are of unsmoothed inputs) is not given a smoothing it would refuse."""
    gemma, llama = (type("C", (), {"arch": a, "num_experts": 0})() for a in ("gemma3", "llama"))   # dense
    assert BuildOptions(quant="int4").for_model(gemma).smooth_alpha == 0.5
    assert BuildOptions(quant="int4", smooth=0).for_model(gemma).smooth_alpha == 0.0
    assert BuildOptions(quant="int4").for_model(llama).smooth_alpha == 0.0      # SmolLM2: the shipped Q4_1 grid
    assert BuildOptions(quant="int4", algo="gptq").for_model(gemma).smooth_alpha == 0.0
    assert BuildOptions(quant="int8").for_model(gemma) == BuildOptions(quant="int8", act16=("qkv",))
    with pytest.raises(BuildError, match="--smooth needs calibration data"):
        BuildOptions(quant="int4", calib_tokens=0).for_model(gemma)


def test_act16_engine_graph_with_lora(tmp_path):
    """llama-tiny-random built int8 with --act16 qkv,down: those QLinear nodes carry act_bits 16 beside their LoRA
    inputs, the others as before (the head always 16), SmoothQuant taken back from q|k|v's norm; the manifest records
    the choice (llama's default: none); the
    engine serves it (QLinear with a LoRA on int16 codes: tests/custom_ops/test_qlinear.py)."""
    from ortllm.cli.build import build_artifact
    from ortllm.runtime.engine import Engine
    from ortllm.runtime.sampling_params import SamplingParams

    arts = {}
    for name, act16 in (("a16", ("qkv", "down")), ("a8", None)):
        arts[name] = tmp_path / name
        build_artifact("llama-tiny-random", arts[name], BuildOptions(quant="int8", act16=act16, quality_tokens=64,
                                                                     calib_tokens=256), log=lambda m: None)
    manifest = json.loads((arts["a16"] / "manifest.json").read_text())
    assert manifest["build"]["act16"] == ["qkv", "down"]
    a8 = json.loads((arts["a8"] / "manifest.json").read_text())
    assert a8["build"]["act16"] == []   # llama's default
    # SmoothQuant stays on the MLP's input norms only: q|k|v on int16 codes keep their unsmoothed weights
    layers = a8["model"]["num_layers"]
    assert a8["calibration"]["smoothquant"]["norms"] == 2 * layers
    assert manifest["calibration"]["smoothquant"]["norms"] == layers
    nodes = [n for n in onnx.load(str(arts["a16"] / "model.onnx"), load_external_data=False).graph.node
             if n.op_type == "QLinear"]
    act = {n.name: next((a.i for a in n.attribute if a.name == "act_bits"), 8) for n in nodes}
    for n in nodes:
        want = 16 if n.name.rsplit("/", 1)[0].endswith(("q_k_v_proj", "down_proj", "lm_head")) else 8
        assert act[n.name] == want, (n.name, act[n.name])
        if "layers" in n.name:
            assert "token_adapter" in n.input, n.name
    with Engine.from_artifact(arts["a16"]) as engine:
        out = engine.generate(["hello world"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_blocks_past_128_are_refused_before_a_build_with_int16_activation_codes():
    """int16 codes x int8 weights are exact in int32 only in blocks of up to 128 (QLinear refuses more): a block-256
    build with the int8 head, or with --act16 groups (given, or Gemma 3's default), is refused up front, saying what to
    change, instead of failing minutes in; without them it stands."""
    gemma = type("C", (), {"arch": "gemma3", "num_experts": 0})()
    with pytest.raises(BuildError, match="--block-size 256 with the int8 LM head.*add --lm-head fp32"):
        BuildOptions(quant="int8", block_size=256)
    with pytest.raises(BuildError, match="--block-size 256 with the int8 LM head"):
        BuildOptions(quant="int4", block_size=256)
    with pytest.raises(BuildError, match=r"int16 activation codes on qkv \(--act16: the family default\).*--act16 "
                                         r"none"):
        BuildOptions(quant="int8", block_size=256, lm_head="fp32").for_model(gemma)
    with pytest.raises(BuildError, match=r"on gate_up \(--act16\)"):
        BuildOptions(quant="int8", block_size=256, lm_head="fp32", act16=("gate_up",)).for_model(gemma)
    assert BuildOptions(quant="int8", block_size=256, lm_head="fp32", act16=()).for_model(gemma).block_size == 256
    assert BuildOptions(quant="int8", block_size=128).for_model(gemma).act16 == ("qkv",)
