"""ONNX graphs of ortllm's custom ops outside an engine artifact, for the op benches (bench/ops.py, bench/qlinear.py,
bench/timing.py), the probes (bench/probes/) and the op tests (tests/custom_ops/): the model wrapper (opsets, IR
version), each op's inputs and outputs (names, types, ranks) and its one-node graph, PagedAttention's inputs over a
paged pool, and a session with the ops library registered. bench/ owns it because the ops scenario and the probes
build their graphs here and bench never imports tests/ (tests/test_layering.py); the tests import it from here.

The engine's own graphs come from pipeline/graph_blocks.py; these are the ops alone, with every input a graph
input so a caller feeds or binds whatever it likes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ortllm.runtime.ops_library import register_ops

F32, F16, I32, I64, U8, I8 = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64,
                              TensorProto.UINT8, TensorProto.INT8)
OPSET, IR_VERSION = 17, 10

PA_INPUTS = ["q", "k", "v", "positions", "cu_seqlens", "context_lens", "block_tables",
             "cos_cache", "sin_cache", "key_cache", "value_cache", "key_scales", "value_scales", "sinks"]
PA_OUTPUTS = ["attn", "key_cache_out", "value_cache_out", "key_scales_out", "value_scales_out"]
LORA_INPUTS = ["x", "base_y", "A", "B", "scale", "rank", "token_adapter"]
QLINEAR_INPUTS = ["x", "codes", "scales", "offsets", "residual", "token_adapter", "lora_scale",
                  *(f"{n}{j}" for j in range(3) for n in ("A", "A_scale", "B", "B_scale", "rank")), "norm_weight",
                  "dora", "dora_scale0", "dora_scale1", "dora_scale2", "token_adapter_weight"]
QLINEAR_TYPES = [F32, U8, F16, F16, F32, I32, F32, *[I8, F16, I8, F16, I32] * 3, F32, I32, F32, F32, F32, F32]
QLINEAR_RANKS = [2, 3, 3, 3, 2, 1, 1, *[3, 3, 3, 2, 1] * 3, 1, 1, 2, 2, 2, 2]
MIX_INPUTS = ("token_adapter", "token_adapter_weight")   # [T] or [T, M] (adapter mixes): no declared rank


# ---------------------------------------------------------------- graphs and sessions

def model(nodes, inputs, outputs, initializers=(), domains=("ortllm",), name: str | None = None) -> onnx.ModelProto:
    """A model of `nodes` at opset 17 plus version 1 of each custom domain (ortllm, com.microsoft) it uses."""
    nodes = list(nodes)
    graph = helper.make_graph(nodes, name or nodes[0].op_type, inputs, outputs, initializer=list(initializers))
    out = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]
                            + [helper.make_opsetid(d, 1) for d in domains])
    out.ir_version = IR_VERSION
    return out


def value_info(name: str, dtype: int, shape) -> onnx.ValueInfoProto:
    """shape: a rank (every dim unnamed), a list of dims (ints, names, None) or None (no declared shape)."""
    return helper.make_tensor_value_info(name, dtype, [None] * shape if isinstance(shape, int) else shape)


def session(graph: onnx.ModelProto | bytes, threads: int = 1, *, library: Path | None = None,
            spinning: bool = True, isa: str | None = None) -> ort.InferenceSession:
    """A CPU session with libortllm_ops.so registered (library: another build of it). spinning=False: idle
    intra-op workers sleep, for benches that keep several sessions side by side (a spinning pool steals the cores
    from whichever session is being timed); True is ORT's default, the engine's setting. isa: the ops' kernel path
    (ops_library.ops_isas()); None: the default, or what ops_library.sessions_on set."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    register_ops(so, library, isa=isa)
    data = graph if isinstance(graph, bytes) else graph.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------- PagedAttention

def paged_attention_node(inputs, outputs, name: str | None = None, **attrs) -> onnx.NodeProto:
    """attrs: num_heads, kv_num_heads, head_size, block_size, kv_dtype, and the optional ones (layer, window, ...)."""
    return helper.make_node("PagedAttention", inputs, outputs, name=name, domain="ortllm", **attrs)


