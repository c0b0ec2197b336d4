"""The mixture-of-experts MLP of a sparse layer (ModelConfig.num_experts, sparse_layer) for the engine graph.

    x -> RMSNorm -> h [T, H] -> router: h @ mlp.gate^T [+ bias] [T, E] -> weights [T, k], expert ids [T, k]
      (moe_router) -> experts (SwiGLU, or gpt-oss's clamped SwiGLU with the experts' biases):
                  quantized, one ortllm::MoE (tokens grouped by expert; custom_ops/src/kernels/moe.h);
                  fp32, every expert on every token as batched MatMuls, weighted by the dense [T, E] routing weights
      [+ shared expert(h): a dense SwiGLU FFN on every token (QLinear gate|up swiglu -> QLinear down, or MatMuls)
                           [* sigmoid(h @ mlp.shared_expert_gate^T [T, 1])]]
      -> [RMSNorm ->] [* residual_multiplier ->] + x

The router stays fp32 (E x H weights, and the choice of experts must not move with the quantization). The experts
carry no LoRA: adapters stay on the attention projections.
"""
from __future__ import annotations

import numpy as np

from ortllm.runtime import contract as C
from ortllm.runtime.ops_library import op_schema

from .errors import BuildError
from .graph_blocks import activation, in_norm, linear, linear_group, out_norm, rms_norm, scale_residual
from .graph_qlinear import qlinear, qlinear_ready
from .onnx_builder import GraphBuilder
from .qlinear_pack import pack, stack_experts
from .quant_grid import MXFP4
from .quantize import QuantizedWeight, hf_name
from .weights import ModelConfig, norm_names

PROJS = ("gate_proj", "up_proj", "down_proj")


def router(g: GraphBuilder, cfg: ModelConfig, h: str, gate: np.ndarray, path: str,
           bias: np.ndarray | None = None) -> tuple[str, str]:
    """h [T, H] (+ bias [E]) -> (weights [T, k] f32, expert ids [T, k] i64), as transformers' routers compute them:
    softmax_topk: Softmax over the E logits, TopK (then / their sum with norm_topk_prob); topk_softmax: TopK of the
    logits, Softmax over those k."""
    logits = g.op("MatMul", [h, g.weight(f"{path}/gate.weight", np.ascontiguousarray(gate.T))], f"{path}/gate")
    if bias is not None:        # gpt-oss's router bias
        logits = g.op("Add", [logits, g.weight(f"{path}/gate.bias", bias)], f"{path}/gate")
    k = g.const([cfg.num_experts_per_tok])
    if cfg.moe_router == "topk_softmax":
        top, ids = g.op("TopK", [logits, k], f"{path}/topk", n_out=2, axis=-1, largest=1, sorted=1)
        return g.op("Softmax", [top], f"{path}/route", axis=-1), ids
    probs = g.op("Softmax", [logits], f"{path}/route", axis=-1)
    top, ids = g.op("TopK", [probs, k], f"{path}/topk", n_out=2, axis=-1, largest=1, sorted=1)
    if cfg.norm_topk_prob:
        top = g.op("Div", [top, g.op("ReduceSum", [top, g.const([-1])], f"{path}/norm", keepdims=1)], f"{path}/norm")
    return top, ids


def expert_paths(path: str, e: int) -> list[str]:
    """Graph paths of expert e's projections: /model/layers.3/mlp/experts.5.gate_proj (hf_name:
    model.layers.3.mlp.experts.5.gate_proj.weight)."""
    return [f"{path}/experts.{e}.{p}" for p in PROJS]


