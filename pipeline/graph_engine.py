"""The engine graph: one flattened ragged batch per step over a paged KV pool (runtime/contract.py, "engine").

Per layer, quantized (QLinear, pipeline/graph_qlinear.py):

    x -> QLinear (RMSNorm, q|k|v, +LoRA; three outputs) -> PagedAttention -> QLinear o (+LoRA, + x)
      -> QLinear (RMSNorm, gate|up, +LoRA, SiLU * up) -> QLinear down (+LoRA, + x) -> next layer

fp32 projections (and groups QLinear cannot take: --keep splits, block size 16) use MatMul(NBits) with
ortllm::MultiLoRA after each (adapter per token; the slot stacks are graph inputs, so adapters change
without rebuilding the session) and the residual adds / SiLU * up as plain ops. PagedAttention does RoPE,
the paged KV write and causal GQA over cached + new tokens. The LM head runs only on the
`logits_indices` rows, and gives their argmax (logits_argmax) too. Shapes: T tokens in the step, S sequences,
H hidden, Hq/Hkv heads, D head_dim.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ortllm.runtime import contract as C
from ortllm.runtime.ops_library import op_schema

from .graph_blocks import (activation, add_bias, in_norm, linear_group, lm_head, out_norm, project, qk_norms,
                           rms_norm, rope_tables, scale_embedding, scale_residual, softcap)
from .graph_moe import moe_mlp
from .graph_qlinear import EMBED_TABLE, embedding, qlinear, qlinear_ready
from .onnx_builder import GraphBuilder
from .weights import ModelConfig, ModelWeights, norm_names

F32, F16, I32, I64, U8 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8
GATED = {"swiglu": "silu", "geglu": "gelu_tanh"}   # a gated epilogue -> the activation of its gate (hidden_act)


def lora_projs(g: GraphBuilder, x: str, ws: list[np.ndarray], paths: list[str], layer: int, adapter: str,
               quant=None, layers: int = 1) -> list[str]:
    """Projections of one input (fused base matmul, graph_blocks.project), each followed by its own
    MultiLoRA per token (slot -1 adds nothing), which also adds the base's offset term when the weight is
    in the asymmetric quantized form, and multiplies DoRA rows by their slot's scale (lora.{target}.dora_scale,
    every layer's stack, read at `layer`); the adapter format stays one A/B pair per HF target.

        x -> MatMul | MatMulNBits (q|k|v or gate|up fused) -> Split -> base_i --+
        x -------------------------> MultiLoRA(A_i, B_i, scale, rank, token_adapter [, offsets_i],
                                               lora.dora, dora_scale_i, token_adapter_weight) -> y_i
    """
    outs = []
    for p, w, path in zip(project(g, x, ws, paths, quant), ws, paths):
        target = path.rsplit("/", 1)[1]
        out_dim, in_dim = w.shape
        a = g.input(C.lora_name(layer, target, "a"), F16, ["lora_slots", in_dim, "lora_rank"])
        b = g.input(C.lora_name(layer, target, "b"), F16, ["lora_slots", "lora_rank", out_dim])
        dora = g.input(C.lora_stack_name(target, "dora_scale"), F32, [layers, "lora_slots", out_dim])
        ins = {"x": x, "base_y": p.y, "A": a, "B": b, "scale": C.LORA_SCALE, "rank": C.lora_rank_name(target),
               "token_adapter": adapter, "offsets": p.offsets or "", "dora": C.LORA_DORA, "dora_scale": dora,
               "token_adapter_weight": C.TOKEN_ADAPTER_WEIGHT}
        attrs = {"packed_a": 1, "lora_layer": layer} | ({"block_size": p.block_size} if p.offsets else {})
        outs.append(g.op("MultiLoRA", op_schema("MultiLoRA").node_inputs(ins), f"{path}/lora", domain=C.OPS_DOMAIN,
                         **attrs))
    return outs


def projections(g: GraphBuilder, x: str, ws: list[np.ndarray], paths: list[str], layer: int, adapter: str,
                quant=None, epilogue: str = "none", residual: str | None = None,
                norm: tuple[np.ndarray, float, str] | None = None, layers: int = 1) -> list[str]:
    """Projections of one input with their LoRA, the norm before them (norm = (weight, eps, path)) and an
    epilogue ("none": one output per path; "residual": residual + y; "swiglu": SiLU(gate) * up; "geglu":
    GELU-tanh(gate) * up), as one QLinear where it can take them (its LoRA stacks hold all `layers` layers), else as
    plain ops and lora_projs (adapter None: no LoRA, linear_group alone):

        QLinear:   x -> QLinear(norm, epilogue) [-> q, k, v as its split outputs]
        otherwise: x [-> RMSNorm] -> lora_projs -> [Add(residual, y) | Mul(activation(gate), up)]
    """
    path = paths[0].rsplit("/", 1)[0]
    if qlinear_ready(quant, paths):
        y = qlinear(g, x, ws, paths, quant, lora={"layer": layer, "layers": layers, "adapter": adapter},
                    epilogue=epilogue, residual=residual, norm=norm, split=epilogue == "none",
                    act16=quant.act16_for(paths))
        return list(y) if isinstance(y, list) else [y]
    if norm is not None:
        x = rms_norm(g, x, norm[0], norm[1], norm[2])
    if adapter is None:       # a graph without adapters (graph_stages: the layer-by-layer fp32 reference)
        ys = linear_group(g, x, ws, paths, quant)
    else:
        ys = lora_projs(g, x, ws, paths, layer, adapter, quant, layers)
    if epilogue == "residual":
        return [g.op("Add", [residual, ys[0]], f"{path}/residual")]
    if epilogue in GATED:
        gate, up = ys
        return [g.op("Mul", [activation(g, gate, GATED[epilogue], f"{path}/act"), up], f"{path}/act_up")]
    return ys


def attention(g: GraphBuilder, cfg: ModelConfig, x: str, w: dict, i: int, batch: dict, kv: str,
              block_size: int, quant=None, kv_rotate: bool = True) -> str:
    """x + attention(input_layernorm(x)): PagedAttention over the pool, o_proj adding the residual x; the cache
    outputs are graph outputs that the runtime aliases to the inputs. The family's features: q/k/v biases and
    q/k norms (per head, or over the whole projection) as plain ops between the projections and PagedAttention, the
    layer type's RoPE tables, the softmax scale, a sliding layer's window, and an output norm or a residual
    multiplier before the residual add (then o_proj adds nothing); gpt-oss's attention sinks (PagedAttention's
    input) and o_proj bias (added to the residual).

        x -> input_layernorm -> q|k|v_proj (+lora) -> q, k, v [+ biases] [-> q/k RMSNorm] -> PagedAttention
                                     (positions, cu_seqlens, context_lens, block_tables, cos, sin,
                                      key/value cache [, scales]) -> attn [T, Hq*D] -> o_proj(+lora) + x
                                                          [or -> o_proj [-> RMSNorm] [-> * m] -> + x]
    """
    path, p = f"/model/layers.{i}/attn", f"model.layers.{i}.self_attn"
    targets = ("q_proj", "k_proj", "v_proj")
    q, k, v = projections(g, x, [w[f"{p}.{t}.weight"] for t in targets], [f"{path}/{t}" for t in targets], i,
                          batch["adapter"], quant, norm=in_norm(cfg, w, i, "attn_in"), layers=cfg.num_layers)
    q, k, v = (add_bias(g, y, w, f"{p}.{t}.bias", f"{path}/{t}") for y, t in zip((q, k, v), targets))
    q, k = qk_norms(g, cfg, q, k, w, p, path)
    quantized = C.kv_scaled(C.KV_DTYPES[kv])     # codes with fp16 scales (int8, fp8, int4), Hadamard-rotated
    cache_type = U8 if quantized else F16 if kv == "fp16" else F32
    shape = ["num_blocks", cfg.num_kv_heads, block_size, C.kv_row_elems(C.KV_DTYPES[kv], cfg.head_dim)]
    caches, outs = {}, []
    for kind in C.cache_kinds(quantized):     # inputs: every layer's caches, one a kind; outputs: this layer's slice
        dtype, shp = (cache_type, shape) if kind.endswith("cache") else (F16, shape[:3])  # fp16 scales
        caches[kind] = g.input(C.cache_name(kind), dtype, [cfg.num_layers, *shp])
        outs.append(C.cache_out_name(kind, i))
        g.output(outs[-1], dtype, shp)
    cos, sin = batch["rope"][cfg.layer_types[i]]
    ins = {"q": q, "k": k, "v": v, "positions": batch["positions"], "cu_seqlens": batch["cu_seqlens"],
           "context_lens": batch["context_lens"], "block_tables": batch["block_tables"], "cos_cache": cos,
           "sin_cache": sin} | caches
    if cfg.attention_sinks:        # gpt-oss: a logit per query head in each softmax's denominator
        ins["sinks"] = g.weight(f"{p}.sinks", w[f"{p}.sinks"].astype(np.float32))
    res = g.op("PagedAttention", op_schema("PagedAttention").node_inputs(ins), f"{path}/paged",
               n_out=1 + len(caches), domain=C.OPS_DOMAIN,
               num_heads=cfg.num_heads, kv_num_heads=cfg.num_kv_heads, head_size=cfg.head_dim,
               block_size=block_size, kv_dtype=C.KV_DTYPES[kv], rotate=int(quantized and kv_rotate), layer=i,
               scale=float(cfg.softmax_scale), **_window(cfg, i))
    for src, dst in zip(res[1:], outs):
        g.identity(src, dst, f"{path}/{dst}")
    return _residual(g, cfg, w, x, res[0], [w[f"{p}.o_proj.weight"]], [f"{path}/o_proj"], i, batch["adapter"], quant,
                     "attn_out", bias=f"{p}.o_proj.bias" if cfg.o_proj_bias else None)


def _window(cfg: ModelConfig, i: int) -> dict:
    """PagedAttention's sliding window of layer i (ops ABI 10), none on full-attention layers."""
    return {"window": int(cfg.sliding_window)} if cfg.layer_types[i] == "sliding" else {}