def paged_attention_model(*, num_heads, kv_num_heads, head_size, block_size, kv_dtype="float32", sinks=False,
                          **attrs) -> onnx.ModelProto:
    """One PagedAttention node; caches of codes (int8, fp8, int4) get the scale inputs/outputs, float32 and float16
    ones do not; with attribute `layer` the cache inputs are every layer's ([n_layers, ...]) and the outputs one
    layer's; sinks: the optional input `sinks` [H] too (attention sinks)."""
    eight_bit = kv_dtype not in ("float32", "float16")
    cache_t = U8 if eight_bit else F16 if kv_dtype == "float16" else F32
    n_in, n_out = (13, 5) if eight_bit else (11, 3)
    types = [F32, F32, F32, I32, I32, I32, I32, F32, F32, cache_t, cache_t, F16, F16, F32]   # scales: float16
    lead = int(attrs.get("layer", -1) >= 0)
    ranks = [2, 2, 2, 1, 1, 1, 2, 2, 2, 4 + lead, 4 + lead, 3 + lead, 3 + lead, 1]
    present = list(range(n_in)) + ([13] if sinks else [])
    inputs = [value_info(PA_INPUTS[i], types[i], ranks[i]) for i in present]
    names = [n if i in present else "" for i, n in enumerate(PA_INPUTS[:present[-1] + 1])]
    out_types = [(F32, 2), (cache_t, 4), (cache_t, 4), (F16, 3), (F16, 3)]
    outputs = [value_info(n, t, r) for n, (t, r) in list(zip(PA_OUTPUTS, out_types))[:n_out]]
    node = paged_attention_node(names, PA_OUTPUTS[:n_out], num_heads=num_heads,
                                kv_num_heads=kv_num_heads, head_size=head_size, block_size=block_size,
                                kv_dtype=kv_dtype, **attrs)
    return model([node], inputs, outputs)


def rope_cache(max_pos: int, head_size: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [max_pos, D/2] (llama: inv_freq = theta^(-2i/D)), PagedAttention's inputs."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def paged_attention_case(rng, seqs, *, num_heads, kv_num_heads, head_size, block_size, kv_dtype="float32",
                         spare_blocks=3) -> dict:
    """PagedAttention's feeds (name -> array) for a ragged batch: seqs = [(context_len, new_tokens), ...] per
    sequence, their blocks scattered over a pool of their blocks plus `spare_blocks`; the caches hold random values
    (float32, float16) or random codes (int8: -127..127, int4: two codes 1..15 a byte, fp8_e4m3: any finite code)
    with scales in 0.002..0.03."""
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
    if kv_dtype in ("float32", "float16"):
        feeds["key_cache"] = rng.standard_normal(shape, dtype=np.float32).astype(kv_dtype)
        feeds["value_cache"] = rng.standard_normal(shape, dtype=np.float32).astype(kv_dtype)
    else:
        def codes() -> np.ndarray:
            if kv_dtype == "int8":
                return rng.integers(-127, 128, shape).astype(np.int8).view(np.uint8)
            if kv_dtype == "int4":   # two codes a byte, each -7..7 stored as 1..15: [NB, Hkv, BS, D/2]
                packed = shape[:3] + (D // 2,)
                return (rng.integers(1, 16, packed) | rng.integers(1, 16, packed) << 4).astype(np.uint8)
            finite = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)   # fp8 e4m3 but its NaNs
            return rng.choice(finite, shape)

        feeds["key_cache"], feeds["value_cache"] = codes(), codes()
        feeds["key_scales"] = rng.uniform(0.002, 0.03, shape[:3]).astype(np.float16)
        feeds["value_scales"] = rng.uniform(0.002, 0.03, shape[:3]).astype(np.float16)
    return feeds


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


# ---------------------------------------------------------------- MultiLoRA

def multi_lora_node(inputs, outputs, name: str | None = None, **attrs) -> onnx.NodeProto:
    return helper.make_node("MultiLoRA", inputs, outputs, name=name, domain="ortllm", **attrs)


