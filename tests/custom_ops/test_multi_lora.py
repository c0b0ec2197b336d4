"""MultiLoRA parity against tests/reference/multi_lora.py in a real onnxruntime session."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.custom_ops.conftest import LORA_INPUTS, assert_close, multi_lora_model, session
from tests.reference.multi_lora import multi_lora_ref


@pytest.fixture(scope="module")
def sess():
    return session(multi_lora_model(), threads=2)


def make_case(rng, *, T, in_dim, out_dim, n_slots, r_max, ranks, n_adapters, frac_none=0.25):
    x = rng.standard_normal((T, in_dim), dtype=np.float32)
    base_y = rng.standard_normal((T, out_dim), dtype=np.float32)
    A = rng.standard_normal((n_slots, in_dim, r_max), dtype=np.float32) / np.float32(np.sqrt(in_dim))
    B = rng.standard_normal((n_slots, r_max, out_dim), dtype=np.float32) / np.float32(np.sqrt(r_max))
    rank = np.array([ranks[i % len(ranks)] for i in range(n_slots)], dtype=np.int32)
    for s in range(n_slots):  # padding past a slot's rank must be ignored: fill it with garbage
        A[s, :, rank[s]:] = 1e6
        B[s, rank[s]:, :] = 1e6
    scale = rng.uniform(0.5, 2.0, n_slots).astype(np.float32)
    used = rng.choice(n_slots, size=n_adapters, replace=False) if n_adapters else np.array([], int)
    token_adapter = np.full(T, -1, dtype=np.int32)
    if n_adapters:
        token_adapter = rng.choice(used, size=T).astype(np.int32)
        token_adapter[rng.random(T) < frac_none] = -1
    return dict(x=x, base_y=base_y, A=A, B=B, scale=scale, rank=rank, token_adapter=token_adapter)


@pytest.mark.parametrize("T", [1, 5, 16, 64])
@pytest.mark.parametrize("n_adapters", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("ranks", [(8,), (16,), (32,), (64,), (8, 16, 32, 64)])
def test_multi_lora_parity(sess, T, n_adapters, ranks):
    rng = np.random.default_rng(T * 100 + n_adapters * 10 + len(ranks) + ranks[0])
    feeds = make_case(rng, T=T, in_dim=72, out_dim=200, n_slots=8, r_max=max(ranks),
                      ranks=ranks, n_adapters=n_adapters)
    (y,) = sess.run(None, feeds)
    ref = multi_lora_ref(*(feeds[n] for n in LORA_INPUTS))
    assert_close(y, ref, atol=1e-5, rtol=1e-5, what="y")


def test_multi_lora_fused_qkv_shapes(sess):
    """One call serves q|k|v concatenated along out (SmolLM2: 576 + 192 + 192)."""
    rng = np.random.default_rng(7)
    feeds = make_case(rng, T=16, in_dim=576, out_dim=960, n_slots=4, r_max=16, ranks=(16, 8),
                      n_adapters=4)
    (y,) = sess.run(None, feeds)
    assert_close(y, multi_lora_ref(*(feeds[n] for n in LORA_INPUTS)), atol=1e-5, rtol=1e-5, what="y")


def test_multi_lora_all_minus_one_is_base_y(sess):
    rng = np.random.default_rng(3)
    feeds = make_case(rng, T=8, in_dim=32, out_dim=48, n_slots=2, r_max=8, ranks=(8,), n_adapters=0)
    (y,) = sess.run(None, feeds)
    np.testing.assert_array_equal(y, feeds["base_y"])


def test_multi_lora_output_aliases_base_y_under_io_binding(sess):
    """Binding the same OrtValue as base_y and y: the update lands in that buffer, nothing copied."""
    rng = np.random.default_rng(11)
    feeds = make_case(rng, T=12, in_dim=64, out_dim=96, n_slots=3, r_max=16, ranks=(16,), n_adapters=3)
    ref = multi_lora_ref(*(feeds[n] for n in LORA_INPUTS))
    buf = ort.OrtValue.ortvalue_from_numpy(feeds["base_y"].copy())
    binding = sess.io_binding()
    for name in LORA_INPUTS:
        if name == "base_y":
            binding.bind_ortvalue_input(name, buf)
        else:
            binding.bind_cpu_input(name, feeds[name])
    binding.bind_ortvalue_output("y", buf)
    sess.run_with_iobinding(binding)
    assert_close(buf.numpy(), ref, atol=1e-5, rtol=1e-5, what="y (aliased base_y)")
