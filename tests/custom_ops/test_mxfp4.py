"""QLinear's and MoE's mxfp4 weight format (attribute weight_format "mxfp4": the 4-bit code indexes the 2 x e2m1 table,
w = table[code] * d; custom_ops/src/kernels/qlinear.h) in real onnxruntime sessions: parity with the NumPy reference
(tests/reference/qlinear.py and moe.py on the packed weight as pipeline/qlinear_pack.py dequantizes it), the same
bits on the default path and the scalar one in one process, each row alone as in a batch, the MXFP4 weight kept
exact (the packed weight is the source's dequantization), its bytes, and bad attributes named.

On this host the default path is avx2 (conftest path_at_most names what ran): avx512vnni and amx take AVX2's
mxfp4 kernel from the table they copy, so the comparison of every row runs the kernels this CPU has."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ortllm.pipeline.qlinear_pack import dequantize_packed, pack
from ortllm.pipeline.quant_grid import MXFP4, MXFP4_TABLE, on_grid, on_mxfp4
from ortllm.runtime.ops_library import ops_isa
from tests.custom_ops.conftest import assert_close, path_at_most, sessions_on
from tests.custom_ops.test_moe import feeds_for as moe_feeds, routing, sess_for as moe_sess
from tests.custom_ops.test_qlinear import check, feeds_for, sess_for
from tests.reference.moe import moe_ref, moe_tolerance
from tests.reference.qlinear import magnitude, qlinear_ref

H, INTER, E = 128, 96, 8
CLAMPED = dict(activation="clamped_swiglu", alpha=1.702, limit=7.0)


def mxfp4_source(rng, n: int, k: int, exps=(-9, -4)) -> tuple[np.ndarray, np.ndarray]:
    """A random MXFP4 weight as a checkpoint holds it, dequantized: (w [N, K] fp32 exact, scale [N, K / 32] =
    2^(e - 128)), every code drawn."""
    codes = rng.integers(0, 16, (n, k))
    scale = np.ldexp(np.float32(1), rng.integers(*exps, (n, k // 32))).astype(np.float32)
    w = (MXFP4_TABLE[codes].astype(np.float32).reshape(n, k // 32, 32) * scale[..., None]).reshape(n, k)
    return w, scale


@functools.lru_cache(maxsize=None)
def weight(n: int, k: int, seed: int = 0):
    """(packed mxfp4 weight, its source w [N, K])."""
    w, scale = mxfp4_source(np.random.default_rng(seed), n, k)
    q = on_mxfp4(w, scale)
    return pack(q), w


def qrun(w, x, epilogue="none", threads=2):
    feeds = feeds_for(w, x)
    s = sess_for(tuple(sorted(feeds)), threads, K=w.k, N=w.n, bits=4, block_size=32, epilogue=epilogue, packed_a=1,
                 norm_eps=1e-5, lora_layer=-1, act_bits=8, weight_format="mxfp4")
    return s.run(None, feeds)[0]


def test_the_packed_weight_is_the_source_exactly_at_4_5_bits():
    """Every value is the source's (codes recovered from the exact dequantization, none rounded), at 4.5 bits a
    weight where the same weight on MXFP4's grid as int8 (today's exact form, 25 levels) takes 9; a value off the
    table (5 x scale) or a scale fp16 cannot hold refuses the format."""
    p, w = weight(64, 256)
    assert p.format == MXFP4 and p.offsets is None
    np.testing.assert_array_equal(dequantize_packed(p), w)
    _, scale = mxfp4_source(np.random.default_rng(0), 64, 256)
    as_int8 = pack(on_grid(w, scale, np.float32(-12) * scale, 8))
    np.testing.assert_array_equal(dequantize_packed(as_int8), w)
    assert (p.bits_per_weight, as_int8.bits_per_weight) == (4.5, 9.0)         # int8: d and m per block
    off = w.copy()
    off[3, 5] = 5 * scale[3, 0]
    assert on_mxfp4(off, scale) is None
    assert on_mxfp4(w * np.float32(2.0 ** -20), scale * np.float32(2.0 ** -20)) is None   # 2^-29: below fp16


@pytest.mark.parametrize("ops_path", ["default", "scalar"], indirect=True)
@pytest.mark.parametrize("T", [1, 3, 16, 40])
def test_qlinear_parity(T, ops_path):
    rng = np.random.default_rng(T)
    w, _ = weight(96, 256)
    x = rng.standard_normal((T, 256), dtype=np.float32)
    check(qrun(w, x), qlinear_ref(x, w), magnitude(x, w), f"mxfp4 T={T} {ops_path}")
    gu, _ = weight(192, 256, seed=1)
    y = qrun(gu, x, epilogue="swiglu")
    ref = qlinear_ref(x, gu, epilogue="swiglu")
    assert_close(y, ref, atol=3e-6 * magnitude(x, gu)[:, :96] * (1 + np.abs(ref)) + 1e-6, rtol=1e-5,
                 what=f"mxfp4 swiglu T={T}")


def test_qlinear_paths_and_batch_rows_give_the_same_bits():
    """The default path and the scalar one give the same bits (epilogue none: no exp), and each row alone is its row
    of a batch of 40 (tokens in tiles of 4, two threads: the rows split, one thread: the tokens chunked)."""
    rng = np.random.default_rng(3)
    w, _ = weight(96, 256)
    x = rng.standard_normal((40, 256), dtype=np.float32)
    batch = qrun(w, x)
    with sessions_on(path_at_most("scalar")):
        np.testing.assert_array_equal(qrun(w, x), batch, err_msg=f"scalar vs {ops_isa()}")
    np.testing.assert_array_equal(qrun(w, x, threads=1), batch)
    for t in (0, 5, 39):
        np.testing.assert_array_equal(qrun(w, x[t:t + 1])[0], batch[t], err_msg=f"row {t}")


@functools.lru_cache(maxsize=None)
def experts(seed: int = 0):
    """E experts' mxfp4 gate|up [2I, H] and down [H, I] (scales so SwiGLU's product is O(1) and the clamp fires)."""
    rng = np.random.default_rng(seed)
    gu = [pack(on_mxfp4(*mxfp4_source(rng, 2 * INTER, H, (-6, -3)))) for _ in range(E)]
    dn = [pack(on_mxfp4(*mxfp4_source(rng, H, INTER, (-8, -5)))) for _ in range(E)]
    return gu, dn


def mrun(gu, dn, x, expert, weight, threads=2, biases=None, **attrs):
    feeds = moe_feeds(gu, dn, x, expert, weight, biases)
    s = moe_sess(tuple(sorted(feeds)), threads, H=H, I=INTER, E=E, bits=4, block_size=32, weight_format="mxfp4",
                 **attrs)
    return s.run(None, feeds)[0]


def moe_case(rng, T, k=2):
    gu, dn = experts()
    x = rng.standard_normal((T, H), dtype=np.float32) * np.float32(3)     # gate|up past the clamp at times
    expert, weight = routing(rng, T, k)
    biases = {"gate_up_bias": rng.standard_normal((E, 2 * INTER), dtype=np.float32),
              "down_bias": rng.standard_normal((E, H), dtype=np.float32) * np.float32(0.1)}
    return gu, dn, x, expert, weight, biases


@pytest.mark.parametrize("ops_path", ["default", "scalar"], indirect=True)
@pytest.mark.parametrize("T", [1, 16, 40])
def test_moe_parity(T, ops_path):
    """gpt-oss's expert FFN on mxfp4 experts (clamped SwiGLU with both biases; and plain SwiGLU, the gate|up
    epilogue fused) against the reference."""
    rng = np.random.default_rng(30 + T)
    gu, dn, x, expert, weight, biases = moe_case(rng, T)
    pre = np.stack([dequantize_packed(gu[int(expert[t, 0])]) @ x[t] for t in range(T)])
    assert (np.abs(pre) > 7).mean() > 0.02, "the case should cross the clamp"
    y = mrun(gu, dn, x, expert, weight, biases=biases, **CLAMPED)
    kw = dict(gate_up_bias=biases["gate_up_bias"], down_bias=biases["down_bias"], **CLAMPED)
    assert_close(y, moe_ref(x, expert, weight, gu, dn, **kw), atol=moe_tolerance(x, expert, weight, gu, dn, **kw),
                 rtol=0, what=f"mxfp4 clamped T={T} {ops_path}")
    plain = mrun(gu, dn, x, expert, weight)
    assert_close(plain, moe_ref(x, expert, weight, gu, dn), atol=moe_tolerance(x, expert, weight, gu, dn), rtol=0,
                 what=f"mxfp4 swiglu T={T} {ops_path}")


def test_moe_paths_and_batch_rows_give_the_same_bits():
    """A routed batch of 300 (a wide expert beside narrow ones): the scalar path gives the default path's bits (the
    clamped activation is moe.cc's own float32 code, the dots exact integers), and each row alone its batch row."""
    rng = np.random.default_rng(9)
    gu, dn, x, expert, weight, biases = moe_case(rng, 300)
    expert[:, 1] = np.where(expert[:, 0] == 2, 4, 2)
    batch = mrun(gu, dn, x, expert, weight, biases=biases, **CLAMPED)
    with sessions_on(path_at_most("scalar")):
        np.testing.assert_array_equal(mrun(gu, dn, x, expert, weight, biases=biases, **CLAMPED), batch,
                                      err_msg=f"scalar vs {ops_isa()}")
    for forced in ("avx512vnni", "amx"):         # on this CPU: the best row at or below it (named in the message)
        with sessions_on(path_at_most(forced)):
            other = mrun(gu, dn, x, expert, weight, biases=biases, **CLAMPED)
        np.testing.assert_array_equal(other, batch, err_msg=f"{forced} -> {path_at_most(forced)}")
    for t in (0, 17, 256, 299):
        alone = mrun(gu, dn, x[t:t + 1], expert[t:t + 1], weight[t:t + 1], biases=biases, **CLAMPED)
        np.testing.assert_array_equal(alone[0], batch[t], err_msg=f"row {t}")


