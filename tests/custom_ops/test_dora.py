"""DoRA rows in QLinear and MultiLoRA (ops ABI 12): parity with the NumPy references (which multiply a DoRA row by its
slot's scale before the epilogue), batch invariance with base, LoRA and DoRA rows mixed (bitwise), LoRA rows untouched
by the DoRA inputs (bitwise), the same bits on every ISA path, and bad inputs."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ortllm.bench.op_graphs import model, multi_lora_node, session, value_info
from ortllm.runtime.ops_library import ops_isa, sessions_isa
from tests.custom_ops.conftest import assert_close, path_at_most, sessions_on
from tests.custom_ops.test_qlinear import check, lora_case, lora_magnitude, magnitude, run, weight
from tests.reference.multi_lora import multi_lora_ref
from tests.reference.qlinear import dora_row_scales, qlinear_ref

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

N_SLOTS = 8


def dora_case(rng, T, K, widths, epilogue="none", form="int4", ranks=(8, 16, 64), dora_slots=(1, 3, 5, 7),
              lora_layer=False, n_layers=3):
    """A QLinear call with LoRA on every segment, slots `dora_slots` flagged DoRA with scales ~ U(0.5, 1.5) per
    output; with lora_layer the scales are every layer's stack [n_layers, slots, width] (the node reads layer 1)."""
    n = sum(widths)
    x = rng.standard_normal((T, K), dtype=np.float32)
    lora, segs = lora_case(rng, T, K, widths, n_slots=N_SLOTS, ranks=ranks, n_adapters=6, frac_none=0.2)
    dora = np.zeros(N_SLOTS, np.int32)
    dora[list(dora_slots)] = 1
    scales = [rng.uniform(0.5, 1.5, (N_SLOTS, wd)).astype(np.float32) for wd in widths]
    extra = dict(lora, dora=dora)
    for j, g in enumerate(scales):
        extra[f"dora_scale{j}"] = np.stack([g * 0 + np.nan, g, g * 0 + np.nan]) if lora_layer else g
    if epilogue == "residual":
        extra["residual"] = rng.standard_normal((T, n), dtype=np.float32)
    return weight(K, n, form), x, extra, segs, scales


def reference(w, x, extra, segs, scales, epilogue):
    return qlinear_ref(x, w, epilogue=epilogue, residual=extra.get("residual"), token_adapter=extra["token_adapter"],
                       lora_scale=extra["lora_scale"], segments=segs, packed_a=True, dora=extra["dora"],
                       dora_scale=scales)


def tolerance(w, x, extra, segs, scales):
    g = dora_row_scales(extra["token_adapter"], extra["lora_scale"], segs, extra["dora"], scales, w.n)
    return (magnitude(x, w) + lora_magnitude(x, w, extra, segs)) * g + np.abs(extra.get("residual", 0))


@pytest.mark.parametrize("T", [1, 5, 33])
@pytest.mark.parametrize("form", ["int4", "int8"])
@pytest.mark.parametrize("epilogue", ["none", "residual"])
def test_dora_rows_match_the_reference(T, form, epilogue):
    """q|k|v-like segments (576 | 192 | 192) or one segment with the residual epilogue; base, LoRA and DoRA rows in
    one call."""
    rng = np.random.default_rng(T * 7 + len(form) + len(epilogue))
    widths = [576, 192, 192] if epilogue == "none" else [576]
    w, x, extra, segs, scales = dora_case(rng, T, 576, widths, epilogue, form)
    y = run(w, x, epilogue, **extra)
    ref = reference(w, x, extra, segs, scales, epilogue)
    check(y, ref, tolerance(w, x, extra, segs, scales), f"dora {form} {epilogue} T={T}")
    dora_rows = [t for t, a in enumerate(extra["token_adapter"]) if a >= 0 and extra["dora"][a]]
    assert dora_rows or T == 1, "the case must hold DoRA rows"


def test_dora_swiglu_scales_gate_and_up():
    """SwiGLU: the gate and the up halves are each multiplied by their own columns' scales before SiLU(gate) * up."""
    rng = np.random.default_rng(5)
    w, x, extra, segs, scales = dora_case(rng, 20, 576, [1536, 1536], "swiglu")
    y = run(w, x, "swiglu", **extra)
    ref = reference(w, x, extra, segs, scales, "swiglu")
    plain = qlinear_ref(x, w, epilogue="none", token_adapter=extra["token_adapter"], lora_scale=extra["lora_scale"],
                        segments=segs, packed_a=True, dora=extra["dora"], dora_scale=scales)
    mag = tolerance(w, x, extra, segs, scales)
    g, u = plain[:, :1536].astype(np.float64), plain[:, 1536:].astype(np.float64)
    # d(silu(g) * u) <= |u| * |dg| * 1.1 + |silu(g)| * |du|
    tol = 3e-6 * (np.abs(u) * 1.1 * mag[:, :1536] + np.abs(g) * mag[:, 1536:]) + 1e-6
    assert_close(y, ref, atol=tol, rtol=1e-5, what="dora swiglu")


