"""Adapter mixes in the ops (ops ABI 14): token_adapter [T, M] with token_adapter_weight [T, M]. QLinear and MultiLoRA
against the NumPy references, a one-term weight-1 row equal to the one-adapter form bit for bit, a mix against its
adapters' single deltas combined in NumPy, batch invariance (bitwise) with mixed, single and base rows together,
the same bits on every ISA path, and bad inputs named."""

from __future__ import annotations


import numpy as np
import pytest

from ortllm.bench.op_graphs import LORA_INPUTS, multi_lora_model, session
from ortllm.runtime.ops_library import ops_isa
from tests.custom_ops.conftest import assert_close, path_at_most, sessions_on
from tests.custom_ops.test_multi_lora import make_case
from tests.custom_ops.test_qlinear import _bad, check, lora_case, lora_magnitude, run, weight
from tests.reference.multi_lora import multi_lora_ref
from tests.reference.qlinear import lora_terms, magnitude, qlinear_ref

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

M = 4   # terms per token (QLinear's kQLinearMaxTerms)


def mixes(rng, T: int, slots: list[int], frac_none: float = 0.2, frac_single: float = 0.3):
    """[T, M] slots (a row's -1s after its slots) and [T, M] weights: rows of 2..4 distinct slots with weights of
    either sign, single-adapter rows (weight 1) and base rows (-1)."""
    ta, w = np.full((T, M), -1, np.int32), np.zeros((T, M), np.float32)
    for t in range(T):
        u = rng.random()
        if u < frac_none:
            continue
        n = 1 if u < frac_none + frac_single else int(rng.integers(2, M + 1))
        ta[t, :n] = rng.choice(slots, n, replace=False)
        w[t, :n] = 1.0 if n == 1 else rng.uniform(-1.0, 1.5, n).astype(np.float32)
    return ta, w


def qlinear_mix_case(seed: int, T: int, k: int, widths: list[int], form: str = "int4", ranks=(8, 16)):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, k), dtype=np.float32)
    lora, segs = lora_case(rng, T, k, widths, n_slots=6, ranks=ranks, n_adapters=4)
    ta, wt = mixes(rng, T, [0, 2, 3, 5])
    return weight(k, sum(widths), form), x, lora | {"token_adapter": ta, "token_adapter_weight": wt}, segs


def ref_args(feeds):
    return {k: feeds[k] for k in ("token_adapter", "lora_scale", "token_adapter_weight", "residual") if k in feeds}


def mix_magnitude(x, w, feeds, segs):
    """lora_magnitude summed over each row's terms (weights' sizes folded in): the tolerance's LoRA part."""
    ta, wt = feeds["token_adapter"], feeds["token_adapter_weight"]
    mag = 0.0
    for k in range(ta.shape[1]):
        one = lora_magnitude(x, w, feeds | {"token_adapter": ta[:, k]}, segs)
        mag = mag + np.abs(wt[:, k:k + 1]) * one
    return mag


@pytest.mark.parametrize("form", ["int4", "int8"])
@pytest.mark.parametrize("epilogue", ["none", "swiglu", "off-grid"])
def test_qlinear_mix_matches_the_reference(form, epilogue):
    """Rows mixing 2..4 adapters with weights of either sign, single-adapter and base rows: the reference's
    sum_k w_k * lscale * (x A_k) B_k, within the float32 accumulation's steps. The projection's items add a row's
    terms for the groups they compute; with a segment off the 8-column grid ("off-grid") the driver adds them first."""
    widths = {"swiglu": [768, 768], "none": [576, 192, 192], "off-grid": [572, 196, 192]}[epilogue]
    epilogue = "none" if epilogue == "off-grid" else epilogue
    w, x, feeds, segs = qlinear_mix_case(1, 24, 576, widths, form)
    y = run(w, x, epilogue, **feeds)
    ref = qlinear_ref(x, w, epilogue=epilogue, segments=segs, packed_a=True, **ref_args(feeds))
    if epilogue == "none":
        check(y, ref, magnitude(x, w) + mix_magnitude(x, w, feeds, segs), "mixed rows")
    else:   # SiLU(gate) * up: compare the pre-activation sums through the same tolerance on a none-epilogue call
        pre = run(w, x, "none", **feeds)
        pre_ref = qlinear_ref(x, w, segments=segs, packed_a=True, **ref_args(feeds))
        check(pre, pre_ref, magnitude(x, w) + mix_magnitude(x, w, feeds, segs), "mixed rows (gate|up)")
        assert_close(y, ref, atol=1e-3, rtol=1e-3, what="SwiGLU of mixed rows")