def quantized_experts(g: GraphBuilder, cfg: ModelConfig, h: str, w: dict, p: str, path: str, weights: str,
                      ids: str, quant) -> str:
    """One MoE node: each expert's gate|up (one QLinear weight, gate rows first) and down quantized by the plan and
    stacked over the experts. An int4 layer whose experts come from MXFP4 (gpt-oss) keeps their codes in the op's
    mxfp4 format (exact, 4.5 bits a weight), or, where that format cannot hold them all, exact on MXFP4's grid in
    int8 (QuantPlan.expert_format; the report says which, and each tensor's bits a weight as packed)."""
    names = [hf_name(pth) for e in range(cfg.num_experts) for pth in expert_paths(path, e)]
    form = quant.expert_format(names)
    gu, dn = [], []
    for e in range(cfg.num_experts):
        paths = expert_paths(path, e)
        qs = [quant.quantize(hf_name(pth), w[f"{p}.experts.{e}.{proj}.weight"], form)
              for pth, proj in zip(paths, PROJS)]
        gu.append(pack(QuantizedWeight.concat(qs[:2])))
        dn.append(pack(qs[2]))
        for pth, packed in zip(paths, (gu[-1], gu[-1], dn[-1])):
            quant.report[hf_name(pth)]["bits_per_weight"] = packed.bits_per_weight
    ins = {"x": h, "expert": ids, "weight": weights}
    bias = expert_biases(cfg, w, p)
    if bias is not None:
        ins |= {"gate_up_bias": g.weight(f"{path}/experts.gate_up.bias", bias[0]),
                "down_bias": g.weight(f"{path}/experts.down.bias", bias[1])}
    for name, parts in (("gate_up", gu), ("down", dn)):
        codes, scales, offsets = stack_experts(parts)
        ins |= {f"{name}_codes": g.weight(f"{path}/experts.{name}.qcodes{parts[0].bits}", codes),
                f"{name}_scales": g.weight(f"{path}/experts.{name}.qscales", scales),
                f"{name}_offsets": g.weight(f"{path}/experts.{name}.qoffsets", offsets) if offsets is not None else ""}
    act = {} if cfg.swiglu_limit is None else {"activation": "clamped_swiglu", "alpha": C.CLAMPED_SWIGLU_ALPHA,
                                               "limit": float(cfg.swiglu_limit)}
    if gu[0].format == MXFP4:
        act["weight_format"] = MXFP4
    return g.op("MoE", op_schema("MoE").node_inputs(ins), f"{path}/experts", domain=C.OPS_DOMAIN,
                H=cfg.hidden_size, I=cfg.moe_intermediate_size, E=cfg.num_experts, bits=gu[0].bits,
                block_size=gu[0].block_size, **act)


