"""Reference PagedAttention (NumPy, plain loops): the semantics that ortllm::PagedAttention must match.

For every new token t of sequence s (j-th of its chunk):
    cache slot p = context_lens[s] + j  -> block block_tables[s][p // block_size], offset p % block_size
    q_t, k_t = RoPE(q_t, k_t) at positions[t]     (rope_interleaved=0: HF rotate_half, pairs (i, i+D/2))
    quantized caches with rotate=1: q_t, k_t = fwht(q_t), fwht(k_t) per head; int4 caches also v_t = fwht(v_t)
    K/V rows written to the cache (float32 copied, float16 rounded to nearest even, int8 / fp8 / int4 quantized
    per (token, head))
    int8 and int4 caches: q_t is quantized per head like an int8 key row (int8 codes, fp16 scale) and used
    dequantized, i.e. q . k = scale_q * scale_k * (integer dot of the codes), as the op computes it
Then for every new token and query head h (kv head h // (H // Hkv)):
    out[t, h] = softmax(scale * K[0..p] @ q) @ V[0..p]   (causal; float64 here; with a sliding window W the
    keys are K[max(0, p - W + 1)..p]; with sinks, the softmax's denominator has one more term e^sinks[h], which
    weights no value: the row's weights sum to less than 1)
    (int4 with rotate=1: out[t, h] = fwht(that), the values' rotation undone; fwht is its own inverse)
reading K/V back from the cache, i.e. new tokens attend to their own quantized rows.

`quantize_new=False` keeps this call's new rows exact (float) while the pre-existing cache content is
still dequantized: the "no quantization error in this call" answer that the tests bound the op
against. `details=True` also returns, per token, what the error bound needs.
"""

from __future__ import annotations

import numpy as np

from ortllm.bench.op_graphs import PA_INPUTS
from tests.reference.hadamard import dequantize, fwht, quantize


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool = False) -> np.ndarray:
    """x: [..., D]; cos/sin: [D/2] for this position."""
    x = x.astype(np.float64)
    half = x.shape[-1] // 2
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def paged_attention_inputs(feeds: dict) -> list:
    """The op's feeds (bench/op_graphs.paged_attention_case) in the node's input order up to the caches' scales:
    paged_attention_ref's positional arguments (it takes `sinks` by name)."""
    return [feeds[n] for n in PA_INPUTS if n in feeds and n != "sinks"]