def _residual(g: GraphBuilder, cfg: ModelConfig, w: dict, x: str, h: str, ws: list, paths: list[str], i: int,
              adapter: str, quant, role: str, bias: str | None = None) -> str:
    """x + proj(h) [+ the projection's bias `bias`, a tensor name]: the projection adds the residual itself
    (epilogue; a bias is added to the residual first, x + b + proj(h)), or, where the family norms the block's
    output first (role attn_out | mlp_out) or scales it (residual_multiplier), proj [+ b] [-> RMSNorm] [-> * m] ->
    Add."""
    if norm_names(cfg)[role] is None and cfg.residual_multiplier == 1.0:
        if bias is not None:
            x = add_bias(g, x, w, bias, paths[0])
        return projections(g, h, ws, paths, i, adapter, quant, "residual", x, layers=cfg.num_layers)[0]
    y = projections(g, h, ws, paths, i, adapter, quant, layers=cfg.num_layers)[0]
    if bias is not None:
        y = add_bias(g, y, w, bias, paths[0])
    path = paths[0].rsplit('/', 1)[0]
    return g.op("Add", [x, scale_residual(g, out_norm(g, cfg, w, y, i, role), cfg, path)], f"{path}/residual")


def mlp(g: GraphBuilder, cfg: ModelConfig, x: str, w: dict, i: int, adapter: str, quant=None) -> str:
    """x + down(act(gate(h)) * up(h)), h = the MLP's input norm of x, each projection with its LoRA; act(gate) * up
    fused into the gate|up projection (epilogue "swiglu" for SiLU, "geglu" for GELU-tanh). A sparse layer's MLP is the
    mixture of experts (graph_moe.moe_mlp, no LoRA).

        x -> RMSNorm -> gate|up_proj (+lora, act(gate) * up) -> down_proj (+lora) + x   [down_proj -> RMSNorm -> + x]
    """
    if cfg.sparse_layer(i):
        return moe_mlp(g, cfg, x, w, i, quant)
    path, p = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
    ws, paths = [w[f"{p}.gate_proj.weight"], w[f"{p}.up_proj.weight"]], [f"{path}/gate_proj", f"{path}/up_proj"]
    norm = in_norm(cfg, w, i, "mlp_in")
    epilogue = next(e for e, act in GATED.items() if act == cfg.hidden_act)
    act = projections(g, x, ws, paths, i, adapter, quant, epilogue, norm=norm, layers=cfg.num_layers)[0]
    return _residual(g, cfg, w, x, act, [w[f"{p}.down_proj.weight"]], [f"{path}/down_proj"], i, adapter, quant,
                     "mlp_out")


