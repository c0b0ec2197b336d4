"""Bad inputs make onnxruntime raise with a message naming the input and the bad value; the op never
reads or writes out of bounds (the ASan run of this file checks the latter)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto

from ortllm.bench.op_graphs import multi_lora_model, paged_attention_case, paged_attention_model, session
from tests.custom_ops.conftest import SCENARIOS
from tests.custom_ops.test_multi_lora import make_case as lora_case

ATTRS = dict(num_heads=9, kv_num_heads=3, head_size=64, block_size=16)


@pytest.fixture(scope="module")
def pa_sess():
    return session(paged_attention_model(**ATTRS))


@pytest.fixture(scope="module")
def pa8_sess():
    return session(paged_attention_model(**ATTRS, kv_dtype="int8"))


@pytest.fixture(scope="module")
def lora_sess():
    return session(multi_lora_model())


def pa_feeds(kv_dtype="float32"):
    return paged_attention_case(np.random.default_rng(0), SCENARIOS["mixed"], **ATTRS, kv_dtype=kv_dtype)


def expect_error(sess, feeds, *patterns):
    with pytest.raises(Exception) as info:
        sess.run(None, feeds)
    msg = str(info.value)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in: {msg}"


def test_q_wrong_width(pa_sess):
    f = pa_feeds()
    f["q"] = f["q"][:, :500].copy()
    expect_error(pa_sess, f, r"input 'q' has shape \[62, 500\], expected \[62, 576\]")


def test_k_wrong_token_count(pa_sess):
    f = pa_feeds()
    f["k"] = f["k"][:-1].copy()
    expect_error(pa_sess, f, r"input 'k' has shape \[61, 192\], expected \[62, 192\]")


def test_value_cache_shape_differs(pa_sess):
    f = pa_feeds()
    f["value_cache"] = f["value_cache"][:-1].copy()
    expect_error(pa_sess, f, r"input 'value_cache' has shape")


def test_block_id_out_of_range(pa_sess):
    f = pa_feeds()
    nb = f["key_cache"].shape[0]
    f["block_tables"][2, 1] = nb
    expect_error(pa_sess, f, rf"'block_tables'\[2\]\[1\] = {nb} is not a block id in \[0, num_blocks = {nb}\)")


def test_negative_block_id(pa_sess):
    f = pa_feeds()
    f["block_tables"][0, 0] = -3
    expect_error(pa_sess, f, r"'block_tables'\[0\]\[0\] = -3")


def test_too_few_block_table_columns(pa_sess):
    f = pa_feeds()
    f["block_tables"] = f["block_tables"][:, :2].copy()
    expect_error(pa_sess, f, r"sequence 2 needs 4 blocks .* 'block_tables' has 2 columns")


def test_position_past_rope_cache(pa_sess):
    f = pa_feeds()
    rows = f["cos_cache"].shape[0]
    f["positions"][5] = rows
    expect_error(pa_sess, f, rf"'positions'\[5\] = {rows} is outside the rope cache")


def test_cu_seqlens_total_differs_from_T(pa_sess):
    f = pa_feeds()
    f["cu_seqlens"][-1] = 61
    expect_error(pa_sess, f, r"'cu_seqlens'\[4\] = 61 must equal the number of tokens T = 62")


def test_cu_seqlens_decreasing(pa_sess):
    f = pa_feeds()
    f["cu_seqlens"][2] = 0
    expect_error(pa_sess, f, r"'cu_seqlens'\[2\] = 0 is less than cu_seqlens\[1\]")


def test_negative_context_len(pa_sess):
    f = pa_feeds()
    f["context_lens"][1] = -1
    expect_error(pa_sess, f, r"'context_lens'\[1\] = -1 is negative")


def test_8bit_scales_shape(pa8_sess):
    f = pa_feeds("int8")
    f["key_scales"] = f["key_scales"][:, :, :8].copy()
    expect_error(pa8_sess, f, r"input 'key_scales' has shape \[\d+, 3, 8\], expected \[\d+, 3, 16\]")


def test_8bit_float32_scales_are_rejected_by_ort():
    """Scales are float16 (ops ABI 4): a graph declaring float32 scales (contract version <= 3) is refused."""
    model = paged_attention_model(**ATTRS, kv_dtype="int8")
    model.graph.input[11].type.tensor_type.elem_type = TensorProto.FLOAT
    with pytest.raises(Exception, match=r"tensor\(float\)' of input parameter \(key_scales\)"):
        session(model)


def test_kv_dtype_and_cache_type_disagree():
    # same graph but the attribute says int8 while the cache tensors are float32
    model = paged_attention_model(**ATTRS, kv_dtype="float32")
    for a in model.graph.node[0].attribute:
        if a.name == "kv_dtype":
            a.s = b"int8"
    sess = session(model)
    expect_error(sess, pa_feeds(), r"kv_dtype = 'int8' needs uint8 key_cache/value_cache tensors; got float32")


def test_float16_kv_dtype_with_float32_caches():
    # kv_dtype float16 needs float16 cache tensors, not the float32 ones of this graph
    model = paged_attention_model(**ATTRS, kv_dtype="float32")
    for a in model.graph.node[0].attribute:
        if a.name == "kv_dtype":
            a.s = b"float16"
    expect_error(session(model), pa_feeds(), r"kv_dtype = 'float16' needs float16 key_cache/value_cache tensors")


def test_unknown_kv_dtype():
    model = paged_attention_model(**ATTRS)
    for a in model.graph.node[0].attribute:
        if a.name == "kv_dtype":
            a.s = b"int2"
    expect_error(session(model), pa_feeds(), r"kv_dtype = 'int2' is not float32, float16, int8, fp8_e4m3 or int4")


def test_int4_cache_with_unpacked_rows():
    """An int4 cache holds two codes a byte: [NB, Hkv, BS, D/2]; one shaped like an int8 cache is named."""
    feeds = paged_attention_case(np.random.default_rng(0), SCENARIOS["mixed"], **ATTRS, kv_dtype="int8")
    expect_error(session(paged_attention_model(**ATTRS, kv_dtype="int4")), feeds,
                 r"input 'key_cache' has shape \[\d+, 3, 16, 64\], expected \[\d+, 3, 16, 32\]")


def test_heads_not_divisible():
    model = paged_attention_model(num_heads=9, kv_num_heads=4, head_size=64, block_size=16)
    expect_error(session(model), pa_feeds(), r"num_heads = 9, kv_num_heads = 4")


def test_positions_wrong_dtype_is_rejected_by_ort():
    model = paged_attention_model(**ATTRS)
    model.graph.input[3].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(Exception, match=r"positions"):
        session(model)


# ---- MultiLoRA

def lora_feeds():
    return lora_case(np.random.default_rng(1), T=8, in_dim=32, out_dim=48, n_slots=3, r_max=16,
                     ranks=(16, 8), n_adapters=3)


def test_adapter_index_out_of_range(lora_sess):
    f = lora_feeds()
    f["token_adapter"][4] = 3
    expect_error(lora_sess, f, r"'token_adapter'\[4\] = 3 is not -1 or a slot in \[0, 3\)")


def test_adapter_index_below_minus_one(lora_sess):
    f = lora_feeds()
    f["token_adapter"][0] = -2
    expect_error(lora_sess, f, r"'token_adapter'\[0\] = -2")


def test_rank_above_r_max(lora_sess):
    f = lora_feeds()
    f["rank"][1] = 17
    expect_error(lora_sess, f, r"'rank'\[1\] = 17 is outside \[0, r_max = 16\]")


def test_lora_in_dim_mismatch(lora_sess):
    f = lora_feeds()
    f["A"] = f["A"][:, :31].copy()
    expect_error(lora_sess, f, r"input 'A' has shape \[3, 31, 16\], expected \[3, 32, 16\]")


def test_lora_out_dim_mismatch(lora_sess):
    f = lora_feeds()
    f["B"] = f["B"][:, :, :40].copy()
    expect_error(lora_sess, f, r"input 'B' has shape \[3, 16, 40\], expected \[3, 16, 48\]")


def test_lora_token_count_mismatch(lora_sess):
    f = lora_feeds()
    f["token_adapter"] = f["token_adapter"][:5].copy()
    expect_error(lora_sess, f, r"input 'token_adapter' has shape \[5\], expected \[8\]")


def test_lora_offsets_shape_mismatch():
    f = lora_feeds()
    f["offsets"] = np.zeros((3, 48), np.float16)                  # in 32 / block 16 = 2 blocks
    expect_error(session(multi_lora_model(16)), f, r"input 'offsets' has shape \[3, 48\], expected \[2, 48\]")


def test_lora_offsets_without_block_size():
    f = lora_feeds()
    f["offsets"] = np.zeros((2, 48), np.float16)
    model = multi_lora_model(16)
    del model.graph.node[0].attribute[:]
    expect_error(session(model), f, r"input 'offsets' needs attribute block_size > 0; got block_size = 0")


def test_lora_adapter_dtype_is_rejected_by_ort():
    model = multi_lora_model()
    model.graph.input[6].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(Exception, match=r"token_adapter"):
        session(model)


def test_lora_fp32_stacks_are_rejected_by_ort():
    """A and B are fp16: a graph (e.g. an artifact of contract version 1) declaring them float is refused."""
    model = multi_lora_model()
    model.graph.input[2].type.tensor_type.elem_type = TensorProto.FLOAT
    with pytest.raises(Exception, match=r"tensor\(float\)' of input parameter \(A\)"):
        session(model)


def test_empty_batch_is_fine(pa_sess, lora_sess):
    """T = 0 tokens from S = 0 sequences (an idle engine step): empty output, cache untouched."""
    f = pa_feeds()
    f.update(q=f["q"][:0], k=f["k"][:0], v=f["v"][:0], positions=f["positions"][:0],
             cu_seqlens=np.zeros(1, np.int32), context_lens=f["context_lens"][:0],
             block_tables=f["block_tables"][:0])
    attn, kc, vc = pa_sess.run(None, f)
    assert attn.shape == (0, 9 * 64)
    np.testing.assert_array_equal(kc, f["key_cache"])
    g = lora_feeds()
    g.update(x=g["x"][:0], base_y=g["base_y"][:0], token_adapter=g["token_adapter"][:0])
    (y,) = lora_sess.run(None, g)
    assert y.shape == (0, 48)
