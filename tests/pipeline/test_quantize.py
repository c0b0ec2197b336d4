"""Quantizers: MatMulNBits packing against a NumPy dequantize reference, error reports, bad input.

The op is the judge of the bit layout: dequantize() then MatMul must equal onnxruntime's MatMulNBits
(fp32 compute, accuracy_level 0) to fp32 rounding, and stay close with int8 compute (accuracy_level 4).
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from ortllm.pipeline.build import BuildOptions
from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.graph_blocks import linear, linear_group
from ortllm.pipeline.onnx_builder import GraphBuilder
from ortllm.pipeline.quantize import QuantPlan, dequantize, hf_name, make_quantizer, parse_keep


def _run_linear(tmp_path, w: np.ndarray, x: np.ndarray, plan: QuantPlan | None) -> tuple[np.ndarray, onnx.ModelProto]:
    """One `linear` block as a graph: x [M, K] -> [M, N], through onnxruntime."""
    g = GraphBuilder(tmp_path / "m.onnx.data")
    x_in = g.input("x", TensorProto.FLOAT, ["M", w.shape[1]])
    y = linear(g, x_in, w, "/model/layers.0/mlp/down_proj", plan)
    g.identity(y, g.output("y", TensorProto.FLOAT, ["M", w.shape[0]]), "/out")
    g.save(tmp_path / "m.onnx", "t")
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0], onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)


def _close(got: np.ndarray, ref: np.ndarray, rtol: float, atol_frac: float) -> None:
    """llm.c style: |got - ref| <= atol + rtol * |ref|, atol relative to the output's scale."""
    atol = atol_frac * float(np.abs(ref).max())
    bad = np.abs(got - ref) > atol + rtol * np.abs(ref)
    assert not bad.any(), f"{bad.sum()} of {bad.size} outside tolerance; max diff {np.abs(got - ref).max():.3g}"


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("algo,symmetric", [("rtn", True), ("rtn", False), ("hqq", False)])
@pytest.mark.parametrize("block_size,k", [(16, 64), (32, 576), (64, 576), (128, 576)])   # 576/128: padded block
def test_matmul_nbits_matches_numpy_dequantize(tmp_path, bits, algo, symmetric, block_size, k):
    rng = np.random.default_rng(bits * 1000 + block_size + k)
    w = (rng.standard_normal((48, k)) * rng.uniform(0.01, 0.2, (48, 1))).astype(np.float32)
    w[3, 5] = 1.5                                                            # an outlier in one block
    x = rng.standard_normal((5, k)).astype(np.float32)
    plan = QuantPlan(quant=f"int{bits}", block_size=block_size, algo=algo, symmetric=symmetric, accuracy_level=0)
    got, model = _run_linear(tmp_path, w, x, plan)
    q = make_quantizer(algo, bits, block_size, symmetric).quantize(w)
    ref = x @ dequantize(q).T
    ops = [n.op_type for n in model.graph.node if n.op_type != "Identity"]
    # no zero_points input ever: the op's fastest path; the asymmetric form adds its offset term
    assert all(len(n.input) == 3 for n in model.graph.node if n.op_type == "MatMulNBits")
    assert ops == (["MatMulNBits"] if symmetric else ["MatMulNBits", "MatMul", "Cast", "MatMul", "Add"])
    _close(got, ref, rtol=1e-4, atol_frac=1e-5)
    plan4 = QuantPlan(quant=f"int{bits}", block_size=block_size, algo=algo, symmetric=symmetric)
    got4, _ = _run_linear(tmp_path, w, x, plan4)
    _close(got4, ref, rtol=0.05, atol_frac=0.03)     # int8 activations: a few % of the output scale


def test_error_report_is_the_dequantized_error():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    errs = {}
    for bits in (4, 8):
        q = make_quantizer("rtn", bits, 32, False).quantize(w)
        err = dequantize(q) - w
        assert q.max_rel == pytest.approx(np.abs(err).max() / np.abs(w).max(), rel=1e-6)
        assert q.rms_rel == pytest.approx(np.linalg.norm(err) / np.linalg.norm(w), rel=1e-5)
        errs[bits] = q.rms_rel
    assert errs[8] < errs[4] / 10
    assert errs[4] < 0.1


def test_hqq_not_worse_than_rtn_on_heavy_tails():
    rng = np.random.default_rng(1)
    w = rng.standard_t(3, (64, 512)).astype(np.float32)
    rtn = make_quantizer("rtn", 4, 64, False).quantize(w)
    hqq = make_quantizer("hqq", 4, 64, False).quantize(w)
    mean_abs = lambda q: float(np.abs(dequantize(q) - w).mean())  # noqa: E731 - HQQ's own objective family
    assert mean_abs(hqq) <= mean_abs(rtn)


