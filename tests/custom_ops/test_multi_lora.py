"""MultiLoRA parity against tests/reference/multi_lora.py in a real onnxruntime session."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from ortllm.bench.op_graphs import (F16, F32, I32, LORA_INPUTS, model, multi_lora_model, multi_lora_node, session,
                                     value_info)
from ortllm.runtime.ops_library import sessions_isa
from tests.custom_ops.conftest import assert_close
from tests.reference.multi_lora import multi_lora_ref, slot_a

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names


@functools.lru_cache(maxsize=None)
def _session(packed_a: bool, path: str | None):
    return session(multi_lora_model(packed_a=packed_a), threads=2)


@pytest.fixture
def sess(ops_path):
    """The MultiLoRA session on the test's kernel path (conftest ops_path), made once per path."""
    return _session(False, sessions_isa())


@pytest.fixture
def packed_sess(ops_path):
    return _session(True, sessions_isa())


def make_case(rng, *, T, in_dim, out_dim, n_slots, r_max, ranks, n_adapters, frac_none=0.25, packed_a=False):
    """Feeds for one MultiLoRA call: A and B float16 (the slot stacks), the rest float32 / int32.
    packed_a: each slot's A is a row-major [in, rank] matrix at the start of its [in, r_max] block."""
    x = rng.standard_normal((T, in_dim), dtype=np.float32)
    base_y = rng.standard_normal((T, out_dim), dtype=np.float32)
    A = (rng.standard_normal((n_slots, in_dim, r_max)) / np.sqrt(in_dim)).astype(np.float16)
    B = (rng.standard_normal((n_slots, r_max, out_dim)) / np.sqrt(r_max)).astype(np.float16)
    rank = np.array([ranks[i % len(ranks)] for i in range(n_slots)], dtype=np.int32)
    for s in range(n_slots):  # padding past a slot's rank must never be read: NaN would show in y
        if packed_a:
            A[s].reshape(-1)[in_dim * rank[s]:] = np.nan
        else:
            A[s, :, rank[s]:] = np.nan
        B[s, rank[s]:, :] = np.nan
    scale = rng.uniform(0.5, 2.0, n_slots).astype(np.float32)
    used = rng.choice(n_slots, size=n_adapters, replace=False) if n_adapters else np.array([], int)
    token_adapter = np.full(T, -1, dtype=np.int32)
    if n_adapters:
        token_adapter = rng.choice(used, size=T).astype(np.int32)
        token_adapter[rng.random(T) < frac_none] = -1
    return dict(x=x, base_y=base_y, A=A, B=B, scale=scale, rank=rank, token_adapter=token_adapter)


