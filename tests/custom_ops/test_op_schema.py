"""The ops' tables (custom_ops/src/ops/op_schema.h): the library declares each op's inputs once, registers them with
ORT from that table, and exports it as JSON; the Python side (runtime/ops_library.py op_schema) reads the same table.
Checked here against what ORT itself enforces for a node (input count, required inputs, element types), so the
names, order and optional flags the graph builder uses are the ones the library registers. And the ops ABI version
is one constant (OPS_ABI_VERSION in runtime/ops_library.py, built into the library by custom_ops/CMakeLists.txt)."""
from __future__ import annotations

import re
from pathlib import Path

import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortllm.runtime import ops_library
from ortllm.runtime.ops_library import OPS_ABI_VERSION, op_schema, ops_abi_version, ops_schema_json, register_ops

REPO = Path(__file__).resolve().parents[2]
OPS = ("QLinear", "PagedAttention", "MultiLoRA", "MoE")
ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "uint8": TensorProto.UINT8,
              "int8": TensorProto.INT8, "int32": TensorProto.INT32, "int64": TensorProto.INT64}


def node_model(op: str, types: list[int | None]):
    """One `op` node whose input i is a graph input of element type types[i] ("" where None), with its required
    outputs (PagedAttention's: attn, then the caches, of the key cache's type)."""
    names = ["" if t is None else f"in{i}" for i, t in enumerate(types)]
    graph_inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types) if t is not None]
    out_types = [TensorProto.FLOAT] + ([types[9] or TensorProto.FLOAT] * 2 if op == "PagedAttention" else [])
    outs = [f"out{j}" for j in range(len(out_types))]
    node = helper.make_node(op, names, outs, domain="ortllm")
    graph = helper.make_graph([node], op, graph_inputs,
                              [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortllm", 1)])


def ort_accepts(model) -> bool:
    """Whether ORT creates a session for the model (its check of the node against the registered op)."""
    so = ort.SessionOptions()
    register_ops(so)
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return True
    except Exception as exc:  # noqa: BLE001 -- ORT raises its own exception types; the message says which check
        assert "INVALID_GRAPH" in str(exc), exc
        return False


@pytest.mark.parametrize("op", OPS)
def test_python_reads_the_table_ort_registers(op):
    """Every input as the table declares it: all present with their types, ORT takes the node; one more input, or
    a required one left out, or one of another element type, and ORT refuses it."""
    schema = op_schema(op)
    for variant in range(max(len(i.types) for i in schema.inputs)):   # PagedAttention: float32, float16, uint8 caches
        types = [ONNX_TYPES[i.types[min(variant, len(i.types) - 1)]] for i in schema.inputs]
        assert ort_accepts(node_model(op, types)), (op, variant)
    assert not ort_accepts(node_model(op, types + [TensorProto.FLOAT]))
    for i, inp in enumerate(schema.inputs):
        assert ort_accepts(node_model(op, types[:i] + [None] + types[i + 1:])) == inp.optional, (op, inp.name)
        other = TensorProto.INT32 if types[i] == TensorProto.INT64 else TensorProto.INT64   # MoE's expert is int64
        assert not ort_accepts(node_model(op, types[:i] + [other] + types[i + 1:])), (op, inp.name)


def test_the_tables_read_as_the_ops_name_their_inputs():
    """The positions the wrappers' errors and the graph builder rely on, e.g. QLinear's segments of five from 7."""
    q = op_schema("QLinear")
    assert [i.name for i in q.inputs[:7]] == ["x", "codes", "scales", "offsets", "residual", "token_adapter",
                                              "lora_scale"]
    assert [q.index(f"A{j}") for j in range(3)] == [7, 12, 17] and q.index("token_adapter_weight") == 27
    assert [i.name for i in q.inputs if not i.optional] == ["x", "codes", "scales"]
    assert q.stack_attr == "lora_layer" and {a.name for a in q.attributes} >= {"K", "N", "bits", "block_size"}
    pa = op_schema("PagedAttention")
    assert pa.inputs[pa.index("key_cache")].types == ("float32", "float16", "uint8")
    assert all(i.doc and i.shape for s in OPS for i in op_schema(s).inputs)


def test_node_inputs_places_named_inputs():
    ml = op_schema("MultiLoRA")
    required = {i.name: i.name for i in ml.inputs if not i.optional}
    assert ml.node_inputs(required | {"dora": "d"}) == [*required, "", "d"]   # offsets left out, trailing dropped
    with pytest.raises(KeyError, match=r"MultiLoRA needs inputs \['rank'\]"):
        ml.node_inputs({k: v for k, v in required.items() if k != "rank"})
    with pytest.raises(KeyError, match="MultiLoRA has no input 'Z'"):
        ml.node_inputs(required | {"Z": "z"})
    with pytest.raises(KeyError, match="no op 'Gemm'"):
        op_schema("Gemm")


def test_the_abi_version_is_one_constant():
    """The library's version is the Python constant, built in from that one line; no source of the library keeps
    its own number."""
    path = ops_library.check_ops_library()
    assert ops_abi_version(path) == OPS_ABI_VERSION == ops_schema_json(path)["abi_version"]
    assert "runtime/ops_library.py" in (REPO / "custom_ops" / "CMakeLists.txt").read_text()
    for src in (REPO / "custom_ops" / "src").rglob("*.[ch]*"):
        assert not re.search(r"ABI_VERSION\s+\d", src.read_text()), f"{src} defines an ops ABI version of its own"


def test_the_readme_lists_each_table():
    """custom_ops/README.md carries each op's inputs and attributes as the library declares them (regenerate with
    `python -m ortllm.runtime.ops_library`)."""
    readme = (REPO / "custom_ops" / "README.md").read_text()
    for op in OPS:
        assert op_schema(op).markdown() in readme, f"custom_ops/README.md's {op} tables differ from the library's"


def test_bench_graphs_name_the_inputs_as_the_tables_do():
    """The op benches' and the op tests' graphs (bench/op_graphs.py) keep their own input lists: the same names, in
    the same positions, as the tables."""
    from ortllm.bench.op_graphs import LORA_INPUTS, MOE_INPUTS, PA_INPUTS, QLINEAR_INPUTS
    for op, names in (("QLinear", QLINEAR_INPUTS), ("PagedAttention", PA_INPUTS), ("MultiLoRA", LORA_INPUTS),
                      ("MoE", MOE_INPUTS)):
        assert [i.name for i in op_schema(op).inputs][:len(names)] == list(names), op
