"""Reference QLinear (custom_ops/src/kernels/qlinear.h) in NumPy, float64 after the activation quantization.

    y[t] = epilogue( x_hat[t] @ W_hat^T + lscale[a] * (x[t] @ A_j[a][:, :r]) @ B_j[a][:r] per segment j )

W_hat is the packed weight as pipeline/qlinear_pack.py unpacks it (w = d * (code - zp) + m). x_hat is x
quantized per (token, block) to int8 exactly as the kernel does it, in the same float32 operations
(dx = absmax / 127, codes = rint(x * (1 / dx)), half to even), so the two differ only by the kernel's
float32 accumulation; `magnitude` gives the scale of the terms that accumulation rounds, for tolerances.
The LoRA runs on the same activation codes with the int8 stacks (codes and fp16 scales in the layouts of
qlinear.h, decoded here from those formulas): per 32-chunk exact integer dots, h in float64, h quantized to
int8 as the kernel does it in float32, then the expand's exact integer dots. Only h's float32 accumulation in
the kernel can move one of its int8 codes by one (`lora_terms` bounds that).
Adapter mixes: token_adapter [T, M] (-1 padding after a row's slots) with weights [T, M] (token_adapter_weight;
None: 1): a token's LoRA is the sum over its terms of w * lscale * (x A) B, each term's coef (lscale * w) * dh in
float32 as the kernel forms it; a [T] token_adapter is one term of weight 1.
DoRA rows (a slot flagged in `dora`): before the epilogue, the columns of each segment where the slot has a rank are
multiplied by the slot's scale on that segment (dora_scale[j][a]): y = epilogue(g * (x_hat W^T + lora)).
"""
from __future__ import annotations

import numpy as np

from ortllm.pipeline.qlinear_pack import PackedWeight, dequantize_packed


