"""Paired metrics against hand-checked cases (llama.cpp --kl-divergence definitions)."""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.calibration.fidelity import PairedStats, log_softmax


def test_identical_logits_are_perfect():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((300, 50)).astype(np.float32)
    s = PairedStats()
    s.add(ref, ref, rng.integers(0, 50, 300))
    out = s.summary()
    assert out["kld_mean"] == pytest.approx(0, abs=1e-12) and out["top1_agreement"] == 1.0
    assert out["ppl_ratio"] == pytest.approx(1.0) and out["ppl_ratio_err"] == pytest.approx(0, abs=1e-12)
    assert out["tokens"] == 300


def test_kld_ppl_ratio_and_error_bar():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((1000, 20))
    cand = ref + 0.3 * rng.standard_normal((1000, 20))
    tgt = rng.integers(0, 20, 1000)
    s = PairedStats()
    s.add(cand.astype(np.float32), ref.astype(np.float32), tgt, rows_per_step=64)   # chunking changes nothing
    out = s.summary()
    lr, lq = log_softmax(ref), log_softmax(cand)
    kld = (np.exp(lr) * (lr - lq)).sum(-1)
    d = -lq[np.arange(1000), tgt] + lr[np.arange(1000), tgt]
    assert out["kld_mean"] == pytest.approx(kld.mean(), rel=1e-5)
    assert out["kld_p99"] == pytest.approx(np.percentile(kld, 99), rel=1e-5)
    assert out["ppl_ratio"] == pytest.approx(np.exp(d.mean()), rel=1e-5)
    assert out["ln_ppl_ratio_err"] == pytest.approx(d.std(ddof=1) / np.sqrt(1000), rel=1e-4)
    assert out["top1_agreement"] == pytest.approx((cand.argmax(-1) == ref.argmax(-1)).mean())