@pytest.mark.parametrize("algo", ["rtn", "hqq"])
def test_asymmetric_4bit_reproduces_a_q4_1_grid(algo):
    """Weights that already sit on llama.cpp's Q4_1 grid (block min + q * step, q spanning 0..15, as Q4_1
    quantization always leaves it) come back exactly (SmolLM2's GGUF case)."""
    rng = np.random.default_rng(2)
    q = rng.integers(0, 16, (16, 128)).astype(np.float32)
    q[:, ::32] = 0
    q[:, 1::32] = 15
    step = rng.uniform(0.01, 0.05, (16, 4, 1)).astype(np.float32)
    lo = rng.uniform(-0.5, -0.1, (16, 4, 1)).astype(np.float32)
    w = (lo + q.reshape(16, 4, 32) * step).reshape(16, 128).astype(np.float32)
    out = make_quantizer(algo, 4, 32, False).quantize(w)
    assert out.rms_rel < 2 ** -11                  # only the fp16 rounding of the offsets (<= 2^-12 of each)
    codes = (w.reshape(16, 4, 32) - lo) / step
    assert np.array_equal(np.rint(codes).reshape(16, 128), q)    # the grid itself is found exactly


def test_fused_projections_are_one_matmul_split_back(tmp_path):
    """q|k|v through linear_group: one MatMulNBits (+ offset term) on the stacked weight, then Split; each
    part equals its own projection; a --keep that gives the parts different dtypes falls back to separate ops."""
    rng = np.random.default_rng(3)
    ws = [rng.standard_normal((n, 64)).astype(np.float32) * 0.1 for n in (64, 32, 32)]
    paths = [f"/model/layers.0/attn/{t}_proj" for t in "qkv"]
    x = rng.standard_normal((3, 64)).astype(np.float32)

    def run(plan):
        g = GraphBuilder(tmp_path / "m.onnx.data")
        x_in = g.input("x", TensorProto.FLOAT, ["M", 64])
        for j, y in enumerate(linear_group(g, x_in, ws, paths, plan)):
            g.identity(y, g.output(f"y{j}", TensorProto.FLOAT, ["M", ws[j].shape[0]]), f"/out{j}")
        g.save(tmp_path / "m.onnx", "t")
        sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
        model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
        return sess.run(None, {"x": x}), [n.op_type for n in model.graph.node if n.op_type != "Identity"]

    got, ops = run(QuantPlan(quant="int4", block_size=16, accuracy_level=0))
    assert ops[:2] == ["MatMulNBits", "Split"] and sorted(ops[2:]) == ["Add"] * 3 + ["Cast"] * 3 + ["MatMul"] * 6
    for y, w in zip(got, ws):
        _close(y, x @ dequantize(make_quantizer("rtn", 4, 16, False).quantize(w)).T, rtol=1e-4, atol_frac=1e-5)
    got, ops = run(None)
    assert ops == ["MatMul", "Split"]
    for y, w in zip(got, ws):
        np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-6)
    _, ops = run(QuantPlan(quant="int4", block_size=16, keep=parse_keep(["*.k_proj.weight=fp32"])))
    assert ops.count("MatMulNBits") == 2 and "Split" not in ops