def paged_attention_ref(
    q, k, v, positions, cu_seqlens, context_lens, block_tables, cos_cache, sin_cache,
    key_cache, value_cache, key_scales=None, value_scales=None, *,
    num_heads: int, kv_num_heads: int, head_size: int, block_size: int,
    kv_dtype: str = "float32", rotate: int | None = None, scale: float | None = None,
    rope_interleaved: int = 0, quantize_new: bool = True, details: bool = False, window: int = 0, sinks=None,
):
    """Returns (attn [T, H*D] f32, key_cache, value_cache, key_scales, value_scales[, details]).
    window > 0: a query at position p attends to keys max(0, p - window + 1) .. p only (sliding window);
    sinks: [H] attention-sink logits (gpt-oss), or None."""
    H, Hkv, D, BS = num_heads, kv_num_heads, head_size, block_size
    G = H // Hkv
    eight_bit = kv_dtype not in ("float32", "float16")   # any cache of codes with scales (int8, fp8, int4)
    int_dots = kv_dtype in ("int8", "int4")
    rotate = (1 if eight_bit else 0) if rotate is None else rotate
    scale = 1.0 / np.sqrt(D) if not scale else scale
    T, S = q.shape[0], len(context_lens)
    key_cache, value_cache = key_cache.copy(), value_cache.copy()
    if eight_bit:
        key_scales, value_scales = key_scales.copy(), value_scales.copy()
        k_shadow = dequantize(key_cache, key_scales, kv_dtype).astype(np.float64)
        v_shadow = dequantize(value_cache, value_scales, kv_dtype).astype(np.float64)
    else:
        k_shadow = key_cache.astype(np.float64)
        v_shadow = value_cache.astype(np.float64)
    is_new = np.zeros(key_cache.shape[:3], dtype=bool)  # [NB, Hkv, BS]

    seq_of = np.repeat(np.arange(S), np.diff(cu_seqlens))
    q_rot = np.zeros((T, H, D))
    for t in range(T):
        s = seq_of[t]
        p = context_lens[s] + t - cu_seqlens[s]
        c, sn = cos_cache[positions[t]].astype(np.float64), sin_cache[positions[t]].astype(np.float64)
        qt = rope(q[t].reshape(H, D), c, sn, rope_interleaved)
        kt = rope(k[t].reshape(Hkv, D), c, sn, rope_interleaved)
        vt = v[t].reshape(Hkv, D).astype(np.float64)
        if rotate:
            qt, kt = fwht(qt), fwht(kt)
        if rotate and kv_dtype == "int4":
            vt = fwht(vt)
        q_rot[t] = dequantize(*quantize(qt.astype(np.float32), "int8"), "int8") if int_dots else qt
        blk, off = block_tables[s][p // BS], p % BS
        is_new[blk, :, off] = True
        if not eight_bit:   # float16: rounded once from the float32 row, as the op does
            key_cache[blk, :, off] = kt.astype(np.float32).astype(key_cache.dtype)
            value_cache[blk, :, off] = vt.astype(np.float32).astype(value_cache.dtype)
            if quantize_new:
                k_shadow[blk, :, off], v_shadow[blk, :, off] = key_cache[blk, :, off], value_cache[blk, :, off]
            else:
                k_shadow[blk, :, off], v_shadow[blk, :, off] = kt.astype(np.float32), vt.astype(np.float32)
            continue
        kc, ks = quantize(kt.astype(np.float32), kv_dtype)
        vc, vs = quantize(vt.astype(np.float32), kv_dtype)
        key_cache[blk, :, off], key_scales[blk, :, off] = kc, ks
        value_cache[blk, :, off], value_scales[blk, :, off] = vc, vs
        if quantize_new:
            k_shadow[blk, :, off] = dequantize(kc, ks, kv_dtype)
            v_shadow[blk, :, off] = dequantize(vc, vs, kv_dtype)
        else:
            k_shadow[blk, :, off] = kt.astype(np.float32)
            v_shadow[blk, :, off] = vt.astype(np.float32)

    out = np.zeros((T, H, D))
    info = []
    for t in range(T):
        s = seq_of[t]
        p = context_lens[s] + t - cu_seqlens[s]
        first = max(0, p - window + 1) if window > 0 else 0
        slots = [(block_tables[s][j // BS], j % BS) for j in range(first, p + 1)]
        blk = np.array([b for b, _ in slots])
        off = np.array([o for _, o in slots])
        K = k_shadow[blk, :, off].transpose(1, 0, 2)  # [Hkv, L, D]
        V = v_shadow[blk, :, off].transpose(1, 0, 2)
        probs = np.zeros((H, len(slots)))
        for h in range(H):
            sc = scale * (K[h // G] @ q_rot[t, h])
            m = sc.max() if sinks is None else max(sc.max(), float(sinks[h]))
            e = np.exp(sc - m)
            probs[h] = e / (e.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m)))
            out[t, h] = probs[h] @ V[h // G]
        if rotate and kv_dtype == "int4":
            out[t] = fwht(out[t])
        if details:   # V as cached (int4 with rotate: rotated)
            info.append({"q": q_rot[t], "K": K, "V": V, "probs": probs,
                         "new": is_new[blk, 0, off], "blocks": blk, "offsets": off})
    result = (out.reshape(T, H * D).astype(np.float32), key_cache, value_cache, key_scales, value_scales)
    return result + (info,) if details else result
