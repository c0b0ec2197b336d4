"""Packs a QuantizedWeight into ortllm::QLinear's engine-native layout, and the NumPy unpacker the
reference uses (custom_ops/src/kernels/qlinear.h draws the layout; custom_ops/README.md explains it).

    pack(q: QuantizedWeight)  -> PackedWeight   codes [G, kb, bs * bits] u8, scales/offsets [G, kb, 8] f16
    unpack_codes(p)           -> int32 [N, kb * bs]   codes as the kernel reads them (int4: 0..15, int8: signed)
    dequantize_packed(p)      -> fp32 [N, kb * bs]    w = d * (code - zp) + m, zp = 8 for int4, 0 for int8;
                                                      mxfp4 (format): w = MXFP4_TABLE[code] * d

Rows go in groups of 8 (N padded to a multiple of 8 with zero rows), one group's 8 rows interleaved per
sub-block of 32 elements so that one 32-byte load feeds 8 output rows, each 32-bit lane one row:
    int4: chunk j (0..3) = for each row r, 4 bytes: low nibbles elements 8j..8j+3, high nibbles 8j+4..8j+7
    int8: chunk i (0..7) = for each row r, elements 4i..4i+3 (two's complement bytes)
From QuantizedWeight (MatMulNBits' form, w = (c - 2^(bits-1)) * scale + offset): int4 codes are kept
as they are with zp = 8, int8 codes become c - 128 (signed) with zp = 0; d = scale and m = offset in
fp16 (pipeline/quantize.py keeps scales fp16-exact, so d is exact; m was fp16 already). An mxfp4 weight (gpt-oss's
MXFP4 experts, quant_grid.on_mxfp4) packs its 4-bit table codes as int4's, with d = the block's 2^(e - 128) and no m:
4.5 bits a weight (attribute weight_format "mxfp4"), where the same weight kept exact as int8 takes 9 (d and m).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .quant_grid import MXFP4, MXFP4_TABLE, QuantizedWeight, unpack_bits

ZERO_POINT = {4: 8, 8: 0}


@dataclass
class PackedWeight:
    n: int
    k: int
    bits: int
    block_size: int
    codes: np.ndarray            # uint8 [G, kb, bs * bits]
    scales: np.ndarray           # float16 [G, kb, 8]
    offsets: np.ndarray | None   # float16 [G, kb, 8] or None
    format: str = "affine"       # or MXFP4: the codes index MXFP4_TABLE (bits 4, no offsets)

    @property
    def groups(self) -> int:
        return -(-self.n // 8)

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.block_size)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.codes, self.scales, self.offsets) if a is not None)

    @property
    def bits_per_weight(self) -> float:
        """The packed bytes (codes, scales, offsets; padding included) x 8 over the N x K weights."""
        return 8 * self.nbytes / (self.n * self.k)


def _rows8(a: np.ndarray, groups: int) -> np.ndarray:
    """[N, ...] -> [G * 8, ...] with zero rows appended."""
    pad = groups * 8 - a.shape[0]
    return a if pad == 0 else np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])


def _per_block(v: np.ndarray, n: int, kb: int, groups: int) -> np.ndarray:
    """Per-(row, block) values [N * kb] or [N, kb] -> float16 [G, kb, 8] (lane = row in group)."""
    v = _rows8(np.asarray(v, np.float32).reshape(n, kb), groups)
    return np.ascontiguousarray(v.reshape(groups, 8, kb).transpose(0, 2, 1)).astype(np.float16)


PACK_ROWS = 8192      # rows packed at a time (a multiple of 8): the int32 codes of a 128256-row head stay small


def pack(q: QuantizedWeight) -> PackedWeight:
    """The engine layout, PACK_ROWS rows at a time (groups of 8 rows are independent: the same bytes)."""
    if q.n <= PACK_ROWS:
        return _pack(q)
    kb = q.k_blocks
    scales = q.scales.reshape(q.n, kb)
    parts = [_pack(QuantizedWeight(min(PACK_ROWS, q.n - a), q.k, q.bits, q.block_size, q.data[a:a + PACK_ROWS],
                                   scales[a:a + PACK_ROWS].reshape(-1),
                                   None if q.offsets is None else q.offsets[a:a + PACK_ROWS]))
             for a in range(0, q.n, PACK_ROWS)]
    return PackedWeight(q.n, q.k, q.bits, q.block_size, np.concatenate([p.codes for p in parts]),
                        np.concatenate([p.scales for p in parts]),
                        None if q.offsets is None else np.concatenate([p.offsets for p in parts]), q.format)


def _pack(q: QuantizedWeight) -> PackedWeight:
    if q.bits not in ZERO_POINT:
        raise ValueError(f"QLinear packs 4- or 8-bit weights; got {q.bits} bits")
    if q.block_size % 32:
        raise ValueError(f"QLinear needs a block size that is a multiple of 32; got {q.block_size}")
    if q.format == MXFP4 and (q.bits != 4 or q.offsets is not None):
        raise ValueError("an mxfp4 weight has 4-bit codes and no offsets")
    n, kb, bs, groups = q.n, q.k_blocks, q.block_size, -(-q.n // 8)
    codes = unpack_bits(q.data, q.bits).astype(np.int32)                  # [N, kb, bs], 0..2^bits-1
    if q.bits == 8:
        codes -= 128
    codes = _rows8(codes, groups)
    sub = bs // 32
    if q.bits == 4:
        c = codes.reshape(groups, 8, kb, sub, 4, 2, 4)                    # e = 8j + 4 * half + i
        byte = (c[..., 0, :] | (c[..., 1, :] << 4))                       # [G, 8, kb, sub, 4, 4]
    else:
        byte = codes.reshape(groups, 8, kb, sub, 8, 4) & 0xFF              # e = 4i + i'
    packed = np.ascontiguousarray(byte.transpose(0, 2, 3, 4, 1, 5)).astype(np.uint8).reshape(groups, kb, bs * q.bits)
    scales = _per_block(q.scales, n, kb, groups)
    offsets = None if q.offsets is None else _per_block(q.offsets.astype(np.float32), n, kb, groups)
    return PackedWeight(n, q.k, q.bits, bs, packed, scales, offsets, q.format)


def unpack_codes(p: PackedWeight) -> np.ndarray:
    """int32 [N, kb * bs]: the codes as the kernel reads them (int4 unsigned, int8 signed)."""
    g, kb, bs, sub = p.groups, p.k_blocks, p.block_size, p.block_size // 32
    if p.bits == 4:
        b = p.codes.reshape(g, kb, sub, 4, 8, 4).astype(np.int32)         # [G, kb, sub, j, r, i]
        c = np.stack([b & 0x0F, b >> 4], axis=-2)                         # [G, kb, sub, j, r, half, i]
        c = c.transpose(0, 4, 1, 2, 3, 5, 6)                              # [G, r, kb, sub, j, half, i]
    else:
        c = p.codes.reshape(g, kb, sub, 8, 8, 4).view(np.int8).astype(np.int32)
        c = c.transpose(0, 4, 1, 2, 3, 5)                                 # [G, r, kb, sub, i, i']
    return c.reshape(g * 8, kb * bs)[:p.n]


def _lanes(v: np.ndarray, p: PackedWeight) -> np.ndarray:
    """float16 [G, kb, 8] -> float32 [N, kb]"""
    return v.astype(np.float32).transpose(0, 2, 1).reshape(p.groups * 8, p.k_blocks)[:p.n]


def dequantize_packed(p: PackedWeight) -> np.ndarray:
    """fp32 [N, kb * bs] (K padded to whole blocks): the weight QLinear multiplies by."""
    codes = unpack_codes(p).reshape(p.n, p.k_blocks, p.block_size)
    levels = MXFP4_TABLE[codes].astype(np.float32) if p.format == MXFP4 else \
        codes.astype(np.float32) - np.float32(ZERO_POINT[p.bits])
    w = levels * _lanes(p.scales, p)[..., None]
    if p.offsets is not None:
        w = w + _lanes(p.offsets, p)[..., None]
    return w.reshape(p.n, -1)


def stack_experts(parts: list[PackedWeight]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """E experts' packed weights of one projection (same shape, bits, block) -> the MoE op's stacks: codes
    [E, G, kb, bs * bits], scales and offsets [E, G, kb, 8] (offsets None unless every expert has them)."""
    first = parts[0]
    if any((p.n, p.k, p.bits, p.block_size, p.format) != (first.n, first.k, first.bits, first.block_size, first.format)
           for p in parts):
        raise ValueError("stack_experts needs every expert's weight of one shape, bits, block size and format")
    if any((p.offsets is None) != (first.offsets is None) for p in parts):
        raise ValueError("stack_experts needs every expert's weight with block offsets, or none")
    offsets = None if first.offsets is None else np.stack([p.offsets for p in parts])
    return np.stack([p.codes for p in parts]), np.stack([p.scales for p in parts]), offsets
