"""PagedAttention's sliding window (attribute `window`, Mistral and Gemma 3's local layers) against the NumPy
reference: a query at position p attends to keys p - window + 1 .. p only.

Windows shorter than a block, across blocks, spans (64 keys) and parts (256 keys), over decode, prefill, chunked
prefill and long contexts; fp32 caches within 1e-5, int8 and int4 caches within the quantization bound; a row's
bits the same alone or in a batch, and the same on the AVX2 path as on the default one.
"""
from __future__ import annotations


import numpy as np
import pytest

from ortllm.bench.op_graphs import paged_attention_case, paged_attention_model, session
from tests.custom_ops.conftest import SCENARIOS, assert_close, path_at_most, sessions_on
from tests.custom_ops.test_paged_attention import LONG_CASES, check_within_quantization_bound
from tests.reference.paged_attention import paged_attention_inputs, paged_attention_ref

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

CASES = {**SCENARIOS, "long+prefill": LONG_CASES["long+prefill"], "batch_of_8": LONG_CASES["batch_of_8"],
         "long_chunk": LONG_CASES["long_chunk"]}
WINDOWS = [5, 16, 70, 300]


def _run(seqs, window, kv_dtype="float32", bs=16, heads=(9, 3), seed=0):
    attrs = dict(num_heads=heads[0], kv_num_heads=heads[1], head_size=64, block_size=bs, kv_dtype=kv_dtype,
                 window=window)
    feeds = paged_attention_case(np.random.default_rng(seed), seqs, **{k: v for k, v in attrs.items() if k != "window"})
    return feeds, session(paged_attention_model(**attrs), 2).run(None, feeds), attrs


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_window_fp32_parity(name, window):
    feeds, (attn, kc, vc), attrs = _run(CASES[name], window, seed=window)
    ref = paged_attention_ref(*paged_attention_inputs(feeds), **attrs)
    assert_close(attn, ref[0], atol=1e-5, rtol=1e-5, what="attn")
    np.testing.assert_array_equal(vc, ref[2])


def test_window_changes_the_result():
    """Not vacuous: with a window shorter than the context the output differs from full attention."""
    feeds, (windowed, _, _), attrs = _run(CASES["mixed"], 16)
    full = paged_attention_ref(*paged_attention_inputs(feeds), **{**attrs, "window": 0})[0]
    assert np.abs(windowed - full).max() > 1e-2


@pytest.mark.parametrize("kv_dtype", ["int8", "int4"])
@pytest.mark.parametrize("window", [16, 300])
@pytest.mark.parametrize("name", ["mixed", "long+prefill", "batch_of_8"])
def test_window_quantized_within_bound(name, window, kv_dtype):
    feeds, (attn, _, _, ks, vs), attrs = _run(CASES[name], window, kv_dtype, bs=32, seed=3)
    check_within_quantization_bound(feeds, attn, ks, vs, attrs, tight=False)


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_window_row_same_bits_alone_or_in_a_batch(kv_dtype):
    """A decode row at context 2047 (parts split across the pool's threads when alone) and a prefill chunk: the
    same bits alone as in a batch of other sequences (one item of many)."""
    rows = [(2047, 1), (1100, 21)]
    others = [(c, 1) for c in (37, 700, 1500, 64, 1030, 300)]
    for i, seq in enumerate(rows):
        feeds, res, attrs = _run([seq], 300, kv_dtype, seed=8)
        alone = res[0]
        batch = [seq] + others
        fb = paged_attention_case(np.random.default_rng(8), batch, **{k: v for k, v in attrs.items() if k != "window"})
        # the same sequence's q/k/v and cache rows in the batch: copy them over from the alone case
        n = seq[1]
        for key in ("q", "k", "v"):
            fb[key][:n] = feeds[key]
        for key in [k for k in ("key_cache", "value_cache", "key_scales", "value_scales") if k in feeds]:
            fb[key][fb["block_tables"][0][fb["block_tables"][0] >= 0]] = \
                feeds[key][feeds["block_tables"][0][feeds["block_tables"][0] >= 0]]
        got = session(paged_attention_model(**attrs), 2).run(None, fb)[0][:n]
        assert got.tobytes() == alone.tobytes(), f"row {i} ({seq}) differs in a batch"


def _window_bits() -> dict[str, str]:
    """int8 and int4 caches with a window: one call's attention output (hex) per case."""
    out = {}
    for name in ("mixed", "long+prefill", "batch_of_8"):
        for kv_dtype in ("int8", "int4"):
            out[f"{name}/{kv_dtype}"] = _run(CASES[name], 300, kv_dtype, seed=4)[1][0].tobytes().hex()
    return out


def test_window_same_bits_without_vnni():
    """As test_paged_attention.test_int8_attention_same_bits_without_vnni, with the window's masked spans."""
    with sessions_on(path_at_most("avx2")):
        forced = _window_bits()
    for case, bits in _window_bits().items():
        assert bits == forced[case], case


def test_negative_window_is_refused():
    with pytest.raises(Exception, match="window = -1 must be >= 0"):
        _run(CASES["decode"], -1)
