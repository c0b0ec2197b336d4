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

from ortllm.bench.op_graphs import paged_attention_case, paged_attention_model, session

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

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


@pytest.mark.parametrize("kv_dtype", ["float32", "int8", "fp8_e4m3", "int4"])
@pytest.mark.parametrize("heads,head_size,block_size", [((H, HKV), D, BS), ((6, 2), 128, 32), ((4, 2), 32, 8)],
                         ids=["smollm2", "d128", "d32"])
def test_same_bits_whatever_the_chunking(kv_dtype, heads, head_size, block_size):
    """Also off SmolLM2's shapes (other head sizes take other inner loops), and for int8 caches, whose decode rows
    (at most 3 per kv head) read the value codes in registers while prefill tiles widen them into a scratch first
    (vec.h pv_i8: the same operations), and whose scores are integer dots of query and key codes on every path
    (vec.h scores_q8)."""
    attrs = dict(num_heads=heads[0], kv_num_heads=heads[1], head_size=head_size, block_size=block_size,
                 kv_dtype=kv_dtype)
    case = paged_attention_case(np.random.default_rng(3), [(0, N)], **attrs)
    sess = session(paged_attention_model(**attrs), threads=2)
    whole = _attention(sess, case, kv_dtype, [N])
    for chunks in ([23, 17], [5, 11, 13, 11], [N - 4, 1, 1, 1, 1], [1] * N):
        np.testing.assert_array_equal(_attention(sess, case, kv_dtype, chunks), whole, err_msg=str(chunks))


# ---- long contexts: one row, whatever else is in the call
#
# A row's keys are processed in fixed parts of 256 keys (aligned at key 0), each with its own online softmax,
# and the parts are merged in order by the same arithmetic, whether they ran as separate work items in parallel
# (few items: a lone decode row, "flash-decoding") or one after another inside one item (a batch of 8+ rows, a
# prefill or verify tile). Regression: the key range was split only when the call had fewer than 8 work items,
# into as many parts as the pool wanted, so a long-context token decoded alone got other bits than in a batch
# or as a row of a chunked-prefill / speculative-verify tile (greedy speculative text could then differ).

LONG = [600, 1100, 2100]                  # keys the target row attends to: 3, 5 and 9 parts of 256
K_BEFORE = 20                             # tokens written just before the target (a chunk, then the target)


def _feeds(case: dict, seqs: list[int], rows: dict[int, slice], ctx: dict[int, int]) -> dict:
    """A call with the sequences `seqs` (indices into the case), sequence s feeding the case's token rows
    rows[s] at context ctx[s]."""
    pick = lambda name: np.concatenate([case[name][rows[s]] for s in seqs])  # noqa: E731
    lens = [rows[s].stop - rows[s].start for s in seqs]
    return dict(q=pick("q"), k=pick("k"), v=pick("v"),
                positions=np.concatenate([np.arange(ctx[s], ctx[s] + n) for s, n in zip(seqs, lens)]).astype(np.int32),
                cu_seqlens=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                context_lens=np.array([ctx[s] for s in seqs], np.int32),
                block_tables=case["block_tables"][seqs], cos_cache=case["cos_cache"], sin_cache=case["sin_cache"])


def _run(sess, feeds: dict, caches: dict, kv_dtype: str) -> tuple[np.ndarray, dict]:
    res = sess.run(None, {**feeds, **caches})
    names = ["key_cache", "value_cache"] + (["key_scales", "value_scales"] if kv_dtype != "float32" else [])
    return res[0], dict(zip(names, res[1:]))


@pytest.mark.parametrize("kv_dtype", ["float32", "int8", "int4"])
@pytest.mark.parametrize("BS", [16, 32])
@pytest.mark.parametrize("n_keys", LONG)
def test_long_context_row_same_bits_alone_in_a_batch_and_in_a_tile(n_keys, BS, kv_dtype):
    """The token at position n_keys - 1 of sequence 0 (its 0..n_keys-1 keys: K_BEFORE written by a chunk just
    before, the rest already cached) gets bitwise the same attention
      - decoded alone (one work item, split into pieces along its keys for the pool),
      - decoded in a batch of 8 rows (8 work items: none split), in the middle of the batch,
      - as the last row of a 21-token chunk (a 16-token tile + a 5-token tile), a 16-token chunk (the tile's
        last row) and a 5-token chunk (speculative verify of 4 drafts), each in one call, alone and next to
        the batch's decode rows."""
    target = n_keys - 1                                       # position of the target token
    others = [(int(c), 1) for c in (37, 700, 1500, 64, 2047, 300, 1024)]   # the batch's other decode rows
    case = paged_attention_case(np.random.default_rng(n_keys + BS), [(target - K_BEFORE, K_BEFORE + 1)] + others,
                                num_heads=H, kv_num_heads=HKV, head_size=D, block_size=BS, kv_dtype=kv_dtype)
    sess = session(paged_attention_model(num_heads=H, kv_num_heads=HKV, head_size=D, block_size=BS,
                                         kv_dtype=kv_dtype), threads=2)
    caches0 = {k: case[k] for k in ("key_cache", "value_cache", "key_scales", "value_scales") if k in case}
    cu = case["cu_seqlens"]
    own = {s: slice(int(cu[s]), int(cu[s + 1])) for s in range(len(others) + 1)}
    ctx = {s: int(c) for s, c in enumerate(case["context_lens"])}
    last = own[0].stop - 1                                    # the target's row in the case
    batch = [1, 2, 3, 4, 0, 5, 6, 7]                          # the target in the middle

    # the K_BEFORE tokens before the target, written by one chunk (the cache every variant below starts from)
    _, caches = _run(sess, _feeds(case, [0], {0: slice(own[0].start, last)}, ctx), caches0, kv_dtype)
    alone, _ = _run(sess, _feeds(case, [0], {0: slice(last, last + 1)}, {0: target}), caches, kv_dtype)
    in_batch, _ = _run(sess, _feeds(case, batch, {**own, 0: slice(last, last + 1)}, {**ctx, 0: target}), caches,
                       kv_dtype)
    assert alone.shape == (1, H * D)
    np.testing.assert_array_equal(in_batch[4:5], alone, err_msg="decoded in a batch of 8 vs alone")
    for n_chunk in (K_BEFORE + 1, 16, 5):                     # the target as the last row of a chunk
        first = last + 1 - n_chunk
        c0 = {0: target + 1 - n_chunk}
        _, caches = _run(sess, _feeds(case, [0], {0: slice(own[0].start, first)}, ctx), caches0, kv_dtype)
        tile, _ = _run(sess, _feeds(case, [0], {0: slice(first, last + 1)}, c0), caches, kv_dtype)
        np.testing.assert_array_equal(tile[-1:], alone, err_msg=f"last row of a {n_chunk}-token chunk vs alone")
        mixed, _ = _run(sess, _feeds(case, batch, {**own, 0: slice(first, last + 1)}, {**ctx, **c0}), caches,
                        kv_dtype)
        np.testing.assert_array_equal(mixed[4 + n_chunk - 1:4 + n_chunk], alone,
                                      err_msg=f"last row of a {n_chunk}-token chunk in a batch vs alone")
