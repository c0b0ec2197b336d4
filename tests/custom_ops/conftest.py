"""Shared helpers for the custom-op tests: graphs built with onnx.helper (domain `ortllm`),
sessions with the ops library registered, and the parity tolerance check (llm.c validate_result)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ortllm.runtime.ops_library import OpsLibraryError, check_ops_library, register_ops  # noqa: E402

PA_INPUTS = ["q", "k", "v", "positions", "cu_seqlens", "context_lens", "block_tables",
             "cos_cache", "sin_cache", "key_cache", "value_cache", "key_scales", "value_scales"]
PA_OUTPUTS = ["attn", "key_cache_out", "value_cache_out", "key_scales_out", "value_scales_out"]
LORA_INPUTS = ["x", "base_y", "A", "B", "scale", "rank", "token_adapter"]

F32, F16, I32, U8, I8 = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.UINT8,
                        TensorProto.INT8)


def pytest_collection_modifyitems(config, items):
    try:
        check_ops_library()
    except OpsLibraryError as exc:  # every test here needs the library
        skip = pytest.mark.skip(reason=str(exc))
        for item in items:
            if "custom_ops" in str(item.fspath) and "test_ops_library" not in str(item.fspath):
                item.add_marker(skip)


def _model(node, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph([node], node.op_type, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ortllm", 1)])
    model.ir_version = 10
    return model


def session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    register_ops(so)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def paged_attention_model(*, num_heads, kv_num_heads, head_size, block_size, kv_dtype="float32",
                          **attrs) -> onnx.ModelProto:
    """One PagedAttention node; 8-bit caches get the scale inputs/outputs, float32 ones do not; with attribute
    `layer` the cache inputs are every layer's ([n_layers, ...]) and the outputs one layer's."""
    eight_bit = kv_dtype != "float32"
    cache_t = U8 if eight_bit else F32
    n_in, n_out = (13, 5) if eight_bit else (11, 3)
    types = [F32, F32, F32, I32, I32, I32, I32, F32, F32, cache_t, cache_t, F16, F16]   # scales: float16
    lead = int(attrs.get("layer", -1) >= 0)
    ranks = [2, 2, 2, 1, 1, 1, 2, 2, 2, 4 + lead, 4 + lead, 3 + lead, 3 + lead]
    inputs = [helper.make_tensor_value_info(n, t, [None] * r)
              for n, t, r in list(zip(PA_INPUTS, types, ranks))[:n_in]]
    out_types = [(F32, 2), (cache_t, 4), (cache_t, 4), (F16, 3), (F16, 3)]
    outputs = [helper.make_tensor_value_info(n, t, [None] * r)
               for n, (t, r) in list(zip(PA_OUTPUTS, out_types))[:n_out]]
    node = helper.make_node("PagedAttention", PA_INPUTS[:n_in], PA_OUTPUTS[:n_out], domain="ortllm",
                            num_heads=num_heads, kv_num_heads=kv_num_heads, head_size=head_size,
                            block_size=block_size, kv_dtype=kv_dtype, **attrs)
    return _model(node, inputs, outputs)


def multi_lora_model(block_size: int | None = None, packed_a: bool = False) -> onnx.ModelProto:
    """One MultiLoRA node (A, B fp16); with block_size, also the optional offsets input [k_blocks, out] fp16;
    packed_a: the attribute (slot s of A is a row-major [in, rank[s]] matrix)."""
    names = LORA_INPUTS + (["offsets"] if block_size is not None else [])
    types = [F32, F32, F16, F16, F32, I32, I32, F16]
    ranks = [2, 2, 3, 3, 1, 1, 1, 2]
    inputs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(names, types, ranks)]
    outputs = [helper.make_tensor_value_info("y", F32, [None, None])]
    attrs = ({"block_size": block_size} if block_size else {}) | ({"packed_a": 1} if packed_a else {})
    node = helper.make_node("MultiLoRA", names, ["y"], domain="ortllm", **attrs)
    return _model(node, inputs, outputs)


def assert_close(got, ref, *, atol, rtol, what=""):
    """|got - ref| <= atol + rtol * |ref| elementwise (llm.c validate_result); reports the worst."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    tol = atol + rtol * np.abs(ref)
    bad = np.abs(got - ref) > tol
    if bad.any():
        i = np.unravel_index(np.argmax(np.abs(got - ref) - tol), got.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} elements out of tolerance; worst at {i}: "
                             f"got {got[i]:.8g}, ref {ref[i]:.8g}, tol {tol[i]:.3g}")


QLINEAR_INPUTS = ["x", "codes", "scales", "offsets", "residual", "token_adapter", "lora_scale",
                  *(f"{n}{j}" for j in range(3) for n in ("A", "A_scale", "B", "B_scale", "rank")), "norm_weight"]
QLINEAR_TYPES = [F32, U8, F16, F16, F32, I32, F32, *[I8, F16, I8, F16, I32] * 3, F32]
QLINEAR_RANKS = [2, 3, 3, 3, 2, 1, 1, *[3, 3, 3, 2, 1] * 3, 1]


def qlinear_model(present: list[str], n_outputs: int = 1, argmax: bool = False, **attrs) -> onnx.ModelProto:
    """One QLinear node; `present` names the inputs fed (the others are left out as ONNX optional inputs);
    n_outputs > 1: outputs y, y1, y2 (attribute split); argmax: output 3, "argmax" [T] int64, after them. The
    LoRA stacks' graph inputs have no declared rank (one layer's, or every layer's with attribute lora_layer)."""
    names = [n if n in present else "" for n in QLINEAR_INPUTS]
    while names and not names[-1]:
        names.pop()
    inputs = [helper.make_tensor_value_info(n, t, None if n.rstrip("012") in ("A", "A_scale", "B", "B_scale")
                                            else [None] * r)
              for n, t, r in zip(QLINEAR_INPUTS, QLINEAR_TYPES, QLINEAR_RANKS) if n in present]
    out_names = ["y", "y1", "y2"][:n_outputs]
    outputs = [helper.make_tensor_value_info(n, F32, [None, None]) for n in out_names]
    if argmax:
        out_names = out_names + [""] * (3 - n_outputs) + ["argmax"]
        outputs.append(helper.make_tensor_value_info("argmax", onnx.TensorProto.INT64, [None]))
    node = helper.make_node("QLinear", names, out_names, domain="ortllm", **attrs)
    return _model(node, inputs, outputs)
