"""Reference MoE op (custom_ops/src/kernels/moe.h) in NumPy: each (token, j) term through its expert's QLinear
gate|up (SwiGLU) and down as tests/reference/qlinear.py computes them (float64 after the activation quantization;
the down's input quantized from the float32 SwiGLU output), summed over j with the routing weights in float64.

    y[t] = sum_j weight[t, j] * down_e(SwiGLU(gate_up_e(x[t]))),   e = expert[t, j]

Against the kernel the difference is the float32 accumulation, and where that moves one of the down's int8
activation codes by one, that code's step times its weights (`moe_tolerance` bounds both).
"""
from __future__ import annotations

import numpy as np

from ortllm.pipeline.qlinear_pack import PackedWeight, dequantize_packed
from tests.reference.qlinear import magnitude, qlinear_ref, quantize_activations


def moe_ref(x, expert, weight, gate_up: list[PackedWeight], down: list[PackedWeight]) -> np.ndarray:
    """float32 [T, H]; gate_up[e] [2I, H] and down[e] [H, I] as packed weights."""
    y = np.zeros((len(x), down[0].n))
    for t, j in np.ndindex(expert.shape):
        e = int(expert[t, j])
        h = qlinear_ref(x[t:t + 1], gate_up[e], epilogue="swiglu")
        y[t] += np.float64(weight[t, j]) * qlinear_ref(h, down[e])[0]
    return y.astype(np.float32)


def moe_tolerance(x, expert, weight, gate_up, down) -> np.ndarray:
    """[T, H]: per output, a bound of the kernel's difference from moe_ref. The kernel's float32 h differs from the
    reference's by the gate|up's rounding (a few ulps of its terms, carried through the SwiGLU); where that puts one
    of h's int8 codes across a rounding edge (or moves dx, h's absmax / 127, enough to), that code may be one step
    off, costing dx times its column of the down weights. Only the codes that close to an edge are allowed to flip;
    on top, a few ulps of the down's own terms."""
    tol = np.zeros((len(x), down[0].n))
    for t, j in np.ndindex(expert.shape):
        e = int(expert[t, j])
        gu, dn = gate_up[e], down[e]
        i = gu.n // 2
        pre = qlinear_ref(x[t:t + 1], gu)[0].astype(np.float64)                   # [2I] gate, up before SwiGLU
        g, u = pre[:i], pre[i:]
        mag = magnitude(x[t:t + 1], gu)[0]
        sig = 1.0 / (1.0 + np.exp(-g))
        h = g * sig * u
        # |d h| <= |d silu(g)| |u| + |silu(g)| |d u|, silu' <= 1.1; each pre-activation off by 3e-6 of its terms
        h_err = 3e-6 * (1.1 * mag[:i] * np.abs(u) + mag[i:] * np.abs(g * sig)) + 1e-6 * np.abs(h) + 1e-9
        bs = dn.block_size
        _, dx = quantize_activations(h[None].astype(np.float32), bs)
        kb = dx.shape[1]
        hp, ep = np.zeros(kb * bs), np.zeros(kb * bs)
        hp[:i], ep[:i] = h, h_err
        amax = np.abs(hp).reshape(kb, bs).max(1)
        rel = ep.reshape(kb, bs).max(1) / np.maximum(amax, 1e-30)                  # dx's relative move a block
        dx_k = np.repeat(dx[0].astype(np.float64), bs)[:i]
        safe = np.where(dx_k > 0, dx_k, 1)
        scaled = h / safe
        frac = scaled - np.floor(scaled)
        edge = np.abs(frac - 0.5) <= h_err / safe + 127 * np.repeat(rel, bs)[:i] + 1e-6
        wd = np.abs(dequantize_packed(dn).astype(np.float64))[:, :i]               # [H, I]
        flips = wd[:, edge] @ dx_k[edge]
        tol[t] += abs(float(weight[t, j])) * (3e-6 * magnitude(h[None].astype(np.float32), dn)[0] + flips + 1e-7)
    return tol
