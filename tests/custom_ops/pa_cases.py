"""Builders of PagedAttention test inputs: ragged batches over a shuffled paged KV pool."""

from __future__ import annotations

import numpy as np

from tests.custom_ops.conftest import PA_INPUTS, PA_OUTPUTS
from tests.reference.hadamard import _E4M3
from tests.reference.paged_attention import rope_cache

# (context_len, new_tokens) per sequence
SCENARIOS = {
    "prefill": [(0, 37)],
    "decode": [(45, 1), (16, 1), (0, 1), (31, 1)],          # contexts on/around block edges
    "mixed": [(30, 1), (0, 20), (17, 40), (64, 1)],        # decode + prefill + chunked prefill
    "with_idle_seq": [(10, 0), (5, 3), (33, 1)],           # a sequence with no new token
}


def make_case(rng, seqs, *, num_heads, kv_num_heads, head_size, block_size, kv_dtype="float32",
              spare_blocks=3):
    H, Hkv, D, BS = num_heads, kv_num_heads, head_size, block_size
    S = len(seqs)
    need = [-(-(c + n) // BS) for c, n in seqs]
    MB = max(need) + 1
    NB = sum(need) + spare_blocks
    ids = rng.permutation(NB).astype(np.int32)  # blocks scattered over the pool
    block_tables = np.full((S, MB), -1, dtype=np.int32)  # unused columns stay invalid
    at = 0
    for s, n_b in enumerate(need):
        block_tables[s, :n_b] = ids[at:at + n_b]
        at += n_b
    lens = np.array([n for _, n in seqs], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    ctx = np.array([c for c, _ in seqs], dtype=np.int32)
    T = int(cu[-1])
    positions = np.concatenate([np.arange(c, c + n) for c, n in seqs]).astype(np.int32)
    max_pos = int(max(c + n for c, n in seqs)) + 5
    cos, sin = rope_cache(max_pos, D)
    q = rng.standard_normal((T, H * D), dtype=np.float32)
    k = rng.standard_normal((T, Hkv * D), dtype=np.float32)
    v = rng.standard_normal((T, Hkv * D), dtype=np.float32)
    shape = (NB, Hkv, BS, D)
    feeds = dict(q=q, k=k, v=v, positions=positions, cu_seqlens=cu, context_lens=ctx,
                 block_tables=block_tables, cos_cache=cos, sin_cache=sin)
    if kv_dtype == "float32":
        feeds["key_cache"] = rng.standard_normal(shape, dtype=np.float32)
        feeds["value_cache"] = rng.standard_normal(shape, dtype=np.float32)
    else:
        if kv_dtype == "int8":
            codes = lambda: rng.integers(-127, 128, shape).astype(np.int8).view(np.uint8)  # noqa: E731
        elif kv_dtype == "int4":   # two codes a byte, each -7..7 stored as 1..15: [NB, Hkv, BS, D/2]
            packed = shape[:3] + (D // 2,)
            codes = lambda: (rng.integers(1, 16, packed) | rng.integers(1, 16, packed) << 4).astype(np.uint8)  # noqa: E731
        else:
            finite = np.flatnonzero(np.isfinite(_E4M3)).astype(np.uint8)
            codes = lambda: rng.choice(finite, shape)  # noqa: E731
        feeds["key_cache"], feeds["value_cache"] = codes(), codes()
        feeds["key_scales"] = rng.uniform(0.002, 0.03, shape[:3]).astype(np.float16)
        feeds["value_scales"] = rng.uniform(0.002, 0.03, shape[:3]).astype(np.float16)
    return feeds


def ordered(feeds):
    return [feeds[n] for n in PA_INPUTS if n in feeds]


def bind_in_place(sess, feeds: dict, caches: dict):
    """An IO binding as the engine makes it: each cache OrtValue in `caches` (name -> OrtValue, PA_INPUTS
    order) bound as its input and as its output (updated in place), the other inputs from `feeds`, attn
    allocated by ORT."""
    binding = sess.io_binding()
    for name in PA_INPUTS:
        if name in caches:
            binding.bind_ortvalue_input(name, caches[name])
        elif name in feeds:
            binding.bind_cpu_input(name, feeds[name])
    binding.bind_output("attn")
    for i, name in enumerate(caches):
        binding.bind_ortvalue_output(PA_OUTPUTS[1 + i], caches[name])
    return binding
