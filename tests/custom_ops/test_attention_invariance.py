"""PagedAttention gives every query token the same bits however its sequence's prefill is chunked: in one call,
in uneven chunks, or one token at a time (decode).

Regression: a key's score was reduced by one of two horizontal-sum trees depending on whether it fell in a
group of four keys or in the tail of a block, and on whether its query row was paired with another; which
one depends on the tile's row and key counts, i.e. on the prefill chunking and the batch. Quantized models
amplify such last-bit differences (int8 activation rounding): greedy text diverged between a prompt alone
and the same prompt in a mixed batch with chunked prefill (tests/runtime/test_batch_invariance.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.custom_ops.conftest import paged_attention_model, session
from tests.custom_ops.pa_cases import make_case

H, HKV, D, BS = 9, 3, 64, 16      # SmolLM2's attention
N = 40                            # tokens of the sequence (3 blocks, the last partial)


def _attention(sess, case: dict, kv_dtype: str, chunks: list[int]) -> np.ndarray:
    """The sequence's attention rows [N, H * D] when its tokens come in `chunks` (one call each, the cache
    carried from call to call)."""
    caches = {k: case[k] for k in ("key_cache", "value_cache", "key_scales", "value_scales") if k in case}
    out, start = [], 0
    for n in chunks:
        feeds = dict(q=case["q"][start:start + n], k=case["k"][start:start + n], v=case["v"][start:start + n],
                     positions=np.arange(start, start + n, dtype=np.int32),
                     cu_seqlens=np.array([0, n], np.int32), context_lens=np.array([start], np.int32),
                     block_tables=case["block_tables"], cos_cache=case["cos_cache"], sin_cache=case["sin_cache"],
                     **caches)
        res = sess.run(None, feeds)
        out.append(res[0])
        caches["key_cache"], caches["value_cache"] = res[1], res[2]
        if kv_dtype != "float32":
            caches["key_scales"], caches["value_scales"] = res[3], res[4]
        start += n
    return np.concatenate(out)


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_same_bits_whatever_the_chunking(kv_dtype):
    case = make_case(np.random.default_rng(3), [(0, N)], num_heads=H, kv_num_heads=HKV, head_size=D,
                     block_size=BS, kv_dtype=kv_dtype)
    sess = session(paged_attention_model(num_heads=H, kv_num_heads=HKV, head_size=D, block_size=BS,
                                         kv_dtype=kv_dtype), threads=2)
    whole = _attention(sess, case, kv_dtype, [N])
    for chunks in ([23, 17], [5, 11, 13, 11], [N - 4, 1, 1, 1, 1], [1] * N):
        np.testing.assert_array_equal(_attention(sess, case, kv_dtype, chunks), whole, err_msg=str(chunks))
