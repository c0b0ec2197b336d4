"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers") in NumPy, emitting the same MatMulNBits forms as RTN and HQQ (pipeline/quantize.py).

One linear layer y = x @ W^T, W [N, K], with calibration inputs X [n, K] of that layer. GPTQ minimises
the output error ||X W^T - X W_q^T||^2 = tr(E H E^T) / 2 (E = W - W_q, H = 2/n X^T X), not the weight
error: it quantizes the columns of W left to right and, after each one, moves that column's rounding
error onto the columns not yet quantized, along the row of the upper Cholesky factor U of H^-1:

    H += 1% * mean(diag H) * I                      dampening; dead inputs (H_kk = 0) get H_kk = 1
    U = chol(H^-1)^T                                [K, K] upper
    for each chunk of 128 columns (lazy batch: the rest of W is updated once per chunk):
        for column k in the chunk:
            k starts a block of K?  -> the block's grid (per row n) from W[:, block] as updated so far
            q_k = dequant(round(W[:, k]) on the grid)
            e = (W[:, k] - q_k) / U[k, k]
            W[:, k+1:chunk end] -= e (x) U[k, k+1:chunk end]
        W[:, chunk end:] -= E_chunk @ U[chunk, chunk end:]

Choices (and why):
- The grid is ours, per (row, block of `block_size` along K): absmax for the symmetric form, min..max
  with an fp16 offset for the asymmetric one, computed when the column loop enters the block from the
  error-updated weights (GPTQ's `groupsize` with static_groups=False). The error fed back is that of the
  value MatMulNBits really uses, fp16 rounding of the offset included. No act-order: permuting columns
  would make a block's members scattered columns, which the block grid cannot express.
- Chunks are max(128, block_size) columns, so a block never straddles a chunk and its grid sees every
  error update that precedes it (the reference implementation reads the not-yet-updated copy there).
- Dead inputs keep their weights (the reference zeroes them): a column no calibration token excited is
  quantized like RTN and feeds no error forward (its row of U is zero off the diagonal), so the artifact
  still does the right thing on inputs the calibration text never produced.
- H^-1 and its Cholesky factor in float64; the column loop in float32 on W^T (rows contiguous).
"""
from __future__ import annotations

import numpy as np

from .errors import BuildError
from .quant_grid import QuantizedWeight, dequantize, finish, weighted_grid

DAMP = 0.01          # fraction of mean(diag H) added to the diagonal (the paper's percdamp)
CHUNK = 128          # columns per lazy batch update (the paper's B)


def inverse_cholesky(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """U [K, K] upper with U^T U = (H + damp * mean(diag H) * I)^-1, float64; dead inputs (H_kk = 0) get
    H_kk = 1. The dampening grows tenfold (up to 3 times) if H is still not positive definite."""
    h = np.array(h, np.float64)
    k = h.shape[0]
    dead = np.diag(h) <= 0
    h[dead, :] = 0
    h[:, dead] = 0
    h[dead, dead] = 1.0
    mean_diag = float(np.mean(np.diag(h)))
    for attempt in range(4):
        hd = h + (damp * 10 ** attempt) * mean_diag * np.eye(k)
        try:
            # Cholesky of H with rows and columns reversed gives H = V V^T with V upper; then U = V^-1 is upper
            # and U^T U = H^-1: one factorisation and one inverse instead of inv(H) and a second Cholesky.
            v = np.linalg.cholesky(hd[::-1, ::-1])[::-1, ::-1]
        except np.linalg.LinAlgError:
            continue
        return np.triu(np.linalg.inv(v))
    raise BuildError(f"GPTQ: the calibration Hessian ({k}x{k}) is not positive definite even with "
                     f"{damp * 1000:g} x mean(diag H) added; use more --calib-tokens or --algo rtn")


class _Grid:
    """The grid of one block for all N rows: symmetric absmax, asymmetric min..max + fp16 offset, or (given
    column weights) the asymmetric grid of least weighted error (quant_grid.weighted_grid)."""

    def __init__(self, group: np.ndarray, bits: int, symmetric: bool, weights: np.ndarray | None = None):
        # group: [bs', N] error-updated weights of the block's columns (bs' < bs for a last partial block);
        # weights: [bs'] importance of those columns (diag H) or None
        self.mid, self.qmax = np.float32(1 << (bits - 1)), np.float32((1 << bits) - 1)
        if symmetric:
            scale = np.abs(group).max(0) / (self.mid - 1)
            self.scale = np.where(scale == 0, 1.0, scale).astype(np.float32)             # [N]
            self.offset = None
        elif weights is not None:
            self.scale, self.offset = weighted_grid(group.T, weights, bits)
            self.lo = self.offset.astype(np.float32) - self.mid * self.scale
        else:
            lo, hi = group.min(0), group.max(0)
            scale = (hi - lo) / self.qmax
            self.scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
            self.offset = (lo + self.mid * self.scale).astype(np.float16)                # what is stored
            self.lo = self.offset.astype(np.float32) - self.mid * self.scale              # the grid's 0

    def round(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """w [N] -> codes [N] in 0..2^bits-1 and their value as dequantize() computes it."""
        if self.offset is None:
            codes = np.clip(np.rint(w / self.scale) + self.mid, 0, self.qmax)
            return codes, (codes - self.mid) * self.scale
        codes = np.clip(np.rint((w - self.lo) / self.scale), 0, self.qmax)
        return codes, (codes - self.mid) * self.scale + self.offset.astype(np.float32)


def gptq_quantize(w: np.ndarray, h: np.ndarray, bits: int, block_size: int, symmetric: bool,
                  damp: float = DAMP, u: np.ndarray | None = None, search: bool = False) -> QuantizedWeight:
    """w [N, K] fp32, h [K, K] (any positive multiple of X^T X; not modified) -> QuantizedWeight in the
    symmetric or the offset form, with max_rel/rms_rel of the weight and out_rel, the relative output
    error on the calibration inputs: sqrt(tr(E H E^T) / tr(W H W^T)). u: inverse_cholesky(h, damp) when
    the caller already has it (projections that share an input). search (offset form): each block's grid is
    the one of least error weighted by diag(H) (mean x_k^2, llama.cpp's imatrix) instead of min..max."""
    w = np.asarray(w, np.float32)
    n, k = w.shape
    if h.shape != (k, k):
        raise ValueError(f"GPTQ: Hessian shape {h.shape} does not match the weight's K = {k}")
    u = (inverse_cholesky(h, damp) if u is None else u).astype(np.float32)
    kb = -(-k // block_size)
    chunk = max(CHUNK, block_size)                       # a power of two: blocks never straddle chunks
    wt = w.T.copy()                                      # [K, N], updated in place
    codes = np.full((kb * block_size, n), (1 << (bits - 1)), np.float32)   # padding: code mid (value 0 / offset)
    scales = np.empty((kb, n), np.float32)
    offsets = None if symmetric else np.empty((kb, n), np.float32)
    grid = None
    # the search's weights: E[x_k^2] up to a factor; a dead input weighs as much as the dampening adds (it still
    # counts a little; dampening every input measured a little worse on SmolLM2's head)
    diag = np.diag(h)
    importance = np.where(diag > 0, diag, damp * np.mean(diag)).astype(np.float32)
    for c0 in range(0, k, chunk):
        c1 = min(c0 + chunk, k)
        wc, uc = wt[c0:c1], u[c0:c1, c0:c1]
        err = np.empty_like(wc)                          # [c1 - c0, N] scaled errors of the chunk
        for i in range(c1 - c0):
            col = c0 + i
            if col % block_size == 0:
                b = col // block_size
                end = min(col + block_size, k)
                grid = _Grid(wt[col:end], bits, symmetric, importance[col:end] if search else None)
                scales[b] = grid.scale
                if offsets is not None:
                    offsets[b] = grid.offset
            codes[col], q = grid.round(wc[i])
            err[i] = (wc[i] - q) / uc[i, i]
            wc[i + 1:] -= np.outer(uc[i, i + 1:], err[i])
        if c1 < k:
            wt[c1:] -= u[c0:c1, c1:].T @ err
    out = finish(w, bits, block_size, codes.T.reshape(n, kb, block_size), scales.T[..., None],
                  None if offsets is None else offsets.T[..., None])
    out.out_rel = output_error(w, out, h)
    return out


def output_error(w: np.ndarray, q: QuantizedWeight, h: np.ndarray) -> float:
    """sqrt(tr(E H E^T) / tr(W H W^T)) = ||X (W - W_q)^T|| / ||X W^T|| for H proportional to X^T X."""
    h = np.asarray(h, np.float32)                  # fp32 products (a report figure), sums in float64
    e = dequantize(q) - w
    den = float(np.einsum("nk,nk->", w @ h, w, dtype=np.float64))
    num = float(np.einsum("nk,nk->", e @ h, e, dtype=np.float64))
    return float(np.sqrt(max(num, 0.0) / den)) if den > 0 else 0.0


class GPTQQuantizer:
    """quantize(w, hessian) -> QuantizedWeight; the hessian comes from calibration activations
    (pipeline/calib_activations.py). Same forms as RTNQuantizer: symmetric or the offset form."""
    needs_data = True

    def __init__(self, bits: int, block_size: int, symmetric: bool, damp: float = DAMP, search: bool = False):
        self.bits, self.block_size, self.symmetric, self.damp, self.search = bits, block_size, symmetric, damp, search
        self._h = self._u = None        # the last Hessian and its factor: q|k|v and gate|up share one input

    def quantize(self, w: np.ndarray, hessian: np.ndarray) -> QuantizedWeight:
        if hessian is not self._h:
            self._h, self._u = hessian, inverse_cholesky(hessian, self.damp)
        return gptq_quantize(w, hessian, self.bits, self.block_size, self.symmetric, self.damp, self._u, self.search)

    dequantize = staticmethod(dequantize)
