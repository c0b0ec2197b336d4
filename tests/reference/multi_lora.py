"""Reference MultiLoRA: y[t] = base_y[t] + scale[a] * (x[t] @ A[a][:, :r]) @ B[a][:r, :],
a = token_adapter[t], r = rank[a]; a = -1 adds nothing. With offsets [k_blocks, out] (the offset term of
an asymmetric quantized base projection) every token also gets sum_b (sum of x[t] over block b) *
offsets[b]. A, B and offsets are float16 as the op takes them (any float dtype works: each is used at
its exact value). packed_a: slot a of A holds a row-major [in, r] matrix in its first in * r elements
(the engine's layout) instead of A[a][:, :r]. DoRA rows (slot a flagged in `dora`, with a rank and a non-zero scale)
are then multiplied by dora_scale[a] [out]: y = g * (base_y + offsets + lora). One token at a time, in float64.
Adapter mixes: token_adapter [T, M] (-1 after a row's slots) with weights [T, M]: y[t] += sum_k w_k * scale[a_k] *
(x A) B (a DoRA slot is its row's only term)."""

from __future__ import annotations

import numpy as np


def slot_a(A, a: int, r: int, packed_a: bool = False) -> np.ndarray:
    """The [in, r] shrink matrix of slot a."""
    return A[a].reshape(-1)[:A.shape[1] * r].reshape(A.shape[1], r) if packed_a else A[a, :, :r]


def multi_lora_ref(x, base_y, A, B, scale, rank, token_adapter, offsets=None, block_size=0,
                   packed_a=False, dora=None, dora_scale=None, weights=None) -> np.ndarray:
    y = base_y.astype(np.float64).copy()
    if offsets is not None:
        for t in range(len(x)):
            sums = [x[t, b * block_size:(b + 1) * block_size].astype(np.float64).sum() for b in range(len(offsets))]
            y[t] += np.asarray(sums) @ offsets.astype(np.float64)
    slots = np.asarray(token_adapter).reshape(len(x), -1)
    wts = np.ones(slots.shape) if weights is None else np.asarray(weights, np.float64).reshape(slots.shape)
    for (t, k), a in np.ndenumerate(slots):
        if a < 0:
            continue
        r = int(rank[a])
        h = x[t].astype(np.float64) @ slot_a(A, a, r, packed_a).astype(np.float64)  # [r]
        y[t] += float(scale[a]) * wts[t, k] * (h @ B[a, :r, :].astype(np.float64))  # [out]
        if dora is not None and dora[a] and r > 0 and scale[a] != 0:
            y[t] *= dora_scale[a].astype(np.float64)
    return y.astype(np.float32)
