"""QLinear parity against tests/reference/qlinear.py in real onnxruntime sessions, batch invariance
(bitwise), the scalar path against the AVX2 path (bitwise), and bad inputs."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest

from ortllm.pipeline.qlinear_pack import dequantize_packed, pack, unpack_codes
from ortllm.pipeline.quant_grid import unpack_bits
from ortllm.pipeline.quantize import RTNQuantizer
from ortllm.bench.op_graphs import qlinear_model, session
from tests.custom_ops.conftest import assert_close, path_at_most, sessions_on
from ortllm.runtime.lora_stacks import quantize_a, quantize_b
from ortllm.runtime.ops_library import ops_isa, ops_isas, sessions_isa
from tests.reference.qlinear import (dequantized_activations, lora_a, lora_b, lora_terms, magnitude, qlinear_ref,
                                     rms_norm)

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

# (bits, symmetric): int4 with offsets (Q4_1 grid), symmetric int4 (Q4_0), int8 (Q8_0)
FORMS = {"int4": (4, False), "int4-sym": (4, True), "int8": (8, True)}
SMOLLM2 = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)]
TINYLLAMA = [(2048, 2560), (2048, 11264), (5632, 2048)]


@functools.lru_cache(maxsize=None)
def weight(k: int, n: int, form: str, bs: int = 32, seed: int = 0):
    bits, sym = FORMS[form]
    w = np.random.default_rng(seed).standard_normal((n, k), dtype=np.float32) * 0.05
    return pack(RTNQuantizer(bits, bs, sym).quantize(w))


def sess_for(present: tuple, threads: int = 2, **attrs):
    """QLinear's session for these inputs and attributes on the current kernel path (conftest ops_path)."""
    return _sess_for(present, threads, sessions_isa(), **attrs)


@functools.lru_cache(maxsize=None)
def _sess_for(present: tuple, threads: int, path: str | None, **attrs):
    return session(qlinear_model(list(present), **attrs), threads=threads)


def feeds_for(w, x, **extra):
    f = {"x": x, "codes": w.codes, "scales": w.scales}
    if w.offsets is not None:
        f["offsets"] = w.offsets
    return f | {k: v for k, v in extra.items() if v is not None}


def run(w, x, epilogue="none", threads=2, packed_a=True, norm_eps=1e-5, lora_layer=-1, act_bits=8, **extra):
    feeds = feeds_for(w, x, **extra)
    s = sess_for(tuple(sorted(feeds)), threads, K=w.k, N=w.n, bits=w.bits, block_size=w.block_size,
                 epilogue=epilogue, packed_a=int(packed_a), norm_eps=norm_eps, lora_layer=lora_layer,
                 act_bits=act_bits)
    return s.run(None, feeds)[0]