def multi_lora_model(block_size: int | None = None, packed_a: bool = False, mix: bool = False) -> onnx.ModelProto:
    """One MultiLoRA node (A, B fp16); with block_size, also the optional offsets input [k_blocks, out] fp16;
    packed_a: the attribute (slot s of A is a row-major [in, rank[s]] matrix); mix: token_adapter of any rank ([T]
    or [T, M]) and input 10, token_adapter_weight, of the same shape."""
    names = LORA_INPUTS + (["offsets"] if block_size is not None else [])
    types = [F32, F32, F16, F16, F32, I32, I32, F16]
    ranks = [2, 2, 3, 3, 1, 1, None if mix else 1, 2]
    inputs = [value_info(n, t, r) for n, t, r in zip(names, types, ranks)]
    if mix:
        names = names + [""] * (10 - len(names)) + ["token_adapter_weight"]
        inputs.append(value_info("token_adapter_weight", F32, None))
    attrs = ({"block_size": block_size} if block_size else {}) | ({"packed_a": 1} if packed_a else {})
    return model([multi_lora_node(names, ["y"], **attrs)], inputs, [value_info("y", F32, 2)])


# ---------------------------------------------------------------- QLinear

def qlinear_node(inputs, outputs, name: str | None = None, **attrs) -> onnx.NodeProto:
    """inputs in QLINEAR_INPUTS order, "" for an optional input left out; attrs: K, N, bits, block_size, ..."""
    return helper.make_node("QLinear", inputs, outputs, name=name, domain="ortllm", **attrs)


def qlinear_model(present: list[str], n_outputs: int = 1, argmax: bool = False, **attrs) -> onnx.ModelProto:
    """One QLinear node; `present` names the inputs fed (the others are left out as ONNX optional inputs);
    n_outputs > 1: outputs y, y1, y2 (attribute split); argmax: output 3, "argmax" [T] int64, after them. The
    LoRA stacks' and DoRA scales' graph inputs have no declared rank (one layer's, or every layer's with attribute
    lora_layer)."""
    names = [n if n in present else "" for n in QLINEAR_INPUTS]
    while names and not names[-1]:
        names.pop()
    inputs = [value_info(n, t, None if n.rstrip("012") in ("A", "A_scale", "B", "B_scale", "dora_scale")
                         or n in MIX_INPUTS else r)
              for n, t, r in zip(QLINEAR_INPUTS, QLINEAR_TYPES, QLINEAR_RANKS) if n in present]
    out_names = ["y", "y1", "y2"][:n_outputs]
    outputs = [value_info(n, F32, 2) for n in out_names]
    if argmax:
        out_names = out_names + [""] * (3 - n_outputs) + ["argmax"]
        outputs.append(value_info("argmax", I64, 1))
    return model([qlinear_node(names, out_names, **attrs)], inputs, outputs)


# ---------------------------------------------------------------- MoE

MOE_INPUTS = ["x", "expert", "weight", "gate_up_codes", "gate_up_scales", "gate_up_offsets", "down_codes",
              "down_scales", "down_offsets", "gate_up_bias", "down_bias"]
MOE_TYPES = [F32, I64, F32, U8, F16, F16, U8, F16, F16, F32, F32]
MOE_RANKS = [2, 2, 2, 4, 4, 4, 4, 4, 4, 2, 2]


def moe_node(inputs, outputs, name: str | None = None, **attrs) -> onnx.NodeProto:
    """inputs in MOE_INPUTS order, "" for an optional input left out; attrs: H, I, E, bits, block_size, and the
    optional activation, alpha, limit."""
    return helper.make_node("MoE", inputs, outputs, name=name, domain="ortllm", **attrs)


def moe_model(present: list[str], **attrs) -> onnx.ModelProto:
    """One MoE node; `present` names the inputs fed (the offsets and biases may be left out)."""
    names = [n if n in present else "" for n in MOE_INPUTS]
    while names and not names[-1]:
        names.pop()
    inputs = [value_info(n, t, r) for n, t, r in zip(MOE_INPUTS, MOE_TYPES, MOE_RANKS) if n in present]
    return model([moe_node(names, ["y"], **attrs)], inputs, [value_info("y", F32, 2)])