def head(g: GraphBuilder, x: str, weights: ModelWeights, embed: str, quant=None) -> tuple[str, str]:
    """[S, H] -> final norm -> logits [S, V] and their argmax [S] (each row's first maximum): QLinear (norm fused)
    finding the argmax too on a quantized head it can take, else RMSNorm, graph_blocks.lm_head (embed: the fp32
    table's initializer, which a tied fp32 head multiplies by) and ArgMax."""
    cfg = weights.config
    norm = (weights.tensors["model.norm.weight"], cfg.rms_norm_eps, "/model/norm")
    if qlinear_ready(quant, ["/lm_head"]):
        logits, argmax = qlinear(g, x, [weights.lm_head()], ["/lm_head"], quant, norm=norm, argmax=True, act16=True)
        return softcap(g, logits, cfg), argmax          # a monotonic cap: the argmax stays
    logits = softcap(g, lm_head(g, rms_norm(g, x, *norm), weights, embed, quant), cfg)
    return logits, g.op("ArgMax", [logits], "/lm_head", axis=1, keepdims=0)


def hidden_states(g: GraphBuilder, x: str, rows: str, out: str, weights: ModelWeights) -> None:
    """The final norm's output on the embedding rows, [E, H] (E = 0 in generation steps: no rows, next to no
    cost). Its own norm node: a quantized head's QLinear fuses the final norm and never writes it out.

        x [T, H] -> Gather(hidden_indices) [E, H] -> RMSNorm (model.norm) -> hidden_states
    """
    cfg = weights.config
    h = g.op("Gather", [x, rows], "/model/hidden_rows", axis=0)
    h = rms_norm(g, h, weights.tensors["model.norm.weight"], cfg.rms_norm_eps, "/model/hidden_norm")
    g.identity(h, out, "/model/hidden_states")