def quantize_activations(x: np.ndarray, block_size: int, act_bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """x [T, K] fp32 -> codes int32 [T, kb * bs] (zero past K), dx fp32 [T, kb]; act_bits 16: int16 codes,
    dx = absmax / 32767 (the op's attribute act_bits)."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    kb = -(-k // block_size)
    xp = np.zeros((t, kb * block_size), np.float32)
    xp[:, :k] = x
    blocks = xp.reshape(t, kb, block_size)
    dx = (np.abs(blocks).max(-1) / np.float32(127 if act_bits == 8 else 32767)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(dx != 0, np.float32(1) / dx, np.float32(0)).astype(np.float32)
    codes = np.rint(blocks * inv[..., None]).astype(np.int32)
    return codes.reshape(t, -1), dx


def dequantized_activations(x: np.ndarray, block_size: int, act_bits: int = 8) -> np.ndarray:
    """x_hat [T, kb * bs] float64: what the kernel's integer dot products multiply the weights by."""
    codes, dx = quantize_activations(x, block_size, act_bits)
    t = codes.shape[0]
    return (codes.reshape(t, dx.shape[1], block_size) * dx[..., None].astype(np.float64)).reshape(t, -1)


LORA_CHUNK = 32      # elements of K per scale of A (qlinear.h kLoraChunk)


def lora_a(codes, scales, k: int, r: int, lda: int) -> tuple[np.ndarray, np.ndarray]:
    """One slot of an int8 A stack (flat codes, flat scales) -> (codes int64 [K, r], scales float64 [kc, r]):
    code (k, i) at ((k // 4) * lda + i) * 4 + k % 4, scale (c, i) at c * lda + i."""
    kk, ii = np.meshgrid(np.arange(k), np.arange(r), indexing="ij")
    kc = -(-k // LORA_CHUNK)
    cc, jj = np.meshgrid(np.arange(kc), np.arange(r), indexing="ij")
    return (codes.reshape(-1)[((kk // 4) * lda + ii) * 4 + kk % 4].astype(np.int64),
            scales.reshape(-1)[cc * lda + jj].astype(np.float64))


def lora_b(codes, r: int, n: int) -> np.ndarray:
    """One slot of an int8 B stack (flat codes) -> codes int64 [r, N]: code (j, c) at ((j // 4) * N + c) * 4 + j % 4."""
    jj, cc = np.meshgrid(np.arange(r), np.arange(n), indexing="ij")
    return codes.reshape(-1)[((jj // 4) * n + cc) * 4 + jj % 4].astype(np.int64)


def lora_h(codes_t, dx_t, block_size, qa, sa) -> np.ndarray:
    """float64 [r]: the shrink of one token (activation codes [kb * bs], dx [kb]) on one slot's A."""
    k = qa.shape[0]
    h = np.zeros(qa.shape[1])
    for c in range(sa.shape[0]):
        k0, k1 = c * LORA_CHUNK, min(k, (c + 1) * LORA_CHUNK)
        h += dx_t[k0 // block_size].astype(np.float64) * sa[c] * (codes_t[k0:k1].astype(np.int64) @ qa[k0:k1])
    return h


def quantize_h(h) -> tuple[np.ndarray, np.float32]:
    """h [r] -> (int8 codes as int64, dh float32), in the kernel's float32 operations."""
    h32 = h.astype(np.float32)
    dh = np.float32(np.abs(h32).max(initial=0) / np.float32(127))
    inv = np.float32(1) / dh if dh != 0 else np.float32(0)
    return np.rint(h32 * inv).astype(np.int64), dh


def mix_terms(token_adapter, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """token_adapter [T] or [T, M], weights like it or None -> (slots [T, M] int, weights [T, M] float32)."""
    ta = np.asarray(token_adapter).reshape(len(token_adapter), -1)
    w = np.ones(ta.shape, np.float32) if weights is None else np.asarray(weights, np.float32).reshape(ta.shape)
    return ta, w


def lora_terms(x, block_size, token_adapter, lora_scale, segments, packed_a, n, weights=None):
    """([T, N] float64 LoRA per token on each segment's columns, [T, N] bound of one int8 code of h off per rank);
    segments = [(A, A_scale, B, B_scale, rank), ...] as the op takes them; token_adapter [T] or [T, M] with weights
    (mixes)."""
    codes, dx = quantize_activations(x, block_size)
    out, step = np.zeros((len(x), n)), np.zeros((len(x), n))
    slots, wts = mix_terms(token_adapter, weights)
    col = 0
    for A, sA, B, sB, rank in segments:
        k, width = A.shape[1], B.shape[2]
        for t, k_ in np.ndindex(slots.shape):
            a, w = int(slots[t, k_]), wts[t, k_]
            r = int(rank[a]) if a >= 0 else 0
            if r == 0 or lora_scale[a] == 0 or w == 0:
                continue
            qa, sa = lora_a(A[a], sA[a], k, r, r if packed_a else A.shape[2])
            qh, dh = quantize_h(lora_h(codes[t], dx[t], block_size, qa, sa))
            qb = lora_b(B[a], r, width)
            coef = np.float64(np.float32(np.float32(lora_scale[a]) * w) * dh)
            out[t, col:col + width] += coef * sB[a].astype(np.float64) * (qh @ qb)
            step[t, col:col + width] += abs(coef) * sB[a].astype(np.float64) * np.abs(qb).sum(0)
        col += width
    return out, step


def rms_norm(x, weight, eps) -> np.ndarray:
    """float32 [T, K]: x / sqrt(mean(x^2) + eps) * weight, the op's fused input norm (sum of squares in float64)."""
    ss = np.square(x.astype(np.float64)).mean(-1, keepdims=True)
    return ((x * (1.0 / np.sqrt(ss + eps)).astype(np.float32)) * weight).astype(np.float32)


def dora_row_scales(token_adapter, lora_scale, segments, dora, dora_scale, n) -> np.ndarray:
    """[T, N] float64: each token's DoRA scale on the output columns (1 for tokens of other slots, and on segments
    where a DoRA slot has rank 0)."""
    g = np.ones((len(token_adapter), n))
    token_adapter = mix_terms(token_adapter)[0][:, 0]   # a DoRA slot is its row's only term
    col = 0
    for j, (_, _, B, _, rank) in enumerate(segments):
        width = B.shape[-1]
        for t, a in enumerate(token_adapter):
            if a >= 0 and dora[a] and int(rank[a]) > 0 and lora_scale[a] != 0:
                g[t, col:col + width] = dora_scale[j][a]
        col += width
    return g


def qlinear_ref(x, w: PackedWeight, *, epilogue="none", residual=None, token_adapter=None, lora_scale=None,
                segments=(), packed_a=False, norm_weight=None, norm_eps=1e-5, dora=None, dora_scale=(),
                act_bits=8, token_adapter_weight=None) -> np.ndarray:
    """float32 [T, N] ([T, N / 2] with "swiglu" or "geglu"); norm_weight: the input is RMSNorm(x) * norm_weight."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, norm_eps)
    x_hat = dequantized_activations(x, w.block_size, act_bits)
    y = x_hat @ dequantize_packed(w).astype(np.float64).T                         # [T, N]
    if token_adapter is not None:
        y += lora_terms(x, w.block_size, token_adapter, lora_scale, segments, packed_a, w.n,
                        token_adapter_weight)[0]
        if dora is not None:
            y *= dora_row_scales(token_adapter, lora_scale, segments, dora, dora_scale, w.n)
    if epilogue == "residual":
        y = residual.astype(np.float64) + y
    elif epilogue == "swiglu":
        g, u = y[:, :w.n // 2], y[:, w.n // 2:]
        y = g / (1.0 + np.exp(-g)) * u
    elif epilogue == "geglu":      # torch's gelu(approximate="tanh"), in float64
        g, u = y[:, :w.n // 2], y[:, w.n // 2:]
        y = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3))) * u
    return y.astype(np.float32)


def magnitude(x, w: PackedWeight, act_bits: int = 8) -> np.ndarray:
    """|x_hat| @ |W_hat|^T [T, N]: the size of the terms the kernel's float32 sums round."""
    x_hat = dequantized_activations(x, w.block_size, act_bits)
    return np.abs(x_hat) @ np.abs(dequantize_packed(w).astype(np.float64)).T
