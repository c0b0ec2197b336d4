"""A small ONNX graph builder: path-named nodes, constants, and weights streamed to external data.

Weights go straight from NumPy into `<model>.onnx.data` (4 KiB aligned so ONNX Runtime can map them),
so building TinyLlama-size graphs costs one copy of the weights, not three. The same inputs give the
same bytes: no timestamps, initializers in insertion order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_ALIGN = 4096
_INLINE_BYTES = 1024  # smaller tensors stay inside model.onnx

DTYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
          np.dtype(np.int32): TensorProto.INT32, np.dtype(np.uint8): TensorProto.UINT8,
          np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.bool_): TensorProto.BOOL}


class GraphBuilder:
    def __init__(self, data_path: Path, opset: int = 17, extra_opsets: dict[str, int] | None = None):
        self.data_path = Path(data_path)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.opsets = {"": opset, **(extra_opsets or {})}
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}
        self._shared: set[str] = set()
        self._data = open(self.data_path, "wb")
        self._offset = 0

    # ---- graph I/O
    def input(self, name: str, elem_type: int, shape: list) -> str:
        """Declare a graph input; declaring it again with the same type and shape returns it (a stack that
        several nodes read)."""
        info = helper.make_tensor_value_info(name, elem_type, shape)
        same = [i for i in self.inputs if i.name == name]
        if same:
            assert same[0] == info, f"graph input {name} declared twice with different types or shapes"
            return name
        self.inputs.append(info)
        return name

    def output(self, name: str, elem_type: int, shape: list) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    # ---- nodes
    def op(self, op_type: str, inputs: list[str], path: str, n_out: int = 1, domain: str = "",
           skip: tuple[int, ...] = (), **attrs):
        """Add a node named `path/OpType`; returns its output name (or names when n_out > 1). skip: positions of
        optional outputs the node leaves out ("" in the node and in the returned names)."""
        name = f"{path}/{op_type}"
        base, k = name, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        outs = ["" if i in skip else f"{name}/output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def identity(self, src: str, dst: str, path: str) -> None:
        """Route an internal value to a named graph output."""
        self.nodes.append(helper.make_node("Identity", [src], [dst], name=f"{path}/Identity"))

    # ---- constants and weights
    def const(self, value, dtype=np.int64) -> str:
        """A small constant, shared by value (shape vectors, eps, scales)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = f"/const/{arr.dtype.name}_{len(self._consts)}"
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def shared_weight(self, name: str, make) -> str:
        """An initializer used by many nodes, written once: `make()` builds it on first use only."""
        if name not in self._shared:
            self._shared.add(name)
            self.weight(name, make())
        return name

    def weight(self, name: str, arr: np.ndarray) -> str:
        arr = np.ascontiguousarray(arr)
        if arr.nbytes <= _INLINE_BYTES:
            self.initializers.append(numpy_helper.from_array(arr, name))
            return name
        pad = (-self._offset) % _ALIGN
        self._data.write(b"\0" * pad)
        self._offset += pad
        self._data.write(memoryview(arr).cast("B"))
        t = TensorProto(name=name, data_type=DTYPES[arr.dtype], dims=arr.shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.data_path.name), ("offset", str(self._offset)), ("length", str(arr.nbytes))):
            t.external_data.add(key=k, value=v)
        self._offset += arr.nbytes
        self.initializers.append(t)
        return name

    # ---- output
    def save(self, model_path: Path, graph_name: str, doc: str = "", metadata: dict | None = None) -> None:
        self._data.close()
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.opsets.items()],
            producer_name="ortllm", doc_string=doc)
        model.ir_version = 8  # readable by every ONNX Runtime >= 1.14
        for k, v in (metadata or {}).items():
            model.metadata_props.add(key=k, value=str(v))
        with open(model_path, "wb") as f:
            f.write(model.SerializeToString(deterministic=True))
        onnx.checker.check_model(str(model_path))  # by path: external data is checked for, not loaded