def build_engine_graph(weights: ModelWeights, model_path, data_path, kv: str = "fp32", block_size: int = 16,
                       metadata: dict | None = None, quant=None, kv_rotate: bool = True) -> None:
    """quant: a pipeline.quantize.QuantPlan (None: fp32 projections); kv_rotate: Hadamard rotation of 8-bit KV."""
    cfg, w = weights.config, weights.tensors
    g = GraphBuilder(data_path, extra_opsets={C.OPS_DOMAIN: 1})
    ids = g.input(C.ENGINE_INPUT_IDS, I64, ["T"])
    batch = {
        "positions": g.input(C.POSITIONS, I32, ["T"]),
        "cu_seqlens": g.input(C.CU_SEQLENS, I32, ["S_plus_1"]),
        "context_lens": g.input(C.CONTEXT_LENS, I32, ["S"]),
        "block_tables": g.input(C.BLOCK_TABLES, I32, ["S", "max_blocks"]),
    }
    logits_rows = g.input(C.LOGITS_INDICES, I64, ["S"])
    batch["adapter"] = g.input(C.TOKEN_ADAPTER, I32, ["T", "adapter_terms"])    # a token's mix: slots, weights
    g.input(C.TOKEN_ADAPTER_WEIGHT, F32, ["T", "adapter_terms"])
    hidden_rows = g.input(C.HIDDEN_INDICES, I64, ["E"])
    g.input(C.LORA_SCALE, F32, ["lora_slots"])
    g.input(C.LORA_DORA, I32, ["lora_slots"])
    for target in C.LORA_TARGETS:      # per target: an adapter's rank is 0 on the targets it leaves alone
        g.input(C.lora_rank_name(target), I32, ["lora_slots"])
    logits_out = g.output(C.LOGITS, F32, ["S", cfg.vocab_size])
    argmax_out = g.output(C.LOGITS_ARGMAX, I64, ["S"])
    hidden_out = g.output(C.HIDDEN_STATES, F32, ["E", cfg.hidden_size])
    batch["rope"] = {kind: tuple(g.weight(f"model.rope.{kind}.{f}", t) for f, t in zip(
        ("cos", "sin"), rope_tables(cfg, kind))) for kind in dict.fromkeys(cfg.layer_types)}

    x = scale_embedding(g, embedding(g, ids, w[EMBED_TABLE], quant), cfg)     # [T, H]
    for i in range(cfg.num_layers):
        x = attention(g, cfg, x, w, i, batch, kv, block_size, quant, kv_rotate)
        x = mlp(g, cfg, x, w, i, batch["adapter"], quant)

    hidden_states(g, x, hidden_rows, hidden_out, weights)
    # Only the rows that need logits: [S, H] -> norm -> LM head [S, V]
    x = g.op("Gather", [x, logits_rows], "/model/logits_rows", axis=0)
    logits, argmax = head(g, x, weights, EMBED_TABLE, quant)
    g.identity(logits, logits_out, "/lm_head/logits")
    g.identity(argmax, argmax_out, "/lm_head/argmax")
    g.save(model_path, "ortllm_engine", doc="ortllm engine graph (paged KV, QLinear, multi-LoRA)", metadata=metadata)