def test_stacked_scales_read_at_the_node_layer():
    """With lora_layer, dora_scale_j is [n_layers, n_slots, N_j] and the node reads its layer (the others are NaN)."""
    rng = np.random.default_rng(9)
    w, x, extra, segs, scales = dora_case(rng, 9, 576, [576, 192, 192], lora_layer=True)
    stacked = {k: (np.stack([v] * 3) if k[:-1] in ("A", "A_scale", "B", "B_scale") else v) for k, v in extra.items()}
    y = run(w, x, lora_layer=1, **stacked)
    check(y, reference(w, x, extra, segs, scales, "none"), tolerance(w, x, extra, segs, scales), "stacked dora")


def test_lora_rows_are_untouched_by_the_dora_inputs():
    """Rows of plain LoRA slots and base rows give bitwise what the same call without any DoRA input gives; DoRA
    rows differ from it."""
    rng = np.random.default_rng(13)
    w, x, extra, segs, scales = dora_case(rng, 40, 576, [576, 192, 192])
    with_dora = run(w, x, **extra)
    without = run(w, x, **{k: v for k, v in extra.items() if not k.startswith("dora")})
    ta = extra["token_adapter"]
    plain = np.array([a < 0 or not extra["dora"][a] for a in ta])
    assert plain.any() and (~plain).any()
    np.testing.assert_array_equal(with_dora[plain], without[plain])
    assert (with_dora[~plain] != without[~plain]).any(axis=1).all()


def test_flag_without_tokens_reads_no_scale():
    """A batch with no DoRA row never reads the scale inputs (here absent although slots are flagged)."""
    rng = np.random.default_rng(17)
    w, x, extra, segs, scales = dora_case(rng, 12, 576, [576, 192, 192])
    ta = extra["token_adapter"].copy()
    ta[[a >= 0 and bool(extra["dora"][a]) for a in ta]] = -1
    feeds = {k: v for k, v in extra.items() if not k.startswith("dora_scale")} | {"token_adapter": ta}
    y = run(w, x, **feeds)
    np.testing.assert_array_equal(y, run(w, x, **(extra | {"token_adapter": ta})))


def _rows(extra, sl):
    return {k: (v[sl] if k in ("token_adapter", "residual") else v) for k, v in extra.items()}


@functools.lru_cache(maxsize=None)
def _invariance_case(epilogue):
    rng = np.random.default_rng(21)
    widths = {"none": [576, 192, 192], "residual": [576], "swiglu": [1536, 1536]}[epilogue]
    return dora_case(rng, 64, 576, widths, epilogue)


@pytest.mark.parametrize("epilogue", ["none", "residual", "swiglu"])
def test_mixed_batch_equals_each_row_alone(epilogue):
    """64 rows of base, LoRA and DoRA slots: one by one, in batches of 2..64 and on 1 or 2 threads, bitwise the same."""
    w, x, extra, _, _ = _invariance_case(epilogue)
    full = run(w, x, epilogue, **extra)
    singles = np.concatenate([run(w, x[t:t + 1], epilogue, threads=1, **_rows(extra, slice(t, t + 1)))
                              for t in range(64)])
    np.testing.assert_array_equal(full, singles)
    for b in (3, 8, 16, 33):
        got = np.concatenate([run(w, x[i:i + b], epilogue, **_rows(extra, slice(i, i + b))) for i in range(0, 64, b)])
        np.testing.assert_array_equal(got, full, err_msg=f"batch {b}")


def _isa_bits() -> dict[str, str]:
    """The DoRA invariance cases' outputs (hex) on the sessions' current kernel path (conftest ops_path)."""
    out = {}
    for epi in ("none", "residual", "swiglu"):
        w, x, extra, _, _ = _invariance_case(epi)
        out[epi] = run(w, x, epi, **extra).tobytes().hex()
    return out


@pytest.mark.parametrize("forced", ["scalar", "avx2"])
def test_every_isa_gives_the_same_bits(forced):
    """The scalar and avx2 paths give the DoRA rows the same bits as the default path (but the scalar SiLU), in one
    process."""
    default = _isa_bits()
    with sessions_on(path_at_most(forced)):
        other = _isa_bits()
    for epi in ("none", "residual", "swiglu"):
        if forced == "scalar" and epi == "swiglu":
            continue   # the scalar SiLU uses std::exp (qlinear.h)
        assert default[epi] == other[epi], (forced, epi, ops_isa())