def expert_biases(cfg: ModelConfig, w: dict, p: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The experts' biases (gpt-oss; None without): gate then up [E, 2I] (gate_up's row order), down [E, H]."""
    if not cfg.moe_bias:
        return None
    e_n = range(cfg.num_experts)
    gu = np.stack([np.concatenate([w[f"{p}.experts.{e}.gate_proj.bias"], w[f"{p}.experts.{e}.up_proj.bias"]])
                   for e in e_n]).astype(np.float32)
    return gu, np.stack([w[f"{p}.experts.{e}.down_proj.bias"] for e in e_n]).astype(np.float32)


def expert_activation(g: GraphBuilder, cfg: ModelConfig, gate: str, up: str, path: str) -> str:
    """SiLU(gate) * up, or gpt-oss's clamped SwiGLU (swiglu_limit L, alpha a): g = min(gate, L),
    u = clip(up, -L, L), (u + 1) * g * sigmoid(a * g)."""
    if cfg.swiglu_limit is None:
        return g.op("Mul", [activation(g, gate, "silu", f"{path}/act"), up], f"{path}/act_up")
    lim = float(cfg.swiglu_limit)
    gc = g.op("Min", [gate, g.const(lim, np.float32)], f"{path}/clamp")
    uc = g.op("Clip", [up, g.const(-lim, np.float32), g.const(lim, np.float32)], f"{path}/clamp")
    sig = g.op("Sigmoid", [g.op("Mul", [gc, g.const(C.CLAMPED_SWIGLU_ALPHA, np.float32)], f"{path}/act")],
               f"{path}/act")
    glu = g.op("Mul", [gc, sig], f"{path}/act")
    return g.op("Mul", [g.op("Add", [uc, g.const(1.0, np.float32)], f"{path}/act_up"), glu], f"{path}/act_up")


def dense_experts(g: GraphBuilder, cfg: ModelConfig, h: str, w: dict, p: str, path: str, weights: str,
                  ids: str) -> str:
    """fp32: every expert on every token, [T, H] @ [E, H, 2I] (+ bias) -> act(gate, up) [E, T, I] @ [E, I, H]
    (+ bias), summed over E with each token's weight of the expert (0 off its top k: the k weights spread over
    [T, E] by OneHot)."""
    f, e_n = cfg.moe_intermediate_size, cfg.num_experts
    gu = np.stack([np.concatenate([w[f"{p}.experts.{e}.gate_proj.weight"], w[f"{p}.experts.{e}.up_proj.weight"]]).T
                   for e in range(e_n)])                                                    # [E, H, 2I]
    dn = np.stack([w[f"{p}.experts.{e}.down_proj.weight"].T for e in range(e_n)])           # [E, I, H]
    bias = expert_biases(cfg, w, p)
    y = g.op("MatMul", [h, g.weight(f"{path}/experts.gate_up.weight", gu)], f"{path}/experts/gate_up")
    if bias is not None:                                                                   # [E, 1, 2I]
        y = g.op("Add", [y, g.weight(f"{path}/experts.gate_up.bias", bias[0][:, None])], f"{path}/experts/gate_up")
    gate, up = g.op("Split", [y, g.const([f, f])], f"{path}/experts/split", n_out=2, axis=-1)
    act = expert_activation(g, cfg, gate, up, f"{path}/experts")
    out = g.op("MatMul", [act, g.weight(f"{path}/experts.down.weight", dn)], f"{path}/experts/down")   # [E, T, H]
    if bias is not None:                                                                   # [E, 1, H]
        out = g.op("Add", [out, g.weight(f"{path}/experts.down.bias", bias[1][:, None])], f"{path}/experts/down")
    hot = g.op("OneHot", [ids, g.const(e_n), g.const([0.0, 1.0], np.float32)], f"{path}/dense", axis=-1)  # [T, k, E]
    dense = g.op("ReduceSum", [g.op("Mul", [hot, g.op("Unsqueeze", [weights, g.const([-1])], f"{path}/dense")],
                                    f"{path}/dense"), g.const([1])], f"{path}/dense", keepdims=0)      # [T, E]
    per_expert = g.op("Unsqueeze", [g.op("Transpose", [dense], f"{path}/dense", perm=[1, 0]), g.const([-1])],
                      f"{path}/dense")                                                      # [E, T, 1]
    return g.op("ReduceSum", [g.op("Mul", [out, per_expert], f"{path}/experts/weigh"), g.const([0])],
                f"{path}/experts/sum", keepdims=0)


def shared_expert(g: GraphBuilder, cfg: ModelConfig, h: str, w: dict, p: str, path: str, quant) -> str:
    """h [T, H] -> the shared expert's SwiGLU FFN [T, H] (mlp.shared_expert.*, every token; no LoRA), times its
    sigmoid gate where the family has one: QLinear gate|up (swiglu epilogue) and QLinear down where the plan lets
    them, else plain MatMul(NBits)s."""
    paths = [f"{path}/shared_expert.{n}" for n in PROJS]
    ws = [w[f"{p}.shared_expert.{n}.weight"] for n in PROJS]
    if qlinear_ready(quant, paths[:2]) and qlinear_ready(quant, paths[2:]):
        act = qlinear(g, h, ws[:2], paths[:2], quant, epilogue="swiglu", path=f"{path}/shared_expert.gate_up_proj")
        y = qlinear(g, act, ws[2:], paths[2:], quant)
    else:
        gate, up = linear_group(g, h, ws[:2], paths[:2], quant)
        act = g.op("Mul", [activation(g, gate, "silu", f"{path}/shared_expert/act"), up], f"{path}/shared_expert/act")
        y = linear(g, act, ws[2], paths[2], quant)
    if not cfg.shared_expert_gate:
        return y
    gate_w = g.weight(f"{path}/shared_expert_gate.weight", np.ascontiguousarray(w[f"{p}.shared_expert_gate.weight"].T))
    s = g.op("Sigmoid", [g.op("MatMul", [h, gate_w], f"{path}/shared_expert_gate")], f"{path}/shared_expert_gate")
    return g.op("Mul", [y, s], f"{path}/shared_expert_gate")                                  # [T, H] * [T, 1]


def moe_mlp(g: GraphBuilder, cfg: ModelConfig, x: str, w: dict, i: int, quant=None) -> str:
    """x + MoE(mlp_in norm of x) [+ its shared expert] [its mlp_out norm, its residual_multiplier first]: the quantized
    experts as one MoE op where the plan quantizes them all alike (and QLinear takes the block size), else the fp32
    form."""
    path, p = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
    h = rms_norm(g, x, *in_norm(cfg, w, i, "mlp_in"))
    weights, ids = router(g, cfg, h, w[f"{p}.gate.weight"], path, w[f"{p}.gate.bias"] if cfg.moe_bias else None)
    paths = [pth for e in range(cfg.num_experts) for pth in expert_paths(path, e)]
    if qlinear_ready(quant, paths):
        y = quantized_experts(g, cfg, h, w, p, path, weights, ids, quant)
    else:
        if quant is not None and {quant.dtype_for(hf_name(pth)) for pth in paths} != {"fp32"}:
            raise BuildError(f"layer {i}'s experts must be quantized alike with a block size that is a multiple of "
                             "32 (the MoE op), or all kept fp32; check --keep and --block-size")
        y = dense_experts(g, cfg, h, w, p, path, weights, ids)
    if cfg.shared_expert_intermediate_size:
        y = g.op("Add", [y, shared_expert(g, cfg, h, w, p, path, quant)], f"{path}/shared_expert/add")
    if norm_names(cfg)["mlp_out"] is not None:
        y = out_norm(g, cfg, w, y, i, "mlp_out")
    return g.op("Add", [x, scale_residual(g, y, cfg, path)], f"{path}/residual")