@pytest.mark.parametrize("T", [1, 5, 16, 64])
@pytest.mark.parametrize("n_adapters", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("ranks", [(8,), (16,), (32,), (64,), (8, 16, 32, 64)])
def test_multi_lora_parity(sess, T, n_adapters, ranks):
    rng = np.random.default_rng(T * 100 + n_adapters * 10 + len(ranks) + ranks[0])
    feeds = make_case(rng, T=T, in_dim=72, out_dim=200, n_slots=8, r_max=max(ranks),
                      ranks=ranks, n_adapters=n_adapters)
    (y,) = sess.run(None, feeds)
    ref = multi_lora_ref(*(feeds[n] for n in LORA_INPUTS))
    assert_close(y, ref, atol=1e-5, rtol=1e-5, what="y")


@pytest.mark.parametrize("T", [1, 16, 64])
@pytest.mark.parametrize("n_adapters", [1, 4, 8])
@pytest.mark.parametrize("ranks", [(8,), (64,), (8, 16, 32, 64), (1, 5, 13, 21)])
def test_multi_lora_packed_a_parity(packed_sess, T, n_adapters, ranks):
    """packed_a = 1 (the engine's layout): slot s's A is [in, rank[s]] row-major, the rest of its block NaN."""
    rng = np.random.default_rng(T * 1000 + n_adapters * 10 + sum(ranks))
    feeds = make_case(rng, T=T, in_dim=72, out_dim=200, n_slots=8, r_max=64, ranks=ranks, n_adapters=n_adapters,
                      packed_a=True)
    (y,) = packed_sess.run(None, feeds)
    ref = multi_lora_ref(*(feeds[n] for n in LORA_INPUTS), packed_a=True)
    assert_close(y, ref, atol=1e-5, rtol=1e-5, what="y (packed A)")


def test_packed_a_reference_is_the_same_product():
    """The reference's packed layout holds the same [in, r] matrix as A[a][:, :r] does unpacked."""
    rng = np.random.default_rng(1)
    A = rng.standard_normal((3, 10, 8)).astype(np.float16)
    packed = np.zeros_like(A)
    for a, r in enumerate((8, 3, 5)):
        packed[a].reshape(-1)[:10 * r] = A[a, :, :r].reshape(-1)
        np.testing.assert_array_equal(slot_a(packed, a, r, packed_a=True), A[a, :, :r])


@pytest.mark.parametrize("T", [1, 7, 64])
@pytest.mark.parametrize("out_dim", [203, 13])
def test_multi_lora_odd_ranks_and_widths(sess, T, out_dim):
    """Ranks and widths off the 16/8-column micro-kernel: the shrink's and the expand's tail columns."""
    rng = np.random.default_rng(T * 7 + out_dim)
    feeds = make_case(rng, T=T, in_dim=45, out_dim=out_dim, n_slots=4, r_max=24, ranks=(1, 5, 13, 21),
                      n_adapters=4)
    (y,) = sess.run(None, feeds)
    assert_close(y, multi_lora_ref(*(feeds[n] for n in LORA_INPUTS)), atol=1e-5, rtol=1e-5, what="y")


def test_multi_lora_fp16_stacks_vs_fp32_adapter(sess):
    """The cost of storing adapters in fp16: against the fp32 weights before rounding, the update differs by
    at most what rounding A and B (relative 2^-11 each) can do: scale * (2u + u^2) * (|x| @ |A|) @ |B|."""
    rng = np.random.default_rng(5)
    T, in_dim, out_dim, r = 16, 576, 960, 16
    feeds = make_case(rng, T=T, in_dim=in_dim, out_dim=out_dim, n_slots=4, r_max=r, ranks=(r,), n_adapters=4)
    A32 = (rng.standard_normal((4, in_dim, r)) / np.sqrt(in_dim)).astype(np.float32)
    B32 = (rng.standard_normal((4, r, out_dim)) * 0.02).astype(np.float32)
    feeds.update(A=A32.astype(np.float16), B=B32.astype(np.float16))
    (y,) = sess.run(None, feeds)
    fp32 = {**feeds, "A": A32, "B": B32}
    ref = multi_lora_ref(*(fp32[n] for n in LORA_INPUTS))
    u = 2.0 ** -11
    bound = np.zeros((T, out_dim))
    for t, a in enumerate(feeds["token_adapter"]):
        if a >= 0:
            bound[t] = feeds["scale"][a] * (2 * u + u * u) * (np.abs(feeds["x"][t]) @ np.abs(A32[a])) @ np.abs(B32[a])
    assert_close(y, ref, atol=1e-5 + bound, rtol=1e-5, what="y (fp16 stacks) vs fp32 adapter")


def test_multi_lora_fused_qkv_shapes(sess):
    """One call serves q|k|v concatenated along out (SmolLM2: 576 + 192 + 192)."""
    rng = np.random.default_rng(7)
    feeds = make_case(rng, T=16, in_dim=576, out_dim=960, n_slots=4, r_max=16, ranks=(16, 8),
                      n_adapters=4)
    (y,) = sess.run(None, feeds)
    assert_close(y, multi_lora_ref(*(feeds[n] for n in LORA_INPUTS)), atol=1e-5, rtol=1e-5, what="y")


def test_multi_lora_all_minus_one_is_base_y(sess):
    rng = np.random.default_rng(3)
    feeds = make_case(rng, T=8, in_dim=32, out_dim=48, n_slots=2, r_max=8, ranks=(8,), n_adapters=0)
    (y,) = sess.run(None, feeds)
    np.testing.assert_array_equal(y, feeds["base_y"])


def test_multi_lora_output_aliases_base_y_under_io_binding(sess):
    """Binding the same OrtValue as base_y and y: the update lands in that buffer, nothing copied."""
    rng = np.random.default_rng(11)
    feeds = make_case(rng, T=12, in_dim=64, out_dim=96, n_slots=3, r_max=16, ranks=(16,), n_adapters=3)
    ref = multi_lora_ref(*(feeds[n] for n in LORA_INPUTS))
    buf = ort.OrtValue.ortvalue_from_numpy(feeds["base_y"].copy())
    binding = sess.io_binding()
    for name in LORA_INPUTS:
        if name == "base_y":
            binding.bind_ortvalue_input(name, buf)
        else:
            binding.bind_cpu_input(name, feeds[name])
    binding.bind_ortvalue_output("y", buf)
    sess.run_with_iobinding(binding)
    assert_close(buf.numpy(), ref, atol=1e-5, rtol=1e-5, what="y (aliased base_y)")


def _in_graph_model(in_dim, out_dim):
    """base_y = x @ W (a stock MatMul, named token dim T) -> MultiLoRA -> Neg: y is an intermediate whose
    buffer ORT may take from base_y (MayInplace), which it does only when both shapes are known equal."""
    types = {"A": F16, "B": F16, "rank": I32, "token_adapter": I32}
    dims = {"x": ["T", in_dim], "token_adapter": ["T"]}
    inputs = [value_info(n, types.get(n, F32), dims.get(n, r))
              for n, r in zip(LORA_INPUTS, [2, 2, 3, 3, 1, 1, 1]) if n != "base_y"]
    inputs.append(value_info("W", F32, [in_dim, out_dim]))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["base_y"]),
             multi_lora_node(LORA_INPUTS, ["y"]),
             helper.make_node("Neg", ["y"], ["z"])]
    return model(nodes, inputs, [value_info("z", F32, ["T", out_dim])], name="in_graph")


