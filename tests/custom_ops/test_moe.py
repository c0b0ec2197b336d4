"""The MoE op in real onnxruntime sessions: parity with tests/reference/moe.py, bitwise equality with the same
experts run as QLinear ops one (token, expert) at a time, batch invariance (each row alone vs in a batch, bitwise),
experts with no tokens, an expert with many tokens (the pool inside its QLinear calls) beside narrow ones, top-1 and
top-2, int4 (with and without offsets) and int8, and bad inputs named."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ortllm.bench.op_graphs import moe_model, session
from ortllm.pipeline.qlinear_pack import pack, stack_experts
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


def feeds_for(gu, dn, x, expert, weight):
    f = {"x": x, "expert": expert.astype(np.int64), "weight": weight.astype(np.float32)}
    for name, parts in (("gate_up", gu), ("down", dn)):
        codes, scales, offsets = stack_experts(parts)
        f |= {f"{name}_codes": codes, f"{name}_scales": scales}
        if offsets is not None:
            f[f"{name}_offsets"] = offsets
    return f


def run(gu, dn, x, expert, weight, threads=2):
    feeds = feeds_for(gu, dn, x, expert, weight)
    s = sess_for(tuple(sorted(feeds)), threads, H=dn[0].n, I=dn[0].k, E=len(gu), bits=gu[0].bits,
                 block_size=gu[0].block_size)
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