def test_bad_weight_format_named():
    rng = np.random.default_rng(4)
    gu, dn, x, expert, route, _ = moe_case(rng, 3)
    feeds = moe_feeds(gu, dn, x, expert, route)
    with pytest.raises(Exception, match='MoE: attribute weight_format must be "affine" or "mxfp4"; got "nf4"'):
        moe_sess(tuple(sorted(feeds)), 2, H=H, I=INTER, E=E, bits=4, block_size=32,
                 weight_format="nf4").run(None, feeds)
    with pytest.raises(Exception, match='MoE: attribute weight_format "mxfp4" needs bits = 4'):
        moe_sess(tuple(sorted(feeds)), 2, H=H, I=INTER, E=E, bits=8, block_size=32,
                 weight_format="mxfp4").run(None, feeds)
    feeds["down_offsets"] = feeds["down_scales"]
    with pytest.raises(Exception, match="MoE: input 'down_offsets' is not read with weight_format \"mxfp4\""):
        moe_sess(tuple(sorted(feeds)), 2, H=H, I=INTER, E=E, bits=4, block_size=32,
                 weight_format="mxfp4").run(None, feeds)
    w, _ = weight(96, 256)
    xq = rng.standard_normal((2, 256), dtype=np.float32)
    feeds = feeds_for(w, xq)
    with pytest.raises(Exception, match='QLinear: attribute weight_format "mxfp4" needs bits = 4'):
        sess_for(tuple(sorted(feeds)), 2, K=256, N=96, bits=8, block_size=32,
                 weight_format="mxfp4").run(None, feeds)
    feeds["offsets"] = w.scales
    with pytest.raises(Exception, match="QLinear: input 'offsets' is not read with weight_format \"mxfp4\""):
        sess_for(tuple(sorted(feeds)), 2, K=256, N=96, bits=4, block_size=32,
                 weight_format="mxfp4").run(None, feeds)
