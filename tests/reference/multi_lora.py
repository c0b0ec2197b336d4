"""Reference MultiLoRA: y[t] = base_y[t] + scale[a] * (x[t] @ A[a][:, :r]) @ B[a][:r, :],
a = token_adapter[t], r = rank[a]; a = -1 adds nothing. One token at a time, in float64."""

from __future__ import annotations

import numpy as np


def multi_lora_ref(x, base_y, A, B, scale, rank, token_adapter) -> np.ndarray:
    y = base_y.astype(np.float64).copy()
    for t, a in enumerate(token_adapter):
        if a < 0:
            continue
        r = int(rank[a])
        h = x[t].astype(np.float64) @ A[a, :, :r].astype(np.float64)  # [r]
        y[t] += float(scale[a]) * (h @ B[a, :r, :].astype(np.float64))  # [out]
    return y.astype(np.float32)