def lora_case(rng, T, K, widths, n_slots=8, ranks=(16,), n_adapters=4, frac_none=0.25, packed_a=True, floats=None):
    """token_adapter, lora_scale and one (A, A_scale, B, B_scale, rank) per segment: float adapters (A [K, r]
    ~ 1 / sqrt(K), B [r, width] ~ 0.05; appended to `floats` as [(A_s, B_s) per slot] per segment) written into
    int8 stacks by the runtime's writer (lora_stacks), packed per slot (packed_a) or at [K, r_max]; the rest of
    each slot is junk codes and NaN scales (never read); ranks cycle over the slots (0 = leaves it alone)."""
    r_max = -(-max(max(ranks), 1) // 4) * 4      # B's rank quads
    scale = rng.uniform(0.5, 2.0, n_slots).astype(np.float32)
    ta = np.full(T, -1, np.int32)
    if n_adapters:
        ta = rng.choice(rng.choice(n_slots, n_adapters, replace=False), size=T).astype(np.int32)
        ta[rng.random(T) < frac_none] = -1
    segs, extra = [], {}
    kc = -(-K // 32)
    for j, width in enumerate(widths):
        rank = np.array([ranks[(s + j) % len(ranks)] for s in range(n_slots)], np.int32)
        A = rng.integers(-128, 128, (n_slots, K, r_max)).astype(np.int8)
        sA = np.full((n_slots, kc, r_max), np.nan, np.float16)
        B = rng.integers(-128, 128, (n_slots, r_max, width)).astype(np.int8)
        sB = np.full((n_slots, width), np.nan, np.float16)
        fl = []
        for s in range(n_slots):
            r = int(rank[s])
            a = (rng.standard_normal((K, r)) / np.sqrt(K)).astype(np.float32)
            b = (rng.standard_normal((r, width)) * 0.05).astype(np.float32)
            fl.append((a, b))
            qa, qsa = quantize_a(a)
            qb, qsb = quantize_b(b)
            if packed_a:
                A[s].reshape(-1)[:qa.size] = qa
                sA[s].reshape(-1)[:qsa.size] = qsa.reshape(-1)
            else:   # [K, r_max]: quads of r_max ranks, the first r of them this adapter's
                A[s].reshape(K // 4, r_max, 4)[:, :r] = qa.reshape(K // 4, r, 4)
                sA[s, :, :r] = qsa
            B[s].reshape(-1)[:qb.size] = qb
            sB[s] = qsb if r else sB[s]
        segs.append((A, sA, B, sB, rank))
        if floats is not None:
            floats.append(fl)
        extra |= {f"A{j}": A, f"A_scale{j}": sA, f"B{j}": B, f"B_scale{j}": sB, f"rank{j}": rank}
    return dict(token_adapter=ta, lora_scale=scale, **extra), segs


def lora_magnitude(x, w, feeds, segs, packed_a=True):
    """Per output, the size of the LoRA terms (for tolerances): the float32 rounding of the terms
    (scale * |x_hat| @ |A| @ |B| at the stacks' values) x 3e-6, plus one int8 code of h off per rank."""
    out = []
    for A, sA, B, sB, rank in segs:
        m = np.zeros((len(x), B.shape[2]))
        for t, a in enumerate(feeds["token_adapter"]):
            r = int(rank[a]) if a >= 0 else 0
            if r:
                qa, sa = lora_a(A[a], sA[a], A.shape[1], r, r if packed_a else A.shape[2])
                a_mat = qa * np.repeat(sa, 32, axis=0)[:A.shape[1]]
                b_mat = lora_b(B[a], r, B.shape[2]) * sB[a].astype(np.float64)
                xh = np.abs(dequantized_activations(x[t:t + 1], w.block_size)[0, :A.shape[1]])
                m[t] = feeds["lora_scale"][a] * (xh @ np.abs(a_mat)) @ np.abs(b_mat)
        out.append(m)
    step = lora_terms(x, w.block_size, feeds["token_adapter"], feeds["lora_scale"], segs, packed_a, w.n)[1]
    return np.concatenate(out, axis=1) + step / 3e-6


def check(y, ref, mag, what):
    # float32 sums over kb blocks (and the rank): a few ulps of the terms' magnitude
    assert_close(y, ref, atol=3e-6 * mag + 1e-7, rtol=1e-6, what=what)


# ---------------------------------------------------------------- packing

@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("bs", [32, 64, 128])
def test_pack_round_trip(form, bs):
    """The packed layout holds exactly the quantizer's codes, scales and offsets (N not a multiple of 8,
    K not a multiple of the block)."""
    bits, sym = FORMS[form]
    w = np.random.default_rng(3).standard_normal((21, 200), dtype=np.float32)
    q = RTNQuantizer(bits, bs, sym).quantize(w)
    p = pack(q)
    codes = unpack_bits(q.data, bits).reshape(21, -1).astype(np.int32) - (128 if bits == 8 else 0)
    np.testing.assert_array_equal(unpack_codes(p), codes)
    from ortllm.pipeline.quantize import dequantize
    np.testing.assert_allclose(dequantize_packed(p)[:, :200], dequantize(q), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- parity

@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("k,n", SMOLLM2 + TINYLLAMA)
def test_parity_model_shapes(form, k, n):
    big = k * n > 4_000_000
    for T in ((1, 7) if big else (1, 2, 7, 16, 64)):
        x = np.random.default_rng(T).standard_normal((T, k), dtype=np.float32)
        w = weight(k, n, form)
        check(run(w, x), qlinear_ref(x, w), magnitude(x, w), f"{form} {k}->{n} T={T}")


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("bs", [32, 64, 128])
@pytest.mark.parametrize("T", [1, 16, 512])
def test_parity_block_sizes(form, bs, T):
    """576 is not a multiple of 128: the last block is zero-padded."""
    x = np.random.default_rng(bs + T).standard_normal((T, 576), dtype=np.float32)
    w = weight(576, 960, form, bs)
    check(run(w, x), qlinear_ref(x, w), magnitude(x, w), f"{form} bs={bs} T={T}")


def test_within_the_activation_step_of_fp32():
    """Against fp32 activations, the error is bounded by the int8 step: per block |dx / 2| * sum |w|."""
    x = np.random.default_rng(5).standard_normal((16, 576), dtype=np.float32)
    w = weight(576, 960, "int4")
    wd = dequantize_packed(w).astype(np.float64)
    exact = x.astype(np.float64) @ wd[:, :576].T
    dx = np.abs(x.reshape(16, -1, 32)).max(-1) / 127                        # [T, kb]
    bound = (dx / 2) @ np.abs(wd.reshape(960, -1, 32)).sum(-1).T            # [T, N]
    err = np.abs(run(w, x) - exact)
    assert (err <= bound * 1.0001 + 1e-5).all(), float((err / bound).max())
    assert np.abs(dequantized_activations(x, 32)[:, :576] - x).max() <= dx.max() / 2 * 1.0001


@pytest.mark.parametrize("ranks", [(8,), (16,), (64,), (0, 8, 16, 64), (1, 5, 13), (0,)])
@pytest.mark.parametrize("n_adapters", [0, 1, 4, 8])
@pytest.mark.parametrize("T", [1, 16, 64])
def test_lora_parity_qkv(ranks, n_adapters, T):
    """q|k|v fused (576 + 192 + 192): three LoRA segments, tokens without an adapter mixed in."""
    rng = np.random.default_rng(T * 10 + n_adapters + sum(ranks))
    x = rng.standard_normal((T, 576), dtype=np.float32)
    w = weight(576, 960, "int4")
    lora, segs = lora_case(rng, T, 576, [576, 192, 192], ranks=ranks, n_adapters=n_adapters)
    y = run(w, x, **lora)
    ref = qlinear_ref(x, w, token_adapter=lora["token_adapter"], lora_scale=lora["lora_scale"], segments=segs,
                      packed_a=True)
    check(y, ref, magnitude(x, w) + lora_magnitude(x, w, lora, segs), f"lora ranks={ranks} n={n_adapters} T={T}")


@pytest.mark.parametrize("layer", [0, 2])
def test_stacked_lora_reads_its_layer(layer):
    """Contract 7's stacks: A_j, A_scale_j, B_j, B_scale_j as [n_layers, n_slots, ...] with attribute lora_layer give
    bitwise what that layer's [n_slots, ...] slice gives unstacked; other layers' junk is never read; a layer past
    the stack is refused by name."""
    rng = np.random.default_rng(7 + layer)
    T, x, w = 16, rng.standard_normal((16, 576), dtype=np.float32), weight(576, 960, "int4")
    lora, _ = lora_case(rng, T, 576, [576, 192, 192], ranks=(8, 16), n_adapters=3)
    stacked = dict(lora)
    for name, arr in lora.items():
        if name[:-1] in ("A", "A_scale", "B", "B_scale"):
            junk = rng.integers(-128, 128, (3, *arr.shape)).astype(arr.dtype) if arr.dtype == np.int8 else \
                np.full((3, *arr.shape), np.nan, arr.dtype)
            junk[layer] = arr
            stacked[name] = junk
    np.testing.assert_array_equal(run(w, x, lora_layer=layer, **stacked), run(w, x, **lora))
    with pytest.raises(Exception, match="attribute lora_layer = 3 is outside input 'A0''s 3 layers"):
        run(w, x, lora_layer=3, **stacked)
    with pytest.raises(Exception, match=r"input 'A0' must be \[n_slots, K, r_max\]"):
        run(w, x, **stacked)


@pytest.mark.parametrize("k, widths", [(576, [576, 192, 192]), (576, [1536, 1536]), (1536, [576])])
def test_int8_lora_against_the_float_lora(k, widths):
    """The PEFT math (fp32 x @ A @ B in float64, the adapter's float32 weights) against what the op adds on its
    int8 stacks: the LoRA term is within 1.5% rms of it (measured 1.0%: the activation codes, A, h and B in int8
    each ~0.5%; 0.9% with int16 h; fp16 stacks on fp32 x were 0.03%), where a LoRA term is itself a small part of
    the output."""
    rng = np.random.default_rng(k + len(widths))
    T, n = 64, sum(widths)
    x = rng.standard_normal((T, k), dtype=np.float32)
    w = weight(k, n, "int4")
    floats = []
    lora, _ = lora_case(rng, T, k, widths, ranks=(16,), n_adapters=4, frac_none=0.0, floats=floats)
    got = run(w, x, **lora).astype(np.float64) - run(w, x).astype(np.float64)
    exact = np.concatenate([np.stack([lora["lora_scale"][a] * (x[t].astype(np.float64) @ fl[a][0]) @ fl[a][1]
                                      for t, a in enumerate(lora["token_adapter"])]) for fl in floats], axis=1)
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 0.015


def test_lora_segments_not_aligned_to_8_and_unpacked_a():
    """A segment boundary inside an 8-row group (100 + 28) and A slots as [K, r_max] (packed_a = 0)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((9, 64), dtype=np.float32)
    w = weight(64, 128, "int8")
    lora, segs = lora_case(rng, 9, 64, [100, 28], ranks=(4, 8), n_adapters=3, packed_a=False)
    y = run(w, x, packed_a=False, **lora)
    ref = qlinear_ref(x, w, token_adapter=lora["token_adapter"], lora_scale=lora["lora_scale"], segments=segs)
    check(y, ref, magnitude(x, w) + lora_magnitude(x, w, lora, segs, packed_a=False), "unaligned segments")


@pytest.mark.parametrize("form", ["int4", "int8"])
@pytest.mark.parametrize("T", [1, 16, 64])
def test_residual_epilogue(form, T):
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, 1536), dtype=np.float32)
    res = rng.standard_normal((T, 576), dtype=np.float32)
    w = weight(1536, 576, form)
    lora, segs = lora_case(rng, T, 1536, [576], ranks=(16,), n_adapters=4)
    y = run(w, x, epilogue="residual", residual=res, **lora)
    ref = qlinear_ref(x, w, epilogue="residual", residual=res, token_adapter=lora["token_adapter"],
                      lora_scale=lora["lora_scale"], segments=segs, packed_a=True)
    check(y, ref, magnitude(x, w) + lora_magnitude(x, w, lora, segs) + np.abs(res), f"residual {form} T={T}")


@pytest.mark.parametrize("epilogue", ["swiglu", "geglu"])
@pytest.mark.parametrize("form", ["int4", "int4-sym", "int8"])
@pytest.mark.parametrize("T", [1, 16, 64])
def test_gated_epilogue(epilogue, form, T):
    """gate|up fused (576 -> 2 x 1536): y = SiLU(gate) * up ("swiglu") or GELU-tanh(gate) * up ("geglu", against
    torch's tanh formula in float64), LoRA on both halves before the activation."""
    rng = np.random.default_rng(T + 1)
    x = rng.standard_normal((T, 576), dtype=np.float32)
    w = weight(576, 3072, form)
    lora, segs = lora_case(rng, T, 576, [1536, 1536], ranks=(8, 16), n_adapters=4)
    y = run(w, x, epilogue=epilogue, **lora)
    ref = qlinear_ref(x, w, epilogue=epilogue, token_adapter=lora["token_adapter"], lora_scale=lora["lora_scale"],
                      segments=segs, packed_a=True)
    pre = qlinear_ref(x, w, token_adapter=lora["token_adapter"], lora_scale=lora["lora_scale"], segments=segs,
                      packed_a=True).astype(np.float64)
    mag = magnitude(x, w) + lora_magnitude(x, w, lora, segs)
    g, u = pre[:, :1536], pre[:, 1536:]
    # d(act(g) * u) = act'(g) u dg + act(g) du, |silu'| <= 1.1, |gelu_tanh'| <= 1.13, |act(g)| <= |g|; plus the
    # exp's few ulps
    tol = 3e-6 * (1.13 * np.abs(u) * mag[:, :1536] + np.abs(g) * mag[:, 1536:]) + 1e-6 * np.abs(ref) + 1e-7
    assert_close(y, ref, atol=tol, rtol=0, what=f"{epilogue} {form} T={T}")


@pytest.mark.parametrize("T", [1, 16, 64])
def test_fused_rms_norm(T):
    """norm_weight: the op projects RMSNorm(x) * w (the layer's input norm fused), LoRA included."""
    rng = np.random.default_rng(T + 7)
    x = rng.standard_normal((T, 576), dtype=np.float32) * 3
    nw = rng.uniform(0.5, 1.5, 576).astype(np.float32)
    w = weight(576, 960, "int4")
    lora, segs = lora_case(rng, T, 576, [576, 192, 192], ranks=(16,), n_adapters=2)
    y = run(w, x, norm_weight=nw, norm_eps=1e-6, **lora)
    ref = qlinear_ref(x, w, token_adapter=lora["token_adapter"], lora_scale=lora["lora_scale"], segments=segs,
                      packed_a=True, norm_weight=nw, norm_eps=1e-6)
    xn = rms_norm(x, nw, 1e-6)
    # the normed row may differ from the reference's by an ulp, which can move one activation code
    mag = magnitude(xn, w) + lora_magnitude(xn, w, lora, segs)
    step = (np.abs(xn).reshape(T, -1, 32).max(-1) / 127) @ np.abs(dequantize_packed(w).reshape(960, -1, 32)).max(-1).T
    assert_close(y, ref, atol=3e-6 * mag + step + 1e-6, rtol=1e-6, what=f"norm T={T}")


@pytest.mark.parametrize("T", [1, 7, 64])
def test_split_outputs_are_the_columns_of_y(T):
    """split = [576, 192, 192]: q, k and v come out as three outputs, bitwise the columns of the one output."""
    rng = np.random.default_rng(T + 3)
    x = rng.standard_normal((T, 576), dtype=np.float32)
    w = weight(576, 960, "int4")
    lora, _ = lora_case(rng, T, 576, [576, 192, 192], ranks=(8, 16), n_adapters=3)
    feeds = feeds_for(w, x, norm_weight=rng.uniform(0.5, 1.5, 576).astype(np.float32), **lora)
    attrs = dict(K=576, N=960, bits=4, block_size=32, packed_a=1)
    (full,) = session(qlinear_model(sorted(feeds), **attrs), threads=2).run(None, feeds)
    q, k, v = session(qlinear_model(sorted(feeds), n_outputs=3, split=[576, 192, 192], **attrs),
                      threads=2).run(None, feeds)
    np.testing.assert_array_equal(np.concatenate([q, k, v], axis=1), full)
    assert "attribute split must be 1 to 3 positive widths summing to N = 960" in _bad_split([576, 192, 100])
    assert 'attribute split needs epilogue "none"' in _bad_split([480, 480], epilogue="swiglu")


def _argmax_case(T: int, k: int, n: int):
    """(y without the argmax output, y with it, the argmax): T tokens, even ones aligned with two equal rows
    far apart (a tie the first must win), odd ones random."""
    rng = np.random.default_rng(T * n)
    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
    w[n - 2] = w[n // 3]
    pw = pack(RTNQuantizer(4, 32, False).quantize(w))
    x = rng.standard_normal((T, k), dtype=np.float32)
    x[::2] += w[n // 3] * 40
    feeds = feeds_for(pw, x, norm_weight=rng.uniform(0.5, 1.5, k).astype(np.float32))
    attrs = dict(K=k, N=n, bits=4, block_size=32, packed_a=1)
    (plain,) = session(qlinear_model(sorted(feeds), **attrs), threads=2).run(None, feeds)
    return (plain, *session(qlinear_model(sorted(feeds), argmax=True, **attrs), threads=2).run(None, feeds))


ARGMAX_CASES = [(T, k, n) for T in (1, 3, 16, 70) for k, n in ((576, 49152), (576, 20))]


@pytest.mark.parametrize("T,k,n", ARGMAX_CASES)
def test_argmax_output_is_numpys_argmax_of_y(T, k, n):
    """Output 3 is np.argmax(y, axis=1), ties to the first column, across work items too (the LM head's 192
    items at decode; one item for a small call), and y is bitwise the same with it as without."""
    plain, y, am = _argmax_case(T, k, n)
    np.testing.assert_array_equal(y, plain)
    assert am.dtype == np.int64 and am.shape == (T,)
    np.testing.assert_array_equal(am, np.argmax(y, axis=1))
    assert (am[::2] == n // 3).all()                # the tie went to the first of the two rows


@pytest.mark.parametrize("forced", ["scalar", "avx2"])
def test_argmax_output_on_every_isa(forced):
    """The scalar and AVX2 argmax loops (kernels/vec.h) find the same first maximum as numpy, each session on its
    own path in this process."""
    with sessions_on(path_at_most(forced)):
        for case in ARGMAX_CASES:
            _, y, am = _argmax_case(*case)
            assert (am == np.argmax(y, axis=1)).all(), (forced, case)


def test_argmax_output_needs_one_plain_output():
    w = weight(576, 960, "int4")
    x = np.ones((2, 576), np.float32)
    feeds = feeds_for(w, x, residual=np.zeros((2, 960), np.float32))
    with pytest.raises(Exception, match='output \'argmax\' needs epilogue "none" and one output y'):
        session(qlinear_model(sorted(feeds), argmax=True, K=576, N=960, bits=4, block_size=32,
                              epilogue="residual")).run(None, feeds)


def _bad_split(split, **attrs):
    w = weight(576, 960, "int4")
    feeds = feeds_for(w, np.ones((2, 576), np.float32))
    a = dict(K=576, N=960, bits=4, block_size=32) | attrs
    with pytest.raises(Exception) as e:
        session(qlinear_model(sorted(feeds), n_outputs=len(split), split=split, **a)).run(None, feeds)
    return str(e.value)


# ---------------------------------------------------------------- batch invariance (bitwise)

def _invariance_case(epilogue, form):
    rng = np.random.default_rng(11)
    gated = epilogue in ("swiglu", "geglu")
    k, n = (576, 3072) if gated else (576, 960)
    x = rng.standard_normal((64, k), dtype=np.float32)
    widths = [1536, 1536] if gated else [576, 192, 192]
    lora, _ = lora_case(rng, 64, k, widths, ranks=(8, 16, 64), n_adapters=4)
    extra = dict(lora)
    if epilogue == "none":
        extra["norm_weight"] = rng.uniform(0.5, 1.5, k).astype(np.float32)
    if epilogue == "residual":
        extra["residual"] = rng.standard_normal((64, n), dtype=np.float32)
    return weight(k, n, form), x, extra


def _rows(extra, sl):
    return {k: (v[sl] if k in ("token_adapter", "residual") else v) for k, v in extra.items()}


@pytest.mark.parametrize("epilogue", ["none", "residual", "swiglu", "geglu"])
@pytest.mark.parametrize("form", ["int4", "int4-sym", "int8"])
def test_batch_invariance(epilogue, form):
    """64 rows with LoRA rows mixed in: one by one, in batches of 2..64 and in uneven chunked slices, on
    1 and 2 threads, give bitwise the same outputs."""
    w, x, extra = _invariance_case(epilogue, form)
    full = run(w, x, epilogue, **extra)
    singles = np.concatenate([run(w, x[t:t + 1], epilogue, threads=1, **_rows(extra, slice(t, t + 1)))
                              for t in range(64)])
    np.testing.assert_array_equal(full, singles)
    for b in (2, 3, 5, 8, 16, 33, 64):
        got = np.concatenate([run(w, x[i:i + b], epilogue, **_rows(extra, slice(i, i + b)))
                              for i in range(0, 64, b)])
        np.testing.assert_array_equal(got, full, err_msg=f"batch {b}")
    cuts = [0, 1, 4, 11, 12, 29, 47, 64]
    got = np.concatenate([run(w, x[a:b], epilogue, threads=1 + (i % 2), **_rows(extra, slice(a, b)))
                          for i, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    np.testing.assert_array_equal(got, full, err_msg="chunked slices")


ISA_CASES = [f"{form}-{epi}-b{bs}" for form in ("int4", "int8") for epi in ("none", "residual", "swiglu", "geglu")
             for bs in (32, 64, 128, 256)] + [f"int8-{epi}-b{bs}-a16" for epi in ("none", "residual", "swiglu")
                                         for bs in (32, 128)]


@functools.lru_cache(maxsize=None)
def _isa_case(key):
    form, epi, bs, *act = key.split("-")
    w, x, extra = _invariance_case(epi, form)
    if act:   # act_bits 16, its LoRA included
        extra = extra | {"act_bits": 16}
    return weight(w.k, w.n, form, bs=int(bs[1:]), seed=3), x, epi, extra


def _cpu_flags() -> set:
    return set(next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")),
                    "").split())


def _best_path() -> str:
    """The path this CPU should take: AMX with AMX-INT8 (and VNNI), else VNNI with AVX-512 VNNI (+VL, BW), else
    AVX2."""
    flags = _cpu_flags()
    if not {"avx2", "avx512f", "avx512vl", "avx512bw", "avx512_vnni"} <= flags:
        return "avx2"
    return "amx" if {"amx_tile", "amx_int8"} <= flags else "avx512vnni"


def _isa_bits() -> dict[str, str]:
    """Every ISA_CASES output (hex) on the sessions' current kernel path (conftest ops_path)."""
    return {key: run(*_isa_case(key)[:3], **_isa_case(key)[3]).tobytes().hex() for key in ISA_CASES}


@pytest.mark.parametrize("forced", ["scalar", "avx2", "avx512vnni", "amx"])
def test_every_isa_gives_the_same_bits(forced):
    """The scalar path (the portable fallback), avx2 (no VNNI), avx512vnni (no AMX) and amx give the same bits as the
    default path, in one process (each session on its own path; a path this CPU lacks: the best below it,
    conftest path_at_most): the integer dots are exact in any order, and the float operations are the same in the
    same order (std::fma where the vector path fuses). int4 and int8, blocks of 32, 64, 128 and 256 (several
    sub-blocks per block: the VNNI path's accumulator chains, the AMX path's tile multiplies a block), 64 tokens: the
    two-group kernels (neighbouring groups, and SwiGLU's gate with its up group; AMX's 16 tokens a call)."""
    default = _isa_bits()
    with sessions_on(path_at_most(forced)):
        other = _isa_bits()
    for key in ISA_CASES:
        if path_at_most(forced) == "scalar" and ("swiglu" in key or "geglu" in key):
            continue    # the scalar sigmoid uses std::exp, the vector paths their own exp (qlinear.h): AVX2 only
        assert default[key] == other[key], (forced, path_at_most(forced), key, ops_isa())


@pytest.mark.parametrize("form", ["int4", "int8"])
def test_decode_sized_calls_give_every_path_the_same_bits_at_large_blocks(form):
    """12 and 16 tokens (a batched decode step: AMX's 16-token tile call, VNNI's two-group kernel, no panel) at blocks
    of 128 and 256, each path in one process against the default: the staging of the largest block the op takes."""
    rng = np.random.default_rng(21)
    for bs in (128, 256):
        w = weight(1024, 192, form, bs=bs, seed=5)
        for T in (12, 16):
            x = rng.standard_normal((T, 1024), dtype=np.float32)
            default = run(w, x)
            for forced in ("scalar", "avx2", "avx512vnni", "amx"):
                with sessions_on(path_at_most(forced)):
                    np.testing.assert_array_equal(run(w, x), default, err_msg=f"{forced} bs {bs} T {T}")


def test_best_path_is_taken_where_the_cpu_has_it():
    """On a CPU with AMX-INT8 QLinear's two-group dots run on the tile unit, with AVX-512 VNNI (+VL, BW) its integer
    dots on VNNI; elsewhere the AVX2 path."""
    assert ops_isas()[0] == _best_path(), ops_isas()
    if os.environ.get("ORTLLM_OPS_ISA"):
        pytest.skip(f"ORTLLM_OPS_ISA={os.environ['ORTLLM_OPS_ISA']} forces the default path")
    with sessions_on(None):   # the library's own default, whatever path this test's sessions take
        assert ops_isa() == _best_path()


# ---------------------------------------------------------------- act_bits 16 (the int8 LM head)

@pytest.mark.parametrize("bs", [32, 64, 128])
@pytest.mark.parametrize("T", [1, 16, 64])
def test_act16_parity_and_its_gain_over_int8_activations(T, bs):
    """int8 weights on int16 activation codes (the final norm fused, as the LM head runs it) match the reference
    within the float sums' rounding, and are ~100x nearer the float product than int8 codes are."""
    rng = np.random.default_rng(T + bs)
    w = weight(576, 960, "int8", bs=bs)
    x = rng.standard_normal((T, 576), dtype=np.float32)
    x[:, 5] *= 30   # an outlier channel, as the final norm's output has: it sets each block's step
    nw = rng.uniform(0.5, 1.5, 576).astype(np.float32)
    y16 = run(w, x, act_bits=16, norm_weight=nw)
    ref16 = qlinear_ref(x, w, norm_weight=nw, act_bits=16)
    xn = rms_norm(x, nw, 1e-5)
    check(y16, ref16, magnitude(xn, w, act_bits=16), "act16")
    exact = xn.astype(np.float64) @ dequantize_packed(w).astype(np.float64)[:, :576].T
    y8 = run(w, x, norm_weight=nw)
    err16, err8 = np.abs(y16 - exact).max(), np.abs(y8 - exact).max()
    assert err16 * 50 < err8, (err16, err8)


def test_act16_batch_invariance():
    """The int16 path keeps the rows' bits whatever the batch, the tile or the thread split."""
    w, x, extra = _invariance_case("none", "int8")
    nw = extra["norm_weight"]
    full = run(w, x, act_bits=16, norm_weight=nw)
    singles = np.concatenate([run(w, x[t:t + 1], threads=1, act_bits=16, norm_weight=nw) for t in range(64)])
    np.testing.assert_array_equal(full, singles)
    for b in (3, 16, 33):
        got = np.concatenate([run(w, x[i:i + b], act_bits=16, norm_weight=nw) for i in range(0, 64, b)])
        np.testing.assert_array_equal(got, full, err_msg=f"batch {b}")


def test_act16_refuses_int4_weights():
    assert "attribute act_bits = 16 needs bits = 8" in _bad(act_bits=16)
    assert "attribute act_bits must be 8 or 16; got 12" in _bad(act_bits=12)


@pytest.mark.parametrize("bs", [32, 64])
@pytest.mark.parametrize("epilogue", ["none", "residual", "swiglu", "geglu"])
def test_act16_with_lora_matches_the_reference(epilogue, bs):
    """act_bits 16 on an adapted projection (Gemma 3's q|k|v, gate|up, down): the base on int16 codes, the LoRA on
    the row's int8 codes as with act_bits 8, on every epilogue, mixed slots and tokens without an adapter; blocks
    of 64 take the LoRA's chunk sums from the int8 codes, not the blocks'."""
    rng = np.random.default_rng(5 + bs)
    T = 24
    k, n, widths = (576, 3072, [1536, 1536]) if epilogue in ("swiglu", "geglu") else (576, 960, [576, 192, 192])
    if epilogue == "residual":
        n, widths = 576, [576]
    x = rng.standard_normal((T, k), dtype=np.float32)
    x[:, 7] *= 30
    w = weight(k, n, "int8", bs=bs)
    lora, segs = lora_case(rng, T, k, widths, ranks=(8, 16), n_adapters=3)
    extra = {"residual": rng.standard_normal((T, n), dtype=np.float32)} if epilogue == "residual" else {}
    nw = rng.uniform(0.5, 1.5, k).astype(np.float32) if epilogue == "none" else None
    y = run(w, x, epilogue, act_bits=16, norm_weight=nw, **extra, **lora)
    ref = qlinear_ref(x, w, epilogue=epilogue, token_adapter=lora["token_adapter"], lora_scale=lora["lora_scale"],
                      segments=segs, packed_a=True, norm_weight=nw, act_bits=16, **extra)
    xn = x if nw is None else rms_norm(x, nw, 1e-5)
    mag = magnitude(xn, w, act_bits=16) + lora_magnitude(xn, w, lora, segs)
    if epilogue in ("swiglu", "geglu"):     # as test_gated_epilogue bounds it
        pre = qlinear_ref(x, w, token_adapter=lora["token_adapter"], lora_scale=lora["lora_scale"], segments=segs,
                          packed_a=True, act_bits=16).astype(np.float64)
        g, u = pre[:, :n // 2], pre[:, n // 2:]
        tol = 3e-6 * (1.13 * np.abs(u) * mag[:, :n // 2] + np.abs(g) * mag[:, n // 2:]) + 1e-6 * np.abs(ref) + 1e-7
        assert_close(y, ref, atol=tol, rtol=0, what=f"act16 lora {epilogue} bs={bs}")
        return
    check(y, ref, mag, f"act16 lora {epilogue} bs={bs}")
    # the LoRA term is the act_bits 8 call's: with the base taken out, the two differ by the float sums only
    base16 = run(w, x, epilogue, act_bits=16, norm_weight=nw, **extra)
    base8 = run(w, x, epilogue, norm_weight=nw, **extra)
    y8 = run(w, x, epilogue, norm_weight=nw, **extra, **lora)
    np.testing.assert_allclose(y - base16, y8 - base8, atol=1e-3 * float(np.abs(y8 - base8).max()))


# ---------------------------------------------------------------- bad input

def _bad(feeds_patch=None, **attrs):
    w = weight(64, 128, "int4")
    x = np.ones((3, 64), np.float32)
    feeds = feeds_for(w, x) | (feeds_patch or {})
    a = dict(K=64, N=128, bits=4, block_size=32) | attrs
    with pytest.raises(Exception) as e:
        session(qlinear_model(sorted(feeds), **a)).run(None, feeds)
    return str(e.value)


def test_bad_inputs_name_the_input_and_value():
    w = weight(64, 128, "int4")
    assert "input 'codes' has shape [16, 2, 128], expected [17, 2, 128]" in _bad(N=136)
    assert "input 'x' has shape [3, 64], expected [3, 96]" in _bad(K=96)
    assert "input 'codes' has shape" in _bad({"codes": w.codes[:, :1]})
    # element types are the op's declared schema: ORT itself refuses a wrong one, naming both
    assert "expected: (tensor(float16))" in _bad({"scales": w.scales.astype(np.float32)})
    assert "attribute bits must be 4 or 8; got 3" in _bad(bits=3)
    assert "block_size must be a multiple of 32 up to 256 (32, 64, 128, 256); got 48" in _bad(block_size=48)
    assert "block_size must be a multiple of 32 up to 256" in _bad(block_size=512)
    assert 'epilogue must be "none", "residual", "swiglu" or "geglu"; got "gelu"' in _bad(epilogue="gelu")
    assert "needs input 'residual'" in _bad(epilogue="residual")
    rng = np.random.default_rng(0)
    lora, _ = lora_case(rng, 3, 64, [128], n_slots=2, ranks=(8,), n_adapters=2)
    assert "'token_adapter'[1] = 2 is not -1 or a slot in [0, 2)" in _bad(
        lora | {"token_adapter": np.array([0, 2, -1], np.int32)})
    assert "'rank0'[1] = 9 is outside [0, r_max = 8]" in _bad(lora | {"rank0": np.array([8, 9], np.int32)})
    assert "sum to 100; expected N = 128" in _bad(lora | {"B0": lora["B0"][:, :, :100],
                                                          "B_scale0": lora["B_scale0"][:, :100]})
    assert "needs all of inputs 'A0', 'A_scale0', 'B0', 'B_scale0' and 'rank0'" in _bad(
        {k: v for k, v in lora.items() if k != "rank0"})
    assert "input 'A_scale0' has shape [2, 2, 7], expected [2, 2, 8]" in _bad(
        lora | {"A_scale0": lora["A_scale0"][:, :, :7]})
    assert "input 'A0' needs r_max a multiple of 4 (B's rank quads); got 6" in _bad(
        lora | {"A0": lora["A0"][:, :, :6], "A_scale0": lora["A_scale0"][:, :, :6], "B0": lora["B0"][:, :6],
                "rank0": np.array([6, 6], np.int32)})
    # contract 5's float16 stacks: ORT refuses them by the op's declared int8 type
    assert "expected: (tensor(int8))" in _bad(lora | {"A0": lora["A0"].astype(np.float16)})
