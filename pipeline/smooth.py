"""SmoothQuant for the projections that read an RMSNorm output (Xiao et al. 2023, "SmoothQuant").

Why: with accuracy_level 4 MatMulNBits quantizes its input to int8 per block of K, and the outputs of
input_layernorm and post_attention_layernorm carry a few channels far larger than the rest, so one
outlier sets the step of its whole block. On SmolLM2 int8 (4094 tokens, docs/quality.md) fp32 compute on
q|k|v alone takes the PPL ratio from 1.0060 to 1.0018 and on gate|up to 1.0029; on o_proj and down_proj
it changes nothing. Those two inputs are exactly the ones a norm's weight can rescale for free:

    x = rmsnorm(h) * g             [T, K]        g: the norm weight [K]
    y = x @ W^T                    W [N, K] (q, k, v stacked; or gate, up)
      = (x / s) @ (W * s)^T        for any s [K] > 0: g' = g / s, W' = W * s (columns), same function

    s_j = rms(x_j)^alpha / max_i |W_ij|^(1 - alpha)      (per input channel j; alpha = migration strength)

so the activation's outliers move into the weights, which int8 quantizes per block of 32 with far less
loss. rms(x_j) comes from the calibration pass (diag of X^T X, pipeline/calib_activations.py), measured on
the fp32 model with the original weights. The result is exact in fp32; only the rounding changes.

down_proj reads no norm, but its input is linear in up_proj's output (a GLU MLP: act(gate) * up), so up_proj's
rows carry the rescale instead of a norm weight (`down_alpha`, --smooth-down):

    a = act(x Wg^T) * (x Wu^T)      [T, I]
    y = a @ Wd^T = (a / s) @ (Wd * s)^T,   a / s = act(x Wg^T) * (x (Wu / s[:, None])^T)

Off by default: on Gemma 3 270M int8 it moves held-out KLD from code (0.0038 -> 0.0031) to prose (0.0057 -> 0.0063),
all domains equal within their errors (docs/quality-gemma3.md).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ortllm.runtime import contract as C

from .errors import BuildError
from .weights import LazyTensors, ModelWeights, norm_names

# norm role (weights.norm_names: the family names it) -> the projections that read its output (HF names under
# model.layers.{i}.); Gemma's post_attention_layernorm is the attention's output norm, not the MLP's input one
SMOOTHED = {"attn_in": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "mlp_in": ("mlp.gate_proj", "mlp.up_proj")}
S_RANGE = (1e-2, 1e2)   # clip of s: a dead channel (rms 0) or a zero weight column must not blow up g'


def check_alpha(alpha: float) -> None:
    if not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise BuildError(f"--smooth must be a migration strength in [0, 1] (0: off; SmoothQuant uses 0.5); "
                         f"got {alpha!r}")


def smoothing_scales(channel_rms: np.ndarray, ws: list[np.ndarray], alpha: float) -> np.ndarray:
    """s [K] for one norm output: channel_rms [K], ws the [N_i, K] weights that read it."""
    w_max = np.max(np.stack([np.abs(w).max(axis=0) for w in ws]), axis=0)      # [K]
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(channel_rms, alpha) / np.power(w_max, 1.0 - alpha)
    s = np.where(np.isfinite(s) & (s > 0), s, 1.0)
    s /= np.exp(np.mean(np.log(s)))           # geometric mean 1: weights and norms keep their magnitude
    return np.clip(s, *S_RANGE).astype(np.float32)


def smooth_weights(weights: ModelWeights, alpha: float, channel_rms,
                   down_alpha: float = 0.0) -> tuple[ModelWeights, dict]:
    """A copy of `weights` with every SMOOTHED norm/projection group rescaled by `alpha` (0: none) and, with
    `down_alpha`, each layer's down_proj input through up_proj's rows (the originals untouched).

    channel_rms(hf_weight_name) -> [K] RMS of that projection's input over the calibration tokens.
    Returns the new weights and a report {norm or up_proj name: {s_min, s_max, s (the scales [K])}}."""
    check_alpha(alpha)
    check_alpha(down_alpha)
    lazy = isinstance(weights.tensors, LazyTensors)
    # a lazy source stays lazy (each rescaled tensor made when the graph builder reads it: an 8B model's fp32 copy
    # never exists); the scales are computed here, each weight read once for its column maxima
    tensors, report = weights.tensors.copy() if lazy else dict(weights.tensors), {}

    def rescale(name: str, fix) -> None:
        if lazy:
            tensors.transform(name, lambda w: fix(w).astype(np.float32))
        else:
            tensors[name] = fix(tensors[name]).astype(np.float32)

    roles = norm_names(weights.config)
    for i in range(weights.config.num_layers):
        for role, targets in (SMOOTHED.items() if alpha else ()):
            norm = roles[role]
            names = [f"model.layers.{i}.{t}.weight" for t in targets]
            g_name = f"model.layers.{i}.{norm}.weight"
            s = smoothing_scales(np.asarray(channel_rms(names[0]), np.float64),
                                 [weights.tensors[n] for n in names], alpha)
            rescale(g_name, lambda w, s=s: w / s)
            for n in names:
                rescale(n, lambda w, s=s: w * s[None, :])
            report[g_name] = {"s_min": float(s.min()), "s_max": float(s.max()), "s": s}
        if down_alpha:      # after gate|up's columns: rows and columns scale independently
            up, down = f"model.layers.{i}.mlp.up_proj.weight", f"model.layers.{i}.mlp.down_proj.weight"
            s = smoothing_scales(np.asarray(channel_rms(down), np.float64), [weights.tensors[down]], down_alpha)
            rescale(up, lambda w, s=s: w / s[:, None])
            rescale(down, lambda w, s=s: w * s[None, :])
            report[up] = {"s_min": float(s.min()), "s_max": float(s.max()), "s": s}
    return replace(weights, tensors=tensors), report


def adapter_scales(config, report: dict) -> dict[str, np.ndarray]:
    """smooth_weights' report as the artifact's C.SMOOTHING tensors, which map an adapter trained on the original
    weights onto the smoothed ones (runtime/smoothing.py): a norm's s is the input scale of each projection reading
    it (they see x / s); --smooth-down's s is down_proj's input scale and 1 / s up_proj's output scale."""
    roles, out = norm_names(config), {}
    for i in range(config.num_layers):
        for role, targets in SMOOTHED.items():
            entry = report.get(f"model.layers.{i}.{roles[role]}.weight")
            for t in targets if entry else ():
                out[C.smoothing_name(i, t.split(".")[1], "in")] = entry["s"]
        entry = report.get(f"model.layers.{i}.mlp.up_proj.weight")
        if entry:
            out[C.smoothing_name(i, "up_proj", "out")] = (1.0 / entry["s"]).astype(np.float32)
            out[C.smoothing_name(i, "down_proj", "in")] = entry["s"]
    return out
