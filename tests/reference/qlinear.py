"""Reference QLinear (custom_ops/src/kernels/qlinear.h) in NumPy, float64 after the activation quantization.

    y[t] = epilogue( x_hat[t] @ W_hat^T + lscale[a] * (x[t] @ A_j[a][:, :r]) @ B_j[a][:r] per segment j )

W_hat is the packed weight as pipeline/qlinear_pack.py unpacks it (w = d * (code - zp) + m). x_hat is x
quantized per (token, block) to int8 exactly as the kernel does it, in the same float32 operations
(dx = absmax / 127, codes = rint(x * (1 / dx)), half to even), so the two differ only by the kernel's
float32 accumulation; `magnitude` gives the scale of the terms that accumulation rounds, for tolerances.
The LoRA sees the unquantized x (fp32), with A and B at their fp16 values.
"""
from __future__ import annotations

import numpy as np

from ortllm.pipeline.qlinear_pack import PackedWeight, dequantize_packed


def quantize_activations(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """x [T, K] fp32 -> codes int32 [T, kb * bs] (zero past K), dx fp32 [T, kb]."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    kb = -(-k // block_size)
    xp = np.zeros((t, kb * block_size), np.float32)
    xp[:, :k] = x
    blocks = xp.reshape(t, kb, block_size)
    dx = (np.abs(blocks).max(-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(dx != 0, np.float32(1) / dx, np.float32(0)).astype(np.float32)
    codes = np.rint(blocks * inv[..., None]).astype(np.int32)
    return codes.reshape(t, -1), dx


def dequantized_activations(x: np.ndarray, block_size: int) -> np.ndarray:
    """x_hat [T, kb * bs] float64: what the kernel's integer dot products multiply the weights by."""
    codes, dx = quantize_activations(x, block_size)
    t = codes.shape[0]
    return (codes.reshape(t, dx.shape[1], block_size) * dx[..., None].astype(np.float64)).reshape(t, -1)


def _lora(x, token_adapter, lora_scale, segments, packed_a, n):
    """[T, N] float64: each token's adapter on each segment's columns; segments = [(A, B, rank), ...]."""
    out = np.zeros((len(x), n))
    col = 0
    for A, B, rank in segments:
        width = B.shape[2]
        for t, a in enumerate(token_adapter):
            r = int(rank[a]) if a >= 0 else 0
            if r == 0 or lora_scale[a] == 0:
                continue
            a_mat = A[a].reshape(-1)[:A.shape[1] * r].reshape(A.shape[1], r) if packed_a else A[a, :, :r]
            h = x[t].astype(np.float64) @ a_mat.astype(np.float64)
            out[t, col:col + width] += float(lora_scale[a]) * (h @ B[a, :r].astype(np.float64))
        col += width
    return out


def rms_norm(x, weight, eps) -> np.ndarray:
    """float32 [T, K]: x / sqrt(mean(x^2) + eps) * weight, the op's fused input norm (sum of squares in float64)."""
    ss = np.square(x.astype(np.float64)).mean(-1, keepdims=True)
    return ((x * (1.0 / np.sqrt(ss + eps)).astype(np.float32)) * weight).astype(np.float32)


def qlinear_ref(x, w: PackedWeight, *, epilogue="none", residual=None, token_adapter=None, lora_scale=None,
                segments=(), packed_a=False, norm_weight=None, norm_eps=1e-5) -> np.ndarray:
    """float32 [T, N] ([T, N / 2] with "swiglu"); norm_weight: the input is RMSNorm(x) * norm_weight."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, norm_eps)
    x_hat = dequantized_activations(x, w.block_size)
    y = x_hat @ dequantize_packed(w).astype(np.float64).T                         # [T, N]
    if token_adapter is not None:
        y += _lora(x, token_adapter, lora_scale, segments, packed_a, w.n)
    if epilogue == "residual":
        y = residual.astype(np.float64) + y
    elif epilogue == "swiglu":
        g, u = y[:, :w.n // 2], y[:, w.n // 2:]
        y = g / (1.0 + np.exp(-g)) * u
    return y.astype(np.float32)


def magnitude(x, w: PackedWeight) -> np.ndarray:
    """|x_hat| @ |W_hat|^T [T, N]: the size of the terms the kernel's float32 sums round."""
    return np.abs(dequantized_activations(x, w.block_size)) @ np.abs(dequantize_packed(w).astype(np.float64)).T