def test_fp32_linear_is_a_plain_matmul(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    got, model = _run_linear(tmp_path, w, np.ones((2, 4), np.float32), None)
    np.testing.assert_array_equal(got, np.ones((2, 4), np.float32) @ w.T)
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Identity"]
    assert {o.domain for o in model.opset_import} == {""}


def test_hf_names_of_projection_paths():
    assert hf_name("/model/layers.3/attn/q_proj") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("/model/layers.12/mlp/down_proj") == "model.layers.12.mlp.down_proj.weight"
    assert hf_name("/lm_head") == "lm_head.weight"


def test_keep_patterns_and_lm_head_choice():
    plan = QuantPlan(quant="int4", lm_head="int8", keep=parse_keep(["model.layers.0.*=fp32",
                                                                   "*.down_proj.weight=int8"]))
    assert plan.dtype_for("model.layers.0.mlp.down_proj.weight") == "fp32"     # first match wins
    assert plan.dtype_for("model.layers.5.mlp.down_proj.weight") == "int8"
    assert plan.dtype_for("model.layers.5.mlp.up_proj.weight") == "int4"
    assert plan.dtype_for("lm_head.weight") == "int8"


@pytest.mark.parametrize("opts,match", [
    (dict(quant="int4", algo="awq"), "--algo must be one of"),
    (dict(quant="int4", block_size=24), "power of two >= 16"),
    (dict(quant="int4", block_size=8), "power of two >= 16"),
    (dict(quant="int4", algo="gptq", calib_tokens=0), "gptq needs calibration data: set --calib-tokens"),
    (dict(quant="int4", calib_tokens=-1), "--calib-tokens must be an integer >= 0"),
    (dict(quant="int4", keep=("model.layers.*",)), "PATTERN=fp32|int8"),
    (dict(quant="int4", keep=("model.*=int4",)), "PATTERN=fp32|int8"),
    (dict(keep=("model.*=int8",)), "add --quant int8|int4"),
    (dict(quant="int4", algo="hqq", symmetric=True), "hqq is asymmetric"),
    (dict(quant="int8", lm_head="int2"), "--lm-head must be one of"),
    (dict(kv="int8", kv_rotate=False, graph="portable"), "needs the engine graph"),
    (dict(kv_rotate=False), "--kv-rotate 0 applies to quantized"),
])
def test_bad_options_are_one_line_errors(opts, match):
    with pytest.raises(BuildError, match=match) as e:
        BuildOptions(**opts)
    assert "\n" not in str(e.value)


def test_quantized_tiny_build_has_quality_json(tmp_path):
    """llama-tiny-random int4 + int8 LM head: MatMulNBits everywhere but the embedding (q|k|v and gate|up
    fused), fp32 MatMuls only in the offset terms, quality.json in the manifest."""
    from ortllm.cli.build import build_artifact as build
    out = tmp_path / "tiny-int4"
    manifest = build("llama-tiny-random", out, BuildOptions(quant="int4", lm_head="int8", block_size=16,
                                                            quality_tokens=64), log=lambda m: None)
    assert "quality.json" in manifest["files"]
    q = json.loads((out / "quality.json").read_text())
    assert {"kld_mean", "kld_p99", "top1_agreement", "ppl_ratio", "ppl_ratio_err", "tokens"} <= set(q["fidelity"])
    # 64 asked for: one window of 65 tokens (64 scored positions) per held-out domain
    assert q["fidelity"]["tokens"] == 3 * 64 and set(q["fidelity"]["domains"]) == {"prose", "code", "chat"}
    assert "lm_head.weight" in q["tensors"] and q["tensors"]["lm_head.weight"]["bits"] == 8
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert "Gemm" not in ops
    assert ops.count("MatMulNBits") == 2 * 4 + 1
    offset_terms = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    assert all(name.startswith("block_indicator.") or name.endswith(".offsets") for name in offset_terms)
    assert not list(tmp_path.glob(".*fp32ref*"))          # the in-build reference is gone


@pytest.mark.parametrize("quant,lm_head", [("int4", "int8"), ("int8", "int4")])
def test_quantized_engine_graph_is_qlinear(tmp_path, quant, lm_head):
    """Block 32: each layer is QLinear q|k|v (input norm fused, three outputs), PagedAttention, QLinear o (+ residual),
    QLinear gate|up (norm fused, SiLU * up), QLinear down (+ residual); the head is QLinear with the final norm.
    No MatMulNBits, MultiLoRA, Sigmoid, RMSNorm or residual Add left."""
    from ortllm.cli.build import build_artifact as build
    out = tmp_path / "tiny"
    build("llama-tiny-random", out, BuildOptions(quant=quant, lm_head=lm_head, block_size=32, quality_tokens=32),
          log=lambda m: None)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node
           if not n.name.startswith("/model/hidden")]   # the embeddings' output: its own norm on the rows asked for
    layers = 2
    assert ops.count("QLinear") == 4 * layers + 1
    assert not {"MatMulNBits", "MultiLoRA", "Sigmoid", "MatMul", "Gemm"} & set(ops), ops
    assert not {"Add", "Sqrt", "Pow", "ReduceMean"} & set(ops), ops              # norms fused into QLinear
    assert ops.count("PagedAttention") == layers and "Split" not in ops
    epilogues = [next(a.s.decode() for a in n.attribute if a.name == "epilogue")
                 for n in model.graph.node if n.op_type == "QLinear"]
    assert epilogues.count("residual") == 2 * layers and epilogues.count("swiglu") == layers
    from ortllm.runtime.ops_library import op_schema
    norm = op_schema("QLinear").index("norm_weight")     # the op's norm-weight input position
    normed = [n for n in model.graph.node if n.op_type == "QLinear" and len(n.input) > norm and n.input[norm]]
    assert len(normed) == 2 * layers + 1
