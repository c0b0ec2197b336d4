"""int8 LoRA stacks for QLinear (contract 6): an adapter's float32 A [in, r] and B [r, out] as the int8 codes
and float16 scales the op multiplies on integer dots (layouts and math: custom_ops/src/kernels/qlinear.h).

    A: a scale per (32-chunk of in, column), codes in k-quads: code (k, i) at ((k // 4) * r + i) * 4 + k % 4
    B: a scale per output column, codes in rank quads: code (j, n) at ((j // 4) * out + n) * 4 + j % 4
       (r padded to a multiple of 4 with zero codes)

Symmetric, absmax / 127 rounded to float16 first, codes = rint(w / scale) in -127..127: each weight is off by at
most half its scale.
"""
from __future__ import annotations

import numpy as np

from .contract import LORA_CHUNK


def _symmetric(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """w float32 -> (codes int8 like w, scales float16 with `axis` reduced): per-slice absmax / 127."""
    scale = (np.abs(w).max(axis=axis, keepdims=True, initial=0) / np.float32(127)).astype(np.float16)
    s32 = scale.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(s32 > 0, np.rint(w / s32), 0)
    return np.clip(codes, -127, 127).astype(np.int8), np.squeeze(scale, axis)


def quantize_a(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a [in, r] (in a multiple of 4) -> (codes int8 [in * r] in k-quads, scales float16 [ceil(in / 32), r])."""
    k, r = a.shape
    kc = -(-k // LORA_CHUNK)
    padded = np.zeros((kc * LORA_CHUNK, r), np.float32)
    padded[:k] = a
    codes, scales = _symmetric(padded.reshape(kc, LORA_CHUNK, r), axis=1)
    codes = codes.reshape(kc * LORA_CHUNK, r)[:k]
    return codes.reshape(k // 4, 4, r).transpose(0, 2, 1).reshape(-1), scales


def quantize_b(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """b [r, out] -> (codes int8 [ceil(r / 4) * 4 * out] in rank quads, scales float16 [out])."""
    r, n = b.shape
    codes, scales = _symmetric(np.asarray(b, np.float32), axis=0)
    quads = np.zeros((-(-r // 4) * 4, n), np.int8)
    quads[:r] = codes
    return quads.reshape(-1, 4, n).transpose(0, 2, 1).reshape(-1), scales