def test_bad_dora_inputs():
    rng = np.random.default_rng(3)
    w, x, extra, _, _ = dora_case(rng, 6, 576, [576, 192, 192])
    bad = extra | {"dora": np.full(N_SLOTS, 2, np.int32)}
    with pytest.raises(Exception, match=r"QLinear: input 'dora'\[0\] = 2 is not 0 or 1"):
        run(w, x, **bad)
    missing = {k: v for k, v in extra.items() if k != "dora_scale1"}
    with pytest.raises(Exception, match="QLinear: a token of a slot flagged in input 'dora' needs input 'dora_scale1'"):
        run(w, x, **missing)
    short = extra | {"dora_scale0": extra["dora_scale0"][:, :100]}
    with pytest.raises(Exception, match="QLinear: input 'dora_scale0' has shape"):
        run(w, x, **short)


# ---------------------------------------------------------------- MultiLoRA (fp32 projections)

_ML_NAMES = ["x", "base_y", "A", "B", "scale", "rank", "token_adapter", "offsets", "dora", "dora_scale"]
_ML_TYPES = [1, 1, 10, 10, 1, 6, 6, 10, 6, 1]      # TensorProto: FLOAT 1, FLOAT16 10, INT32 6


def _ml_session(with_offsets: bool, stacked: bool):
    return _ml_session_on(with_offsets, stacked, sessions_isa())


@functools.lru_cache(maxsize=None)
def _ml_session_on(with_offsets: bool, stacked: bool, path: str | None):
    names = [n if (n != "offsets" or with_offsets) else "" for n in _ML_NAMES]
    inputs = [value_info(n, t, None) for n, t in zip(_ML_NAMES, _ML_TYPES) if n in names]
    attrs = {"packed_a": 0} | ({"block_size": 32} if with_offsets else {}) | ({"lora_layer": 2} if stacked else {})
    return session(model([multi_lora_node(names, ["y"], **attrs)], inputs, [value_info("y", 1, 2)]), threads=2)


@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("T", [1, 7, 40])
def test_multi_lora_dora_rows(with_offsets, stacked, T):
    """y = g * (base_y + offsets + scale * x A B) on DoRA rows, the plain result elsewhere; with offsets left out
    ("" before the DoRA inputs) and with every layer's scales stacked (lora_layer = 2)."""
    rng = np.random.default_rng(T + 2 * with_offsets + stacked)
    k, n, r = 96, 160, 16
    f = dict(x=rng.standard_normal((T, k), dtype=np.float32), base_y=rng.standard_normal((T, n), dtype=np.float32),
             A=(rng.standard_normal((N_SLOTS, k, r)) / np.sqrt(k)).astype(np.float16),
             B=(rng.standard_normal((N_SLOTS, r, n)) * 0.1).astype(np.float16),
             scale=rng.uniform(0.5, 2, N_SLOTS).astype(np.float32),
             rank=np.array([16, 8, 0, 16, 4, 8, 16, 12], np.int32),
             token_adapter=rng.integers(-1, N_SLOTS, T).astype(np.int32),
             dora=np.array([1, 0, 1, 1, 0, 1, 0, 1], np.int32))
    g = rng.uniform(0.5, 1.5, (N_SLOTS, n)).astype(np.float32)
    f["dora_scale"] = np.stack([g * np.nan, g * np.nan, g]) if stacked else g
    if with_offsets:
        f["offsets"] = (rng.standard_normal((3, n)) * 0.01).astype(np.float16)
    (y,) = _ml_session(with_offsets, stacked).run(None, f)
    ref = multi_lora_ref(f["x"], f["base_y"], f["A"], f["B"], f["scale"], f["rank"], f["token_adapter"],
                         offsets=f.get("offsets"), block_size=32, dora=f["dora"], dora_scale=g)
    assert_close(y, ref, atol=1e-5, rtol=1e-5, what="multi_lora dora")
    plain = multi_lora_ref(f["x"], f["base_y"], f["A"], f["B"], f["scale"], f["rank"], f["token_adapter"],
                           offsets=f.get("offsets"), block_size=32)
    scaled = [t for t, a in enumerate(f["token_adapter"]) if a >= 0 and f["dora"][a] and f["rank"][a] > 0]
    assert len(scaled) > 0 or T == 1
    assert not np.allclose(ref[scaled], plain[scaled]) or not scaled


def test_multi_lora_bad_dora_inputs():
    f = dict(x=np.ones((2, 32), np.float32), base_y=np.ones((2, 16), np.float32),
             A=np.ones((2, 32, 4), np.float16), B=np.ones((2, 4, 16), np.float16), scale=np.ones(2, np.float32),
             rank=np.array([4, 4], np.int32), token_adapter=np.array([0, 1], np.int32),
             dora=np.array([0, 1], np.int32), dora_scale=np.ones((3, 2, 15), np.float32))
    with pytest.raises(Exception, match=r"MultiLoRA: input 'dora_scale' has shape \[3, 2, 15\], expected \[3, 2, 16\]"):
        _ml_session(False, True).run(None, f)
    with pytest.raises(Exception, match=r"MultiLoRA: input 'dora'\[1\] = 3 is not 0 or 1"):
        _ml_session(False, True).run(None, f | {"dora": np.array([0, 3], np.int32)})
