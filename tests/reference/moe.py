"""Reference MoE op (custom_ops/src/kernels/moe.h) in NumPy: each (token, j) term through its expert's QLinear
gate|up, its bias and activation, and down (+ its bias) as tests/reference/qlinear.py computes them (float64 after
the activation quantization; the down's input quantized from the float32 activation output), summed over j with the
routing weights in float64.

    y[t] = sum_j weight[t, j] * (down_e(act(gate_up_e(x[t]) + bgu_e)) + bd_e),   e = expert[t, j]

act: "swiglu" SiLU(g) * u, or "clamped_swiglu" (gpt-oss) (clamp(u, -limit, limit) + 1) * g' sigmoid(alpha g'),
g' = min(g, limit). Against the kernel the difference is the float32 accumulation, and where that moves one of the
down's int8 activation codes by one, that code's step times its weights (`moe_tolerance` bounds both).
"""
from __future__ import annotations

import numpy as np

from ortllm.pipeline.qlinear_pack import PackedWeight, dequantize_packed
from tests.reference.qlinear import dequantized_activations, magnitude, qlinear_ref, quantize_activations


def expert_act(g, u, activation: str = "swiglu", alpha: float = 1.702, limit: float = 7.0):
    """float64 act(gate, up), elementwise."""
    if activation == "clamped_swiglu":
        g = np.minimum(g, limit)
        return (np.clip(u, -limit, limit) + 1.0) * g / (1.0 + np.exp(-alpha * g))
    return g / (1.0 + np.exp(-g)) * u


def _pre(x_row, gu: PackedWeight, bias) -> tuple[np.ndarray, np.ndarray]:
    """float64 (gate, up) of one token before the activation, with its bias [2I] (or None)."""
    pre = (dequantized_activations(x_row, gu.block_size) @ dequantize_packed(gu).astype(np.float64).T)[0]
    if bias is not None:
        pre = pre + bias.astype(np.float64)
    i = gu.n // 2
    return pre[:i], pre[i:]


def moe_ref(x, expert, weight, gate_up: list[PackedWeight], down: list[PackedWeight], *, gate_up_bias=None,
            down_bias=None, activation="swiglu", alpha=1.702, limit=7.0) -> np.ndarray:
    """float32 [T, H]; gate_up[e] [2I, H] and down[e] [H, I] as packed weights; biases [E, 2I] and [E, H] or None."""
    y = np.zeros((len(x), down[0].n))
    for t, j in np.ndindex(expert.shape):
        e = int(expert[t, j])
        g, u = _pre(x[t:t + 1], gate_up[e], None if gate_up_bias is None else gate_up_bias[e])
        h = expert_act(g, u, activation, alpha, limit).astype(np.float32)[None]
        r = qlinear_ref(h, down[e])[0].astype(np.float64)
        if down_bias is not None:
            r = r + down_bias[e].astype(np.float64)
        y[t] += np.float64(weight[t, j]) * r
    return y.astype(np.float32)


def moe_tolerance(x, expert, weight, gate_up, down, *, gate_up_bias=None, down_bias=None, activation="swiglu",
                  alpha=1.702, limit=7.0) -> np.ndarray:
    """[T, H]: per output, a bound of the kernel's difference from moe_ref. The kernel's float32 h differs from the
    reference's by the gate|up's rounding (a few ulps of its terms, and one of the bias add, carried through the
    activation: bounded by the activation's largest move over the box of its inputs' errors, twice); where that puts
    one of h's int8 codes across a rounding edge (or moves dx, h's absmax / 127, enough to), that code may be one
    step off, costing dx times its column of the down weights. Only the codes that close to an edge are allowed to
    flip; on top, a few ulps of the down's own terms and of its bias add."""
    tol = np.zeros((len(x), down[0].n))
    for t, j in np.ndindex(expert.shape):
        e = int(expert[t, j])
        gu, dn = gate_up[e], down[e]
        i = gu.n // 2
        g, u = _pre(x[t:t + 1], gu, None if gate_up_bias is None else gate_up_bias[e])
        mag = magnitude(x[t:t + 1], gu)[0]
        eg, eu = 3e-6 * mag[:i] + 1.2e-7 * np.abs(g), 3e-6 * mag[i:] + 1.2e-7 * np.abs(u)
        h = expert_act(g, u, activation, alpha, limit)
        corners = [expert_act(g + sg * eg, u + su * eu, activation, alpha, limit) for sg in (-1, 1) for su in (-1, 1)]
        h_err = 2 * np.max([np.abs(c - h) for c in corners], 0) + 1e-6 * np.abs(h) + 1e-9
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
        mag_d = magnitude(h[None].astype(np.float32), dn)[0]
        bias_ulp = 0.0 if down_bias is None else 1.2e-7 * (mag_d + np.abs(down_bias[e]))
        tol[t] += abs(float(weight[t, j])) * (3e-6 * mag_d + flips + bias_ulp + 1e-7)
    return tol
