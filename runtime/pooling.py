"""Embeddings from the final hidden states: pooling over a sequence's tokens and L2 normalization.

The engine graph returns the final RMSNorm's output on an embedding request's rows (contract: hidden_states);
the engine keeps them by position, so a prompt split into other chunks, recomputed after preemption or run beside
other requests gives the same rows, and pools them once when its last chunk has run:

    mean:  sum over the prompt's rows (in position order, float64) / n     (llama.cpp's --pooling mean)
    last:  the last prompt token's row                                     (--pooling last)
"""
from __future__ import annotations

import numpy as np

from .sampling_params import POOLINGS


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """hidden: [n, H] float32, the rows the request kept (mean: every prompt row; last: the last one) -> [H]
    float32."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}; got {pooling!r}")
    if pooling == "last":
        return np.array(hidden[-1], dtype=np.float32)
    return (hidden.sum(axis=0, dtype=np.float64) / len(hidden)).astype(np.float32)


def normalize(v: np.ndarray, dimensions: int | None = None) -> np.ndarray:
    """v [..., H] L2-normalized along its last axis, after keeping its first `dimensions` entries (None: all):
    a shorter embedding that is still a unit vector, as OpenAI's `dimensions` gives. A zero vector stays zero."""
    v = np.asarray(v, dtype=np.float32)
    if dimensions is not None:
        v = v[..., :dimensions]
    v64 = v.astype(np.float64)
    norm = np.sqrt((v64 * v64).sum(axis=-1, keepdims=True))
    return (v64 / np.where(norm > 0, norm, 1.0)).astype(np.float32)