def test_multi_lora_infers_y_shape_from_base_y():
    """y gets base_y's shape, symbolic dims included (what ORT's planner needs to reuse base_y's buffer)."""
    graph = multi_lora_model()
    graph.graph.input[0].CopyFrom(value_info("x", F32, ["T", 8]))
    graph.graph.input[1].CopyFrom(value_info("base_y", F32, ["T", 6]))
    graph.graph.output[0].CopyFrom(value_info("y", F32, None))   # no declared shape: only inference can give one
    out = session(graph).get_outputs()[0]
    assert (out.shape, out.type) == (["T", 6], "tensor(float)")


@pytest.mark.parametrize("T,n_adapters", [(1, 1), (16, 4), (40, 3)])
def test_multi_lora_in_graph_reuse_of_base_y(T, n_adapters):
    """Inside a graph, where ORT hands MultiLoRA base_y's buffer as y: results equal the reference."""
    rng = np.random.default_rng(T)
    feeds = make_case(rng, T=T, in_dim=64, out_dim=96, n_slots=4, r_max=16, ranks=(8, 16), n_adapters=n_adapters)
    W = (rng.standard_normal((64, 96)) / 8).astype(np.float32)
    base_y = feeds["x"] @ W
    ref = multi_lora_ref(*(base_y if n == "base_y" else feeds[n] for n in LORA_INPUTS))
    sess_ = session(_in_graph_model(64, 96), threads=2)
    (z,) = sess_.run(None, {**{n: v for n, v in feeds.items() if n != "base_y"}, "W": W})
    assert_close(-z, ref, atol=1e-4, rtol=1e-4, what="y in graph")


@pytest.mark.parametrize("T", [1, 16, 300])           # 300 x 18 x 960 multiply-adds: the threaded path
@pytest.mark.parametrize("in_dim,block_size", [(576, 32), (576, 128), (64, 16)])   # 576/128: a short last block
@pytest.mark.parametrize("n_adapters", [0, 3])
def test_multi_lora_offsets_term(T, in_dim, block_size, n_adapters):
    """The optional offsets input: y += blocksum(x) @ offsets, with or without adapters on the same call."""
    rng = np.random.default_rng(T + in_dim + block_size + n_adapters)
    feeds = make_case(rng, T=T, in_dim=in_dim, out_dim=960, n_slots=4, r_max=16, ranks=(16, 8),
                      n_adapters=n_adapters)
    feeds["offsets"] = (rng.standard_normal((-(-in_dim // block_size), 960)) * 0.01).astype(np.float16)
    (y,) = session(multi_lora_model(block_size), threads=2).run(None, feeds)
    ref = multi_lora_ref(*(feeds[n] for n in LORA_INPUTS), offsets=feeds["offsets"], block_size=block_size)
    assert_close(y, ref, atol=1e-5, rtol=1e-5, what="y")