def test_one_term_of_weight_one_is_the_one_adapter_form():
    """[T, 1] slots with weight 1, [T, M] with -1 padding (weights or none) and the [T] form: the same bits."""
    w, x, feeds, _ = qlinear_mix_case(2, 16, 576, [576, 192, 192])
    single = feeds["token_adapter"][:, 0].copy()
    base = {k: v for k, v in feeds.items() if k not in ("token_adapter", "token_adapter_weight")}
    y = run(w, x, token_adapter=single, **base)
    padded = np.full((16, M), -1, np.int32)
    padded[:, 0] = single
    ones = np.ones((16, M), np.float32)
    for ta, wt in ((single[:, None], np.ones((16, 1), np.float32)), (padded, ones), (padded, None),
                   (single, np.ones(16, np.float32))):
        np.testing.assert_array_equal(run(w, x, token_adapter=ta, token_adapter_weight=wt, **base), y)


def test_mix_is_the_weighted_sum_of_its_adapters_deltas():
    """The engine's own single-adapter outputs combined in NumPy on the same quantized base: y(mix) - y(base) =
    sum_k w_k (y(adapter k alone) - y(base)) per output, within the float32 steps of the terms."""
    w, x, feeds, segs = qlinear_mix_case(3, 12, 576, [576, 192, 192])
    ta, wt = feeds["token_adapter"], feeds["token_adapter_weight"]
    base = {k: v for k, v in feeds.items() if k not in ("token_adapter", "token_adapter_weight")}
    y0 = run(w, x, token_adapter=np.full(12, -1, np.int32), **base).astype(np.float64)
    combined = np.zeros_like(y0)
    for k in range(M):
        one = run(w, x, token_adapter=ta[:, k].copy(), **base).astype(np.float64)
        combined += wt[:, k:k + 1] * (one - y0)
    y = run(w, x, **feeds).astype(np.float64)
    tol = 3e-6 * (magnitude(x, w) * (1 + np.abs(wt).sum(1, keepdims=True)) + mix_magnitude(x, w, feeds, segs))
    assert_close(y - y0, combined, atol=tol + 1e-6, rtol=1e-5, what="mix vs combined single deltas")
    delta = lora_terms(x, w.block_size, ta, feeds["lora_scale"], segs, True, w.n, wt)[0]
    rms = lambda v: float(np.sqrt(np.mean(np.square(v))))  # noqa: E731
    assert rms(y - y0 - combined) < 1e-3 * rms(delta), "the mix's delta is its adapters' weighted deltas"


