"""A SmoothQuant'ed artifact's rescales (contract SMOOTHING, written by pipeline/smooth.py), and the map of an
adapter trained on the model's own weights onto them.

The graph's projection weight is W' = diag(out) W diag(in) (W [out, in] the model's) and its input x' = x / in
(the norm before it carries 1 / in), so its output is y * out. A LoRA pair in the adapter file's layout
(a [in, r], b [r, out]: delta = x a b) then becomes

    a' = diag(in) a       so that x' a' = x a
    b' = b diag(out)      so that the delta scales with the base output it is added to

and a DoRA norm, taken over the model's own weights, reads W = diag(1 / out) W' diag(1 / in).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import contract as C
from .artifact import Manifest
from .errors import AdapterFileError


class Smoothing:
    """(layer, target) -> the rescales of that projection; an artifact without SmoothQuant has none."""

    def __init__(self, tensors: dict[str, np.ndarray]):
        self.tensors = tensors

    @classmethod
    def of(cls, artifact: Path, manifest: Manifest) -> "Smoothing":
        """The artifact's rescales. A smoothed artifact without them (built before they were stored) is refused:
        an adapter on its smoothed projections would compute on the wrong input."""
        if C.SMOOTHING in manifest.files:
            from safetensors.numpy import load_file
            return cls(load_file(str(Path(artifact) / C.SMOOTHING)))
        if (manifest.raw.get("calibration") or {}).get("smoothquant"):
            raise AdapterFileError(f"{artifact} is SmoothQuant'ed but does not hold {C.SMOOTHING}, which adapters "
                                   "need to see the projections' own input; rebuild it (`ortllm build ... --force`) "
                                   "or build with --smooth 0")
        return cls({})

    def __bool__(self) -> bool:
        return bool(self.tensors)

    def _side(self, layer: int, target: str, side: str) -> np.ndarray | None:
        return self.tensors.get(C.smoothing_name(layer, target, side))

    def to_artifact(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """An adapter file's tensors (layers.{i}.{target}.a / .b, float32) mapped onto the smoothed projections
        (a new dict; the input untouched)."""
        if not self.tensors:
            return tensors
        out = dict(tensors)
        for key in [k[:-2] for k in tensors if k.endswith(".a")]:
            _, layer, target = key.split(".")
            s_in, s_out = self._side(int(layer), target, "in"), self._side(int(layer), target, "out")
            if s_in is not None:
                out[key + ".a"] = np.ascontiguousarray(tensors[key + ".a"] * s_in[:, None], np.float32)
            if s_out is not None:
                out[key + ".b"] = np.ascontiguousarray(tensors[key + ".b"] * s_out[None, :], np.float32)
        return out

    def model_weight(self, w: np.ndarray, layer: int, target: str) -> np.ndarray:
        """The artifact's weight [out, in] of one projection -> the model's own (diag(1 / out) W' diag(1 / in))."""
        s_in, s_out = self._side(layer, target, "in"), self._side(layer, target, "out")
        if s_in is not None:
            w = w / s_in[None, :]
        if s_out is not None:
            w = w / s_out[:, None]
        return w
