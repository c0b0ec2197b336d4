"""PagedAttention's attention sinks (optional input `sinks` [H], gpt-oss): each query head's softmax has one more
logit in its denominator that weights no value. Against the NumPy reference on fp32 caches (decode, prefill, mixed
batches, long contexts whose rows are split across the pool and merged, with and without a sliding window), on the
default and the scalar kernel path; on int8 / int4 caches each output row is its sink-free row times the reference's
factor sum_j e^s_j / (sum_j e^s_j + e^sink); a row's bits the same alone as in a batch; bad shapes named.
"""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.bench.op_graphs import paged_attention_case, paged_attention_model, session
from tests.custom_ops.conftest import SCENARIOS, assert_close
from tests.custom_ops.test_paged_attention import LONG_CASES
from tests.reference.paged_attention import paged_attention_inputs, paged_attention_ref

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

CASES = {**SCENARIOS, "single": LONG_CASES["single"], "long+prefill": LONG_CASES["long+prefill"],
         "batch_of_8": LONG_CASES["batch_of_8"]}
HEADS = (8, 2)


def _sinks(rng, h=HEADS[0]) -> np.ndarray:
    """Sink logits of the size of the scores (a few units), some well above them (rows mostly sunk)."""
    return (rng.standard_normal(h) * 2 + np.array([0, 4, -3, 1, 6, -1, 2, 0][:h])).astype(np.float32)


def _run(seqs, sinks, kv_dtype="float32", window=0, bs=16, seed=0, threads=2):
    attrs = dict(num_heads=HEADS[0], kv_num_heads=HEADS[1], head_size=64, block_size=bs, kv_dtype=kv_dtype)
    feeds = paged_attention_case(np.random.default_rng(seed), seqs, **attrs)
    extra = {"window": window} if window else {}
    if sinks is not None:
        feeds["sinks"] = sinks
    sess = session(paged_attention_model(**attrs, sinks=sinks is not None, **extra), threads)
    return feeds, sess.run(None, feeds), attrs | extra


@pytest.mark.parametrize("ops_path", ["default", "scalar"], indirect=True)
@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sinks_fp32_parity(name, window, ops_path):
    sinks = _sinks(np.random.default_rng(len(name)))
    feeds, (attn, _, vc), attrs = _run(CASES[name], sinks, window=window, seed=window + 1)
    ref = paged_attention_ref(*paged_attention_inputs(feeds), **attrs, sinks=sinks)
    assert_close(attn, ref[0], atol=1e-5, rtol=1e-5, what=f"attn {name} window {window}")
    np.testing.assert_array_equal(vc, ref[2])
    without = paged_attention_ref(*paged_attention_inputs(feeds), **attrs)[0]
    assert np.abs(without - ref[0]).max() > 1e-2, "the sinks should change the result"


def _row_factors(feeds, attrs, sinks) -> np.ndarray:
    """[T, H]: the reference's sum_j e^s_j / (sum_j e^s_j + e^sink) of each row (its weights' sum with the sink)."""
    *_, info = paged_attention_ref(*paged_attention_inputs(feeds), **attrs, sinks=sinks, details=True)
    return np.stack([i["probs"].sum(1) for i in info])


@pytest.mark.parametrize("kv_dtype", ["int8", "int4", "float16"])
@pytest.mark.parametrize("name", ["mixed", "single", "batch_of_8"])
def test_sinks_on_other_caches_scale_each_row(kv_dtype, name):
    """The sink only adds to a row's denominator: with it, each output row is the sink-free row times the
    reference's factor (within 1e-4 of it: the scores' rounding), on the caches' own dot paths."""
    sinks = _sinks(np.random.default_rng(5)) + np.float32(3)     # large enough to matter over 2047 keys too
    feeds, res, attrs = _run(CASES[name], sinks, kv_dtype, bs=32, seed=3)
    _, plain, _ = _run(CASES[name], None, kv_dtype, bs=32, seed=3)
    T, H, D = res[0].shape[0], HEADS[0], 64
    got, ref_rows = res[0].reshape(T, H, D).astype(np.float64), plain[0].reshape(T, H, D).astype(np.float64)
    want = _row_factors(feeds, attrs, sinks)
    assert want.min() < 0.6, "some rows should be mostly sunk"
    np.testing.assert_allclose(got, ref_rows * want[..., None], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_sinks_row_same_bits_alone_or_in_a_batch(kv_dtype):
    """A decode row at context 2047 (its parts split across threads alone, one item of many in a batch): the same
    bits, the sink merged after the same parts either way."""
    sinks = _sinks(np.random.default_rng(2))
    seq, others = (2047, 1), [(c, 1) for c in (37, 700, 1500, 64)]
    feeds, res, attrs = _run([seq], sinks, kv_dtype, seed=8)
    fb = paged_attention_case(np.random.default_rng(8), [seq] + others, **attrs)
    for key in ("q", "k", "v"):
        fb[key][:1] = feeds[key]
    for key in [k for k in ("key_cache", "value_cache", "key_scales", "value_scales") if k in feeds]:
        fb[key][fb["block_tables"][0][fb["block_tables"][0] >= 0]] = \
            feeds[key][feeds["block_tables"][0][feeds["block_tables"][0] >= 0]]
    fb["sinks"] = sinks
    got = session(paged_attention_model(**attrs, sinks=True), 2).run(None, fb)[0][:1]
    assert got.tobytes() == res[0].tobytes()
    one_thread = _run([seq], sinks, kv_dtype, seed=8, threads=1)[1][0]
    assert one_thread.tobytes() == res[0].tobytes()


def test_sinks_of_the_wrong_shape_are_named():
    with pytest.raises(Exception, match=r"PagedAttention: input 'sinks' has shape \[7\], expected \[8\]"):
        _run(CASES["decode"], np.zeros(7, np.float32))