@pytest.mark.parametrize("epilogue", ["none", "residual", "swiglu"])
def test_qlinear_mixed_rows_are_batch_invariant(epilogue):
    """64 rows (mixes of 2..4 adapters, single adapters, base rows): one by one, in batches of 2..64 and uneven
    slices, on 1 and 2 threads, the same bits; a mixed row with its terms in the same order gives the same bits
    whichever slots hold its adapters' neighbours."""
    k, widths = (576, [1536, 1536]) if epilogue == "swiglu" else (576, [576, 192, 192])
    w, x, feeds, _ = qlinear_mix_case(4, 64, k, widths)
    if epilogue == "residual":
        feeds["residual"] = np.random.default_rng(5).standard_normal((64, w.n), dtype=np.float32)
    per_row = ("token_adapter", "token_adapter_weight", "residual")

    def rows(sl):
        return {n: (v[sl] if n in per_row else v) for n, v in feeds.items()}

    full = run(w, x, epilogue, **feeds)
    singles = np.concatenate([run(w, x[t:t + 1], epilogue, threads=1, **rows(slice(t, t + 1))) for t in range(64)])
    np.testing.assert_array_equal(full, singles)
    for b in (2, 5, 16, 33):
        got = np.concatenate([run(w, x[i:i + b], epilogue, **rows(slice(i, i + b))) for i in range(0, 64, b)])
        np.testing.assert_array_equal(got, full, err_msg=f"batch {b}")
    cuts = [0, 1, 4, 11, 29, 47, 64]
    got = np.concatenate([run(w, x[a:b], epilogue, threads=1 + (i % 2), **rows(slice(a, b)))
                          for i, (a, b) in enumerate(zip(cuts, cuts[1:]))])
    np.testing.assert_array_equal(got, full, err_msg="chunked slices")


# QLinear only: MultiLoRA's fp32 GEMMs differ in their last bits between the scalar and AVX2 tables (mixed or not); a
# mixed row is batch-invariant on each (the MultiLoRA tests below run on every path under isa_paths)
ISA_KEYS = [f"{form}-{epi}" for form in ("int4", "int8") for epi in ("none", "residual")]


def isa_run(key: str) -> np.ndarray:
    form, epi = key.split("-")
    w, x, feeds, _ = qlinear_mix_case(7, 40, 576, [576, 192, 192], form)
    if epi == "residual":
        feeds["residual"] = np.random.default_rng(8).standard_normal((40, w.n), dtype=np.float32)
    return run(w, x, epi, **feeds)


@pytest.mark.parametrize("forced", ["scalar", "avx2"])
def test_every_isa_gives_the_same_bits_for_mixes(forced):
    """The scalar and avx2 paths give the default path's bits (AVX-512 VNNI where the CPU has it) for mixed rows, in
    one process: the terms are each the one-adapter kernels' values, and the driver adds them."""
    default = {key: isa_run(key).tobytes().hex() for key in ISA_KEYS}
    with sessions_on(path_at_most(forced)):
        other = {key: isa_run(key).tobytes().hex() for key in ISA_KEYS}
    for key in ISA_KEYS:
        assert default[key] == other[key], (forced, key, ops_isa())


# ---------------------------------------------------------------- MultiLoRA (fp32 projections)

def multi_lora_mix_case(seed: int, T: int):
    rng = np.random.default_rng(seed)
    feeds = make_case(rng, T=T, in_dim=72, out_dim=200, n_slots=6, r_max=16, ranks=(8, 16, 4), n_adapters=4,
                      packed_a=True)
    ta, wt = mixes(rng, T, [0, 1, 3, 4])
    return feeds | {"token_adapter": ta, "token_adapter_weight": wt}


def test_multi_lora_mix_matches_the_reference():
    sess = session(multi_lora_model(packed_a=True, mix=True), threads=2)
    feeds = multi_lora_mix_case(9, 48)
    (y,) = sess.run(None, feeds)
    ref = multi_lora_ref(*(feeds[n] for n in LORA_INPUTS), packed_a=True, weights=feeds["token_adapter_weight"])
    assert_close(y, ref, atol=1e-5, rtol=1e-5, what="mixed rows")


