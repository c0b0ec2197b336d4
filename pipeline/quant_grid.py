"""The grid primitives every weight quantizer shares (RTN and HQQ in pipeline/quantize.py, GPTQ in
pipeline/gptq.py): the quantized weight, bit packing, the NumPy dequantization, the error report of a
finished weight, and the weighted grid search.

MatMulNBits layout (checked against onnxruntime 1.31 by tests/pipeline/test_quantize.py, dequantize
then MatMul vs the op): B is [N, k_blocks, block_size * bits / 8] uint8 with K zero-padded to whole
blocks; 4-bit values two per byte, element 2j in the low nibble and 2j+1 in the high nibble. scales are
fp32 [N * k_blocks]. We never pass zero_points: the op's implicit zero point 2^(bits-1) keeps its
fastest path (int8 compute at accuracy_level 4; uint8 zero points cost ~10%, fp32 ones leave int8
compute and cost ~4x).

Two forms, per (row n, block b of K):
    symmetric:   w ~= (q - 2^(bits-1)) * scale                      MatMulNBits alone
    asymmetric:  w ~= (q - 2^(bits-1)) * scale + offset[n, b]       MatMulNBits + blocksum(x) @ offset^T
The asymmetric form is llama.cpp's Q4_1 (w = d*q + m) rewritten with offset = m + 2^(bits-1) * d, so
a block min/max grid, any fp32 zero point (HQQ) and GGUF Q4_1 weights are all represented up to the
fp16 rounding of the offset (~2^-12 of it); the term is per-block sums of x times the offset table,
added by the engine's MultiLoRA op (or two MatMuls in the portable graph; graph_blocks.project).
fp16 because at decode the table streams from memory once per step: fp32 would add ~20% to the
bytes an int4 projection reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FP16_MIN_SCALE, FP16_MAX = 2.0 ** -24, 65504.0   # smallest fp16 subnormal, largest finite fp16
# The mxfp4 format's values by 4-bit code: 2 x e2m1 (llama.cpp's kvalues_mxfp4; custom_ops/src/kernels/qlinear.h
# kMxfp4Table), w = MXFP4_TABLE[code] * scale with scale = 2^(e - 128) the block's e8m0 exponent over two.
MXFP4_TABLE = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
MXFP4 = "mxfp4"


@dataclass
class QuantizedWeight:
    """One [N, K] weight ready for MatMulNBits."""
    n: int
    k: int
    bits: int
    block_size: int
    data: np.ndarray                 # uint8 [N, k_blocks, block_size * bits / 8], implicit zero point 2^(bits-1)
    scales: np.ndarray               # fp32 [N * k_blocks]
    offsets: np.ndarray | None       # fp16 [N, k_blocks] (asymmetric form) or None (symmetric)
    max_rel: float = 0.0
    rms_rel: float = 0.0
    out_rel: float | None = None     # relative output error on calibration inputs (GPTQ only)
    # "affine" (the two forms above) or MXFP4: bits 4, no offsets, w = MXFP4_TABLE[code] * scale (QLinear and the
    # MoE op read it; MatMulNBits cannot)
    format: str = "affine"

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.block_size)

    @staticmethod
    def concat(parts: list["QuantizedWeight"]) -> "QuantizedWeight":
        """Stack weights of one input along N (fused q|k|v or gate|up); blocks are per row, so this is exact."""
        a = parts[0]
        if any((p.k, p.bits, p.block_size, p.offsets is None, p.format) !=
               (a.k, a.bits, a.block_size, a.offsets is None, a.format) for p in parts):
            raise ValueError("QuantizedWeight.concat needs one K, bits, block size and form")
        return QuantizedWeight(sum(p.n for p in parts), a.k, a.bits, a.block_size,
                               np.concatenate([p.data for p in parts]), np.concatenate([p.scales for p in parts]),
                               None if a.offsets is None else np.concatenate([p.offsets for p in parts]),
                               format=a.format)


def pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., L] -> packed bytes [..., L * bits / 8] (4-bit: low nibble first); L even for 4 bits."""
    q = q.astype(np.uint8)
    return q if bits == 8 else (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def unpack_bits(p: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return p
    out = np.empty((*p.shape[:-1], p.shape[-1] * 2), np.uint8)
    out[..., 0::2], out[..., 1::2] = p & 0x0F, p >> 4
    return out


def blocks(w: np.ndarray, block_size: int) -> np.ndarray:
    """[N, K] -> [N, k_blocks, block_size], K zero-padded to whole blocks."""
    n, k = w.shape
    kb = -(-k // block_size)
    if kb * block_size != k:
        w = np.concatenate([w, np.zeros((n, kb * block_size - k), np.float32)], axis=1)
    return w.reshape(n, kb, block_size)


def dequantize(q: QuantizedWeight) -> np.ndarray:
    """The NumPy reference: fp32 [N, K] that MatMulNBits (+ the offset term) multiplies by, up to its
    activation rounding."""
    codes = unpack_bits(q.data, q.bits)                               # [N, kb, bs]
    levels = MXFP4_TABLE[codes].astype(np.float32) if q.format == MXFP4 else \
        codes.astype(np.float32) - np.float32(1 << (q.bits - 1))
    w = levels * q.scales.reshape(q.n, q.k_blocks, 1)
    if q.offsets is not None:
        w = w + q.offsets.astype(np.float32).reshape(q.n, q.k_blocks, 1)
    return w.reshape(q.n, -1)[:, :q.k]


def finish(w: np.ndarray, bits: int, block_size: int, codes: np.ndarray, scales: np.ndarray,
            offsets: np.ndarray | None) -> QuantizedWeight:
    """codes [N, kb, bs] in 0..2^bits-1, scales [N, kb, 1], offsets [N, kb, 1] or None -> the weight + its error."""
    n, k = w.shape
    # Scales are kept fp16-exact: QLinear stores them as fp16 (pipeline/qlinear_pack.py), and the error
    # below is then the error of the weight the engine really multiplies by.
    scales = np.clip(scales, FP16_MIN_SCALE, FP16_MAX).astype(np.float16).astype(np.float32)
    q = QuantizedWeight(n, k, bits, block_size, pack_bits(codes, bits), scales.reshape(-1),
                        None if offsets is None else offsets.astype(np.float16).reshape(n, -1))
    return with_error(q, w)


def with_error(q: QuantizedWeight, w: np.ndarray) -> QuantizedWeight:
    """q with its max_rel and rms_rel against the weight w [N, K] it stands for."""
    err = dequantize(q) - w
    peak, norm = float(np.abs(w).max()), float(np.sqrt(np.square(w, dtype=np.float64).sum()))
    q.max_rel = float(np.abs(err).max()) / peak if peak else 0.0
    q.rms_rel = float(np.sqrt(np.square(err, dtype=np.float64).sum())) / norm if norm else 0.0
    return q


def on_grid(w: np.ndarray, scale: np.ndarray, low: np.ndarray, bits: int) -> QuantizedWeight | None:
    """w [N, K] whose every block of K / kb lies on a known grid scale * q + low, q in 0..2^bits-1 (scale, low:
    [N, kb]; a GGUF tensor's blocks of 32, pipeline/sources.source_grid) -> that grid in the offset form,
    codes found by rounding (exact: the values are on the grid), so nothing is rounded a second time but the fp16
    scale and offset. None when w is not on the grid (a fix-up changed it)."""
    n, k = w.shape
    kb = scale.shape[1]
    if k % kb or scale.shape != (n, kb) or low.shape != (n, kb):
        return None
    x = blocks(w, k // kb)
    s = np.where(scale != 0, scale, 1.0)[..., None]     # Q5_0's d may be negative (llama.cpp: d = max / -16)
    codes = np.rint((x - low[..., None]) / s)
    peak = float(np.abs(w).max()) or 1.0
    if float(np.abs(codes * s + low[..., None] - x).max()) > 1e-6 * peak:
        return None
    codes = codes * np.sign(s)                             # w = |scale| * codes + low
    qmax = (1 << bits) - 1
    lo, hi = codes.min(-1), codes.max(-1)
    if (hi - lo).max() > qmax:
        return None
    scale16 = np.clip(np.abs(scale), FP16_MIN_SCALE, FP16_MAX).astype(np.float16).astype(np.float32)
    offsets = low + np.float32(1 << (bits - 1)) * scale16
    # shift each block's codes by whole steps into 0..qmax, as near as they go to an offset of 0: it is stored in
    # fp16, and a Q5_0 / Q8_0 block (low = -16 d, -128 d) then has offset 0, exactly
    shift = np.clip(np.rint(offsets / scale16), -lo, qmax - hi)
    codes = codes + shift[..., None]
    offsets = offsets - shift * scale16
    return finish(w, bits, k // kb, codes, scale16[..., None], offsets[..., None])


# value + 12 -> its MXFP4_TABLE code (code 0 for both zeros), -1 for the integers the table does not hold
_MXFP4_CODE = np.full(25, -1, np.int8)
for _code in range(15, -1, -1):
    _MXFP4_CODE[int(MXFP4_TABLE[_code]) + 12] = _code


def fp16_exact(v: np.ndarray) -> bool:
    """Whether every value of v is an fp16 number (a finite power of two from 2^-24 to 2^15 is)."""
    v = np.asarray(v, np.float32)
    with np.errstate(over="ignore"):
        return bool(np.array_equal(v.astype(np.float16).astype(np.float32), v))


def on_mxfp4(w: np.ndarray, scale: np.ndarray) -> QuantizedWeight | None:
    """w [N, K], an MXFP4 weight's exact dequantization, with scale [N, K / 32] its blocks' 2^(e - 128) (the source
    grid's scale, pipeline/families.mxfp4_grid) -> the mxfp4-format weight: each value's code is the table index
    whose MXFP4_TABLE value times the block's scale it is (a value determines its code, but for 0 / -0: both code
    0 here, the same weight), so the codes are the source's and nothing is rounded. None when a scale is no fp16
    number (QLinear stores d in fp16) or a value is off the table (a fix-up changed the weight)."""
    n, k = w.shape
    if k % 32 or scale.shape != (n, k // 32) or not fp16_exact(scale):
        return None
    v = blocks(w, 32) / scale[..., None]                             # [N, kb, 32] on the table
    idx = np.rint(v)
    if not np.array_equal(idx, v) or np.abs(idx).max(initial=0) > 12:
        return None
    codes = _MXFP4_CODE[idx.astype(np.int64) + 12]                  # -1: between the table's values (5, 7, 9, ...)
    if (codes < 0).any():
        return None
    return with_error(QuantizedWeight(n, k, 4, 32, pack_bits(codes.astype(np.uint8), 4),
                                      scale.astype(np.float32).reshape(-1), None, format=MXFP4), w)


def weighted_grid(x: np.ndarray, a: np.ndarray, bits: int, steps: int = 20, spread: float = 1.0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The asymmetric grid of each block that minimises the weighted error sum_k a_k (x_k - w_hat_k)^2, searched
    as llama.cpp's make_qkx2_quants does: candidate inverse scales (qmax + t) / (max - min), t in [-spread, spread]
    (steps + 1 values); codes by rounding from the block min; then the weighted least-squares scale and min for
    those codes; each candidate judged on the stored grid (scale and offset rounded to fp16, codes rounded again).
    The min/max grid (RTN's, fp16-rounded scale first) is the first candidate: the result is never worse than it.

    x [..., bs] blocks, a [bs] (or broadcastable) weights >= 0 -> scale [...] (fp16-exact, > 0) and offset [...]
    (fp16) of w_hat = (q - 2^(bits-1)) * scale + offset, q in 0..2^bits-1."""
    x = np.asarray(x, np.float32)
    a = np.broadcast_to(np.asarray(a, np.float32), x.shape)
    qmax, mid = np.float32((1 << bits) - 1), np.float32(1 << (bits - 1))

    def stored(scale, lo):
        """fp16 scale and offset of a grid starting at `lo`, its weighted error and the grid's new start."""
        scale = np.clip(scale, FP16_MIN_SCALE, FP16_MAX).astype(np.float16).astype(np.float32)
        offset = (lo + mid * scale).astype(np.float16)
        start = offset.astype(np.float32) - mid * scale
        q = np.clip(np.rint((x - start[..., None]) / scale[..., None]), 0, qmax)
        err = (a * np.square(x - q * scale[..., None] - start[..., None])).sum(-1)
        return scale, offset, err

    lo, hi = x.min(-1), x.max(-1)
    span = hi - lo
    best_scale, best_offset, best = stored(np.where(span > 0, span / qmax, 1.0), lo)
    sw, swx = a.sum(-1), (a * x).sum(-1)
    for t in np.linspace(-spread, spread, steps + 1):
        q = np.clip(np.rint((x - lo[..., None]) * ((qmax + t) / np.where(span > 0, span, 1.0))[..., None]), 0, qmax)
        swq, swq2, swxq = (a * q).sum(-1), (a * q * q).sum(-1), (a * q * x).sum(-1)
        det = sw * swq2 - swq * swq
        ok = det > 0
        det = np.where(ok, det, 1.0)
        scale = (sw * swxq - swx * swq) / det                 # least squares of x ~ scale * q + start
        start = (swq2 * swx - swq * swxq) / det
        ok &= scale > 0
        scale, offset, err = stored(np.where(ok, scale, 1.0), start)
        take = ok & (err < best)
        best = np.where(take, err, best)
        best_scale, best_offset = np.where(take, scale, best_scale), np.where(take, offset, best_offset)
    return best_scale.astype(np.float32), best_offset.astype(np.float16)


# A tensor above this many values (1 GiB of fp32: an 8B model's 128256 x 4096 embedding and head) is quantized in row
# chunks of CHUNK_ELEMS, so the quantizer's fp32 temporaries stay a few chunk sizes; smaller ones in one go, as ever.
CHUNK_ABOVE = 1 << 28
CHUNK_ELEMS = 1 << 25


def quantize_by_rows(quantize, w: np.ndarray) -> QuantizedWeight:
    """quantize(w) [N, K] -> QuantizedWeight, in row chunks when w is large (rows are independent: the same weight;
    the errors combined over the chunks: max_rel from the peaks, rms_rel from the squared norms)."""
    n, k = w.shape
    if w.size <= CHUNK_ABOVE:
        return quantize(w)
    step = max(1, CHUNK_ELEMS // k)
    parts, peaks, sq_err, sq = [], [], 0.0, 0.0
    for a in range(0, n, step):
        chunk = np.asarray(w[a:a + step], np.float32)
        q = quantize(chunk)
        peak = float(np.abs(chunk).max())
        norm2 = float(np.square(chunk, dtype=np.float64).sum())
        parts.append(q)
        peaks.append((peak, q.max_rel * peak))
        sq, sq_err = sq + norm2, sq_err + (q.rms_rel ** 2) * norm2
    first = parts[0]
    peak = max(p for p, _ in peaks)
    out = QuantizedWeight(n, k, first.bits, first.block_size, np.concatenate([q.data for q in parts]),
                          np.concatenate([q.scales for q in parts]),
                          None if first.offsets is None else np.concatenate([q.offsets for q in parts]))
    out.max_rel = max(e for _, e in peaks) / peak if peak else 0.0
    out.rms_rel = float(np.sqrt(sq_err / sq)) if sq else 0.0
    return out
