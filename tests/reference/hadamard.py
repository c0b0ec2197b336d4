"""Reference Hadamard rotation and per-row symmetric quantization of KV rows (int8, fp8 e4m3fn, int4).

Written to be obviously correct rather than fast: the Hadamard matrix is built explicitly
(Sylvester construction) and e4m3 rounding searches the table of all representable values.
Arithmetic that the C++ kernel does in float32 (x / scale) is done in float32 here too, so the
codes match bit for bit except at exact rounding ties reached through different float paths.
"""

from __future__ import annotations

import numpy as np

INT8_QMAX = 127.0
INT4_QMAX = 7.0
E4M3_MAX = 448.0


# ---- scales: one float16 per row, rounded up, so codes computed with the stored scale stay in range

def f16_ceil(v: np.ndarray) -> np.ndarray:
    """The smallest float16 >= v for v > 0 (65504 at most; a positive v below the smallest subnormal gives
    that subnormal); 0 where v == 0."""
    v = np.minimum(np.asarray(v, np.float32), np.float32(65504))
    h = v.astype(np.float16)                                                # nearest (ties to even)
    h = np.where(h.astype(np.float32) < v, np.nextafter(h, np.float16(65504)), h)
    return np.where(v > 0, h, np.float16(0)).astype(np.float16)


def _row_scale(x: np.ndarray, qmax: float) -> tuple[np.ndarray, np.ndarray]:
    """(stored float16 scale [...], the float32 divisor for the codes [..., 1]: the stored scale, 1 where 0)."""
    scale = f16_ceil(np.abs(x).max(axis=-1) / np.float32(qmax))
    return scale, np.where(scale > 0, scale.astype(np.float32), np.float32(1))[..., None]


def hadamard_matrix(d: int) -> np.ndarray:
    """Sylvester Hadamard matrix H_d (entries +-1), d a power of two."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"d must be a power of two; got {d}")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def fwht(x: np.ndarray) -> np.ndarray:
    """Normalized Walsh-Hadamard transform over the last axis: x @ H / sqrt(d) (orthonormal)."""
    d = x.shape[-1]
    return (x.astype(np.float64) @ hadamard_matrix(d) / np.sqrt(d)).astype(x.dtype)


# ---- int8: scale = f16_ceil(absmax / 127), codes = round-half-even(x / scale) in [-127, 127]

def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (last axis) symmetric int8. Returns (codes int8 [..., D], scale float16 [...])."""
    x = x.astype(np.float32)
    scale, safe = _row_scale(x, INT8_QMAX)
    codes = np.clip(np.rint(x / safe), -127, 127)
    codes = np.where(scale[..., None] > 0, codes, 0)
    return codes.astype(np.int8), scale


def dequantize_int8(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return codes.astype(np.int8).astype(np.float32) * scale[..., None].astype(np.float32)


# ---- int4: scale = f16_ceil(absmax / 7), codes = round-half-even(x / scale) in [-7, 7], stored as code + 8,
#      two to a byte: byte i holds code i (low nibble) and code i + D/2 (high nibble)

def quantize_int4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (last axis, D even) symmetric int4. Returns (packed uint8 [..., D/2], scale float16 [...])."""
    x = x.astype(np.float32)
    scale, safe = _row_scale(x, INT4_QMAX)
    codes = np.clip(np.rint(x / safe), -7, 7)
    codes = (np.where(scale[..., None] > 0, codes, 0) + 8).astype(np.uint8)
    half = x.shape[-1] // 2
    return (codes[..., :half] | (codes[..., half:] << 4)).astype(np.uint8), scale


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """[..., D/2] packed bytes -> int8 codes [..., D] in [-8, 7]."""
    lo, hi = (packed & 15).astype(np.int8) - 8, (packed >> 4).astype(np.int8) - 8
    return np.concatenate([lo, hi], axis=-1)


def dequantize_int4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return unpack_int4(packed).astype(np.float32) * scale[..., None].astype(np.float32)


# ---- fp8 e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, max 448, no infinities

def e4m3_table() -> np.ndarray:
    """float value of every byte 0..255 (0x7f/0xff, the NaNs, as nan)."""
    vals = np.empty(256, dtype=np.float64)
    for code in range(256):
        e, m = (code >> 3) & 0xF, code & 0x7
        mag = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        if code & 0x7F == 0x7F:
            mag = np.nan
        vals[code] = -mag if code & 0x80 else mag
    return vals


_E4M3 = e4m3_table()
_E4M3_POS = _E4M3[:0x7F]  # codes 0..126, increasing magnitudes 0 .. 448


def float_to_e4m3(v: np.ndarray) -> np.ndarray:
    """Nearest e4m3fn code (ties to the even code, i.e. even mantissa), saturating at +-448."""
    v = np.asarray(v, dtype=np.float64)
    a = np.minimum(np.abs(v), E4M3_MAX)
    hi = np.clip(np.searchsorted(_E4M3_POS, a, side="left"), 0, len(_E4M3_POS) - 1)
    lo = np.clip(hi - 1, 0, None)
    d_lo, d_hi = a - _E4M3_POS[lo], _E4M3_POS[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return np.where(np.signbit(v) & (code != 0), code | 0x80, code).astype(np.uint8)


def quantize_e4m3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric fp8: scale = f16_ceil(absmax / 448). Returns (codes uint8 [..., D], scale float16 [...])."""
    x = x.astype(np.float32)
    scale, safe = _row_scale(x, E4M3_MAX)
    codes = float_to_e4m3(x / safe)
    codes = np.where(scale[..., None] > 0, codes, 0).astype(np.uint8)
    return codes, scale


def dequantize_e4m3(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (_E4M3[codes.astype(np.uint8)] * scale[..., None].astype(np.float32)).astype(np.float32)


def quantize(x: np.ndarray, kv_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Codes as stored in the cache (uint8 bytes) and per-row scales."""
    if kv_dtype == "int8":
        codes, scale = quantize_int8(x)
        return codes.view(np.uint8), scale
    if kv_dtype == "fp8_e4m3":
        return quantize_e4m3(x)
    if kv_dtype == "int4":
        return quantize_int4(x)
    raise ValueError(kv_dtype)


def dequantize(codes: np.ndarray, scale: np.ndarray, kv_dtype: str) -> np.ndarray:
    if kv_dtype == "int8":
        return dequantize_int8(codes.view(np.int8), scale)
    if kv_dtype == "fp8_e4m3":
        return dequantize_e4m3(codes, scale)
    if kv_dtype == "int4":
        return dequantize_int4(codes, scale)
    raise ValueError(kv_dtype)