def test_multi_lora_mixed_rows_are_batch_invariant_and_one_term_is_the_one_adapter_form():
    sess = session(multi_lora_model(packed_a=True, mix=True), threads=2)
    feeds = multi_lora_mix_case(10, 48)
    (full,) = sess.run(None, feeds)
    per_row = ("x", "base_y", "token_adapter", "token_adapter_weight")
    for b in (1, 7, 48):
        got = np.concatenate([sess.run(None, {n: (v[i:i + b] if n in per_row else v) for n, v in feeds.items()})[0]
                              for i in range(0, 48, b)])
        np.testing.assert_array_equal(got, full, err_msg=f"batch {b}")
    plain = session(multi_lora_model(packed_a=True), threads=2)
    single = feeds | {"token_adapter": feeds["token_adapter"][:, 0].copy()}
    del single["token_adapter_weight"]
    one = feeds | {"token_adapter": np.where(np.arange(M) == 0, feeds["token_adapter"][:, :1], -1).astype(np.int32),
                   "token_adapter_weight": np.ones((48, M), np.float32)}
    np.testing.assert_array_equal(sess.run(None, one)[0], plain.run(None, single)[0])


# ---------------------------------------------------------------- bad inputs

def test_bad_mix_inputs_name_the_input_and_value():
    rng = np.random.default_rng(0)
    lora, _ = lora_case(rng, 3, 64, [128], n_slots=3, ranks=(8,), n_adapters=2)
    ta = np.array([[0, 1], [1, -1], [-1, -1]], np.int32)
    wt = np.ones((3, 2), np.float32)
    mix = lora | {"token_adapter": ta, "token_adapter_weight": wt}
    assert "input 'token_adapter' [T, M] needs M in [1, 4]; got shape [3, 5]" in _bad(
        mix | {"token_adapter": np.full((3, 5), -1, np.int32), "token_adapter_weight": np.ones((3, 5), np.float32)})
    assert "'token_adapter'[2][1] = 0 follows a -1 in its row" in _bad(
        mix | {"token_adapter": np.array([[0, 1], [1, -1], [-1, 0]], np.int32)})
    assert "'token_adapter'[0][1] = 3 is not -1 or a slot in [0, 3)" in _bad(
        mix | {"token_adapter": np.array([[0, 3], [1, -1], [-1, -1]], np.int32)})
    assert "'token_adapter_weight'[1][0] = nan is not a finite number" in _bad(
        mix | {"token_adapter_weight": np.array([[1, 1], [np.nan, 1], [1, 1]], np.float32)})
    assert "'token_adapter_weight'[0][1] = inf is not a finite number" in _bad(
        mix | {"token_adapter_weight": np.array([[1, np.inf], [1, 1], [1, 1]], np.float32)})
    assert "input 'token_adapter_weight' has shape [3, 3], expected [3, 2]" in _bad(
        mix | {"token_adapter_weight": np.ones((3, 3), np.float32)})
    dora = {"dora": np.array([0, 1, 0], np.int32), "dora_scale0": np.ones((3, 128), np.float32)}
    assert "'token_adapter'[0][1] = 1 is a DoRA slot (input 'dora') in a row that mixes adapters" in _bad(
        mix | dora)
    assert "'token_adapter_weight'[0][0] = 0.5 weighs a DoRA slot" in _bad(
        mix | dora | {"token_adapter": np.array([[1, -1], [0, 2], [-1, -1]], np.int32),
                      "token_adapter_weight": np.array([[0.5, 1], [1, 1], [1, 1]], np.float32)})


def test_multi_lora_bad_mix_inputs():
    sess = session(multi_lora_model(packed_a=True, mix=True))
    feeds = multi_lora_mix_case(11, 4)
    for patch, msg in (({"token_adapter": np.array([[0, -1, 1, -1]] * 4, np.int32)}, "follows a -1 in its row"),
                       ({"token_adapter_weight": np.full((4, M), np.nan, np.float32)}, "is not a finite number"),
                       ({"token_adapter": np.full((4, 5), -1, np.int32),
                         "token_adapter_weight": np.ones((4, 5), np.float32)}, "needs M in [1, 4]")):
        with pytest.raises(Exception, match=None) as e:
            sess.run(None, feeds | patch)
        assert msg in str(e.value), str(e.value)
