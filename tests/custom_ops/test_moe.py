"""The MoE op in real onnxruntime sessions: parity with tests/reference/moe.py, bitwise equality with the same
experts run as QLinear ops one (token, expert) at a time, batch invariance (each row alone vs in a batch, bitwise),
experts with no tokens, an expert with many tokens (the pool inside its QLinear calls) beside narrow ones, top-1 and
top-2, int4 (with and without offsets) and int8, and bad inputs named."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ortllm.bench.op_graphs import moe_model, session
from ortllm.pipeline.qlinear_pack import dequantize_packed, pack, stack_experts
from ortllm.pipeline.quantize import RTNQuantizer
from ortllm.runtime.ops_library import sessions_isa
from tests.custom_ops.conftest import assert_close, path_at_most, sessions_on
from tests.custom_ops.test_qlinear import FORMS, run as qlinear_run
from tests.reference.moe import moe_ref, moe_tolerance

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

H, INTER, E = 128, 96, 8


@functools.lru_cache(maxsize=None)
def experts(form: str, bs: int = 32, h: int = H, i: int = INTER, e: int = E, seed: int = 0):
    """E experts' (gate|up [2I, H], down [H, I]) packed weights; the up rows scaled so SwiGLU's product is O(1)."""
    bits, sym = FORMS[form]
    rng = np.random.default_rng(seed)
    q = RTNQuantizer(bits, bs, sym)
    gu = [pack(q.quantize(rng.standard_normal((2 * i, h), dtype=np.float32) * 0.2)) for _ in range(e)]
    dn = [pack(q.quantize(rng.standard_normal((h, i), dtype=np.float32) * 0.1)) for _ in range(e)]
    return gu, dn


def sess_for(present: tuple, threads: int = 2, **attrs):
    """The MoE session for these inputs and attributes on the current kernel path (conftest ops_path)."""
    return _sess_for(present, threads, sessions_isa(), **attrs)


@functools.lru_cache(maxsize=None)
def _sess_for(present: tuple, threads: int, path: str | None, **attrs):
    return session(moe_model(list(present), **attrs), threads=threads)


def feeds_for(gu, dn, x, expert, weight, biases=None):
    """biases: {"gate_up_bias": [E, 2I], "down_bias": [E, H]} (either or both), or None."""
    f = {"x": x, "expert": expert.astype(np.int64), "weight": weight.astype(np.float32)} | (biases or {})
    for name, parts in (("gate_up", gu), ("down", dn)):
        codes, scales, offsets = stack_experts(parts)
        f |= {f"{name}_codes": codes, f"{name}_scales": scales}
        if offsets is not None:
            f[f"{name}_offsets"] = offsets
    return f


def run(gu, dn, x, expert, weight, threads=2, biases=None, **attrs):
    """attrs: the optional activation, alpha, limit."""
    feeds = feeds_for(gu, dn, x, expert, weight, biases)
    s = sess_for(tuple(sorted(feeds)), threads, H=dn[0].n, I=dn[0].k, E=len(gu), bits=gu[0].bits,
                 block_size=gu[0].block_size, **attrs)
    return s.run(None, feeds)[0]


def routing(rng, T, k, allowed=E):
    """expert [T, k] (distinct per row, drawn from `allowed` experts: an int = the first that many, or a list) and
    softmax-like weights [T, k]."""
    pool = np.arange(allowed) if isinstance(allowed, int) else np.asarray(allowed)
    expert = np.stack([rng.choice(pool, k, replace=False) for _ in range(T)]).astype(np.int64)
    w = rng.random((T, k)).astype(np.float32) + 0.1
    return expert, (w / w.sum(1, keepdims=True)).astype(np.float32)


def check(y, x, expert, weight, gu, dn, what):
    ref = moe_ref(x, expert, weight, gu, dn)
    assert_close(y, ref, atol=moe_tolerance(x, expert, weight, gu, dn), rtol=0, what=what)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("T", [1, 5, 40])
def test_parity(form, k, T):
    rng = np.random.default_rng(T * 10 + k)
    gu, dn = experts(form)
    x = rng.standard_normal((T, H), dtype=np.float32)
    expert, weight = routing(rng, T, k)
    check(run(gu, dn, x, expert, weight), x, expert, weight, gu, dn, f"{form} top-{k} T={T}")


@pytest.mark.parametrize("form", ["int4", "int8"])
def test_block_size_64_and_odd_widths(form):
    """bs 64 over H = 96 (the last block zero-padded) and I = 40 (down's K one padded block; 2I = 80 rows)."""
    rng = np.random.default_rng(1)
    gu, dn = experts(form, bs=64, h=96, i=40, e=4)
    x = rng.standard_normal((9, 96), dtype=np.float32)
    expert, weight = routing(rng, 9, 2, allowed=4)
    check(run(gu, dn, x, expert, weight), x, expert, weight, gu, dn, f"{form} bs=64")


def composed(gu, dn, x, expert, weight):
    """The same terms one (token, j) at a time through two QLinear ops, combined as the kernel combines them:
    y = w_0 * r_0, then y += w_j * r_j in j order, in float32."""
    y = np.zeros((len(x), dn[0].n), np.float32)
    for t in range(len(x)):
        for j in range(expert.shape[1]):
            e = int(expert[t, j])
            r = qlinear_run(dn[e], qlinear_run(gu[e], x[t:t + 1], epilogue="swiglu"))[0]
            y[t] = weight[t, j] * r if j == 0 else y[t] + weight[t, j] * r
    return y


@pytest.mark.parametrize("form", list(FORMS))
def test_bitwise_the_experts_as_qlinear_ops(form):
    """Grouping the tokens by expert changes no bit: each term's row is QLinear's on that row alone (whatever the
    other tokens of its expert), and the combine is the kernel's, in order. Two experts never routed to; one routed
    to by every token (64 terms: the pool inside its QLinear calls) beside narrow ones."""
    rng = np.random.default_rng(4)
    gu, dn = experts(form)
    T = 64
    x = rng.standard_normal((T, H), dtype=np.float32)
    expert, weight = routing(rng, T, 2, allowed=[0, 2, 3, 5, 6, 7])
    expert[:, 1] = 3                                    # expert 3 takes every token (once per row)
    expert[expert[:, 0] == 3, 0] = 6
    y = run(gu, dn, x, expert, weight)
    np.testing.assert_array_equal(y, composed(gu, dn, x, expert, weight))
    check(y, x, expert, weight, gu, dn, f"{form} wide expert")


@pytest.mark.parametrize("forced", ["avx2", "avx512vnni", "amx"])
def test_every_isa_gives_the_same_bits(forced, form="int4"):
    """Each vector path gives the default path's bits for a routed batch (a wide expert beside narrow ones), each
    session on its own path in this process: the op adds nothing but QLinear's calls and a fixed-order combine.
    (The scalar path's SiLU takes std::exp: it is held to the reference by the parity tests instead.)"""
    rng = np.random.default_rng(5)
    gu, dn = experts(form)
    x = rng.standard_normal((48, H), dtype=np.float32)
    expert, weight = routing(rng, 48, 2)
    expert[:, 1] = 1
    expert[expert[:, 0] == 1, 0] = 4
    default = run(gu, dn, x, expert, weight)
    with sessions_on(path_at_most(forced)):
        other = run(gu, dn, x, expert, weight)
    np.testing.assert_array_equal(default, other, err_msg=f"{forced} -> {path_at_most(forced)}")


@pytest.mark.parametrize("form", ["int4", "int8"])
@pytest.mark.parametrize("k", [1, 2])
def test_batch_invariance(form, k):
    """Each row alone gives the bits it gets in a batch of 300 (two token chunks of the kernel), on 1 and 2
    threads: a token's output never depends on which other tokens share its experts."""
    rng = np.random.default_rng(7 + k)
    gu, dn = experts(form)
    T = 300
    x = rng.standard_normal((T, H), dtype=np.float32)
    expert, weight = routing(rng, T, k, allowed=[1, 2, 4])    # few experts: wide ones (>= 32 terms)
    batch = run(gu, dn, x, expert, weight)
    np.testing.assert_array_equal(run(gu, dn, x, expert, weight, threads=1), batch)
    for t in (0, 1, 17, 255, 256, 299):
        np.testing.assert_array_equal(run(gu, dn, x[t:t + 1], expert[t:t + 1], weight[t:t + 1])[0], batch[t],
                                      err_msg=f"row {t}")
    np.testing.assert_array_equal(run(gu, dn, x[250:260], expert[250:260], weight[250:260]), batch[250:260])


def test_every_expert_and_none_routed():
    """E experts all routed to, k = E (every term of a row, in a row-dependent order): the op's sum is each row's
    full mixture; and an empty batch (T = 0) gives an empty output."""
    rng = np.random.default_rng(11)
    gu, dn = experts("int4", e=4)
    x = rng.standard_normal((6, H), dtype=np.float32)
    expert = np.stack([rng.permutation(4) for _ in range(6)]).astype(np.int64)
    weight = rng.random((6, 4)).astype(np.float32)
    check(run(gu, dn, x, expert, weight), x, expert, weight, gu, dn, "k = E")
    assert run(gu, dn, x[:0], expert[:0], weight[:0]).shape == (0, H)


def test_bad_inputs_are_named():
    rng = np.random.default_rng(2)
    gu, dn = experts("int4")
    x = rng.standard_normal((3, H), dtype=np.float32)
    expert, weight = routing(rng, 3, 2)
    bad = expert.copy()
    bad[1, 1] = E
    with pytest.raises(Exception, match=r"MoE: input 'expert'\[1\]\[1\] = 8 is not an expert in \[0, E = 8\)"):
        run(gu, dn, x, bad, weight)
    with pytest.raises(Exception, match=r"MoE: input 'weight' has shape \[3, 1\], expected \[3, 2\]"):
        run(gu, dn, x, expert, weight[:, :1])
    with pytest.raises(Exception, match=r"MoE: input 'down_codes' has shape \[8, "):
        run(gu[:7], dn, x, expert % 7, weight)


# ---------------------------------------------------------------- gpt-oss: expert biases, the clamped SwiGLU

CLAMPED = dict(activation="clamped_swiglu", alpha=1.702, limit=7.0)


def gpt_oss_case(rng, T, k, form="int4", scale=3.0):
    """x scaled so gate|up's outputs (std ~7) cross the clamp often, and both biases."""
    gu, dn = experts(form)
    x = rng.standard_normal((T, H), dtype=np.float32) * np.float32(scale)
    expert, weight = routing(rng, T, k)
    biases = {"gate_up_bias": rng.standard_normal((E, 2 * INTER), dtype=np.float32),
              "down_bias": rng.standard_normal((E, H), dtype=np.float32) * np.float32(0.1)}
    return gu, dn, x, expert, weight, biases


def check_clamped(y, x, expert, weight, gu, dn, biases, what, **act):
    kw = dict(gate_up_bias=biases.get("gate_up_bias"), down_bias=biases.get("down_bias"), **act)
    ref = moe_ref(x, expert, weight, gu, dn, **kw)
    assert_close(y, ref, atol=moe_tolerance(x, expert, weight, gu, dn, **kw), rtol=0, what=what)


@pytest.mark.parametrize("ops_path", ["default", "scalar"], indirect=True)
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("T", [1, 40])
def test_clamped_swiglu_with_biases_parity(form, T, ops_path):
    """gpt-oss's experts: gate|up bias, g = min(gate, 7), u = clamp(up, -7, 7), (u + 1) g sigmoid(1.702 g), down
    bias; the clamp fires on a good share of the terms (checked), against the NumPy reference."""
    rng = np.random.default_rng(20 + T)
    gu, dn, x, expert, weight, biases = gpt_oss_case(rng, T, 2, form)
    pre = np.stack([dequantize_packed(gu[int(expert[t, 0])]) @ x[t] for t in range(T)])
    assert (np.abs(pre) > 7).mean() > 0.05, "the case should cross the clamp"
    y = run(gu, dn, x, expert, weight, biases=biases, **CLAMPED)
    check_clamped(y, x, expert, weight, gu, dn, biases, f"{form} T={T} {ops_path}", **CLAMPED)
    plain = run(gu, dn, x, expert, weight, biases=biases)          # SwiGLU with the biases (unfused path too)
    check_clamped(plain, x, expert, weight, gu, dn, biases, f"{form} swiglu+bias T={T}")
    assert np.abs(plain - y).max() > 1e-2                          # the activation attribute is read


def test_clamped_limit_and_alpha_are_read():
    rng = np.random.default_rng(3)
    gu, dn, x, expert, weight, biases = gpt_oss_case(rng, 6, 2)
    for act in (dict(CLAMPED, limit=2.0), dict(CLAMPED, alpha=1.0)):
        y = run(gu, dn, x, expert, weight, biases=biases, **act)
        check_clamped(y, x, expert, weight, gu, dn, biases, str(act), **act)


def test_clamped_batch_invariance_and_isa_bits():
    """A row alone gives its bits in a batch of 300 (wide and narrow experts), and every vector path gives the
    default path's bits: the bias and the activation are plain float32 code of the kernel's own file."""
    rng = np.random.default_rng(9)
    gu, dn, x, expert, weight, biases = gpt_oss_case(rng, 300, 2)
    expert[:, 1] = np.where(expert[:, 0] == 2, 4, 2)                # expert 2 (or 4) on every row: wide
    batch = run(gu, dn, x, expert, weight, biases=biases, **CLAMPED)
    for t in (0, 17, 256, 299):
        alone = run(gu, dn, x[t:t + 1], expert[t:t + 1], weight[t:t + 1], biases=biases, **CLAMPED)
        np.testing.assert_array_equal(alone[0], batch[t], err_msg=f"row {t}")
    for forced in ("avx2", "avx512vnni", "amx"):
        with sessions_on(path_at_most(forced)):
            other = run(gu, dn, x, expert, weight, biases=biases, **CLAMPED)
        np.testing.assert_array_equal(other, batch, err_msg=forced)


def test_bad_activation_and_bias_named():
    rng = np.random.default_rng(4)
    gu, dn, x, expert, weight, biases = gpt_oss_case(rng, 3, 2)
    with pytest.raises(Exception, match="MoE: attribute activation = 'gelu' is not swiglu or clamped_swiglu"):
        run(gu, dn, x, expert, weight, activation="gelu")
    with pytest.raises(Exception, match="limit must be finite with limit > 0; got alpha = 1.702, limit = 0"):
        run(gu, dn, x, expert, weight, **dict(CLAMPED, limit=0.0))
    with pytest.raises(Exception, match=r"MoE: input 'down_bias' has shape \[8, 127\], expected \[8, 128\]"):
        run(gu, dn, x, expert, weight, biases={"down_bias": biases["down_bias"][:, :127]})
