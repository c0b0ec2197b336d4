"""The base projections' weights as an engine artifact's graph multiplies them, for DoRA's column norms
(runtime/adapter_files.py): read from model.onnx.data one initializer at a time, never the whole graph's weights.

    QLinear projections   codes / scales [/ offsets] in QLinear's packed layout (custom_ops/src/kernels/qlinear.h),
                          dequantized: w = d * (code - zp) + m, zp = 8 for int4, 0 for int8
    MultiLoRA projections the fp32 MatMul weight [in, sum(out)] before the Split back to q, k, v (or gate, up)

Each is returned as the HF [out, in] float32 matrix of one (layer, target). Projections of other forms (MatMulNBits:
block size 16, `--keep` splits into int8 MatMulNBits) raise AdapterFileError naming the projection.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from . import contract as C
from .errors import AdapterFileError
from .ops_library import op_schema

_ZERO_POINT = {4: 8, 8: 0}


def dequantize_qlinear(codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None, n: int, k: int,
                       bits: int, block_size: int) -> np.ndarray:
    """QLinear's packed weight (codes uint8 [G, kb, bs * bits], scales / offsets float16 [G, kb, 8]) -> float32
    [N, K]: what the op multiplies by. The layout's inverse (tests tie it to pipeline/qlinear_pack.py's unpacker)."""
    g, kb, sub = codes.shape[0], codes.shape[1], block_size // 32
    if bits == 4:
        b = codes.reshape(g, kb, sub, 4, 8, 4).astype(np.int32)          # [G, kb, sub, chunk j, row r, byte i]
        c = np.stack([b & 0x0F, b >> 4], axis=-2)                        # element 8j + 4 * half + i
        c = c.transpose(0, 4, 1, 2, 3, 5, 6)
    else:
        c = codes.reshape(g, kb, sub, 8, 8, 4).view(np.int8).astype(np.int32)   # element 4 * chunk + i
        c = c.transpose(0, 4, 1, 2, 3, 5)
    c = c.reshape(g * 8, kb, block_size)[:n].astype(np.float32) - np.float32(_ZERO_POINT[bits])

    def lanes(v):   # [G, kb, 8] -> [N, kb, 1]
        return v.astype(np.float32).transpose(0, 2, 1).reshape(g * 8, kb)[:n, :, None]

    w = c * lanes(scales)
    if offsets is not None:
        w = w + lanes(offsets)
    return np.ascontiguousarray(w.reshape(n, kb * block_size)[:, :k])


class BaseWeights:
    """Lookup of (layer, target) -> the projection's [out, in] float32 weight in an engine artifact."""

    def __init__(self, artifact: Path, target_shapes: dict[str, tuple[int, int]]):
        self.dir = Path(artifact)
        self.shapes = target_shapes
        self.graph = onnx.load(str(self.dir / C.MODEL), load_external_data=False).graph
        self._init = {t.name: t for t in self.graph.initializer}
        self._producer = {o: n for n in self.graph.node for o in n.output}
        self._nodes: dict[tuple[int, str], tuple[onnx.NodeProto, int]] = {}   # (layer, target) -> (node, segment)
        self._last: tuple[str | None, np.ndarray | None] = (None, None)        # the last dequantized QLinear weight
        self._qlinear_at = {n: op_schema("QLinear").index(n) for n in ("codes", "scales", "offsets", "A0", "A1",
                                                                         "A2")}    # input positions (the op's table)
        for node in self.graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "QLinear" and "lora_layer" in attrs:
                ins = list(node.input)
                for j in range(3):
                    pos = self._qlinear_at[f"A{j}"]
                    if pos < len(ins) and ins[pos]:
                        self._nodes[(attrs["lora_layer"], ins[pos].split(".")[1])] = (node, j)
            elif node.op_type == "MultiLoRA":
                _, layer, target, _ = node.input[2].split(".")
                self._nodes[(int(layer), target)] = (node, -1)

    def _array(self, name: str) -> np.ndarray:
        if name not in self._init:
            raise AdapterFileError(f"{C.MODEL}: {name} is not an initializer of the graph; rebuild the artifact")
        return numpy_helper.to_array(self._init[name], base_dir=str(self.dir))

    def weight(self, layer: int, target: str) -> np.ndarray:
        """float32 [out, in] of the projection `target` of `layer`, as the graph multiplies it."""
        if (layer, target) not in self._nodes:
            raise AdapterFileError(f"the engine graph has no adapted projection layers.{layer}.{target}")
        node, seg = self._nodes[(layer, target)]
        if seg >= 0:
            return self._qlinear(node, seg)
        return self._matmul(node, layer, target)

    def _qlinear(self, node: onnx.NodeProto, seg: int) -> np.ndarray:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        ins = list(node.input)
        at = self._qlinear_at
        if self._last[0] != node.name:    # q, k, v of one fused weight come one after another: dequantize it once
            o = at["offsets"]
            offsets = self._array(ins[o]) if len(ins) > o and ins[o] else None
            self._last = (node.name, dequantize_qlinear(self._array(ins[at["codes"]]), self._array(ins[at["scales"]]),
                                                        offsets, attrs["N"], attrs["K"], attrs["bits"],
                                                        attrs["block_size"]))
        w = self._last[1]
        col = 0
        for j in range(seg):   # the segments before this one, by their targets' widths
            col += self.shapes[ins[at[f"A{j}"]].split(".")[1]][1]
        width = self.shapes[ins[at[f"A{seg}"]].split(".")[1]][1]
        return w[col:col + width]

    def _matmul(self, node: onnx.NodeProto, layer: int, target: str) -> np.ndarray:
        src, col = node.input[1], 0          # base_y: a MatMul's output, or one output of the Split after it
        prod = self._producer.get(src)
        if prod is not None and prod.op_type == "Split":
            sizes = self._array(prod.input[1]).tolist()
            col = int(sum(sizes[:list(prod.output).index(src)]))
            prod = self._producer.get(prod.input[0])
        if prod is None or prod.op_type != "MatMul" or prod.input[1] not in self._init:
            kind = prod.op_type if prod is not None else "no node"
            raise AdapterFileError(f"layers.{layer}.{target} is a {kind} projection in this artifact; DoRA adapters "
                                   "need fp32 (MatMul) or QLinear projections (rebuild with --block-size 32 or more "
                                   "and without --keep)")
        w = self._array(prod.input[1])       # [in, sum(out)], stored transposed
        return np.ascontiguousarray(w[:, col:col + self.shapes[target][1]].T, np.float32)
