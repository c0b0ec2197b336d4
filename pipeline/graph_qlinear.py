"""QLinear projections for the engine graph (custom_ops/src/kernels/qlinear.h): one node per fused weight
with the block offsets, the per-token LoRA of every target it holds and the epilogue inside.

A group of projections of one input (q|k|v, gate|up, or one) goes to QLinear when the plan gives all of
them the same quantized dtype and the block size is a multiple of 32; otherwise the caller keeps the
MatMul(NBits) + MultiLoRA form (fp32 artifacts, --keep splits, block size 16).
"""
from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto

from ortllm.runtime import contract as C
from ortllm.runtime.ops_library import op_schema

from .graph_blocks import group_path
from .onnx_builder import GraphBuilder
from .qlinear_pack import pack
from .quant_grid import MXFP4, quantize_by_rows
from .quantize import QuantizedWeight, RTNQuantizer, hf_name

F16, F32, I8 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT8
ARGMAX_OUT = 3                      # the op's optional output: each row's first maximum (after y and the splits)
EPILOGUES = ("none", "residual", "swiglu", "geglu")


def qlinear_ready(quant, paths: list[str]) -> bool:
    """Whether these projections of one input can be one QLinear (without quantizing anything yet)."""
    if quant is None or quant.block_size % 32:
        return False
    dtypes = {quant.dtype_for(hf_name(p)) for p in paths}
    return len(dtypes) == 1 and dtypes != {"fp32"}


def qlinear(g: GraphBuilder, x: str, ws: list[np.ndarray], paths: list[str], quant, *, lora: dict | None = None,
            epilogue: str = "none", residual: str | None = None, norm: tuple[np.ndarray, float, str] | None = None,
            split: bool = False, argmax: bool = False, path: str | None = None, act16: bool = False) -> str | list[str]:
    """x [T, K] -> y [T, sum(N_i)] ([T, N / 2] with "swiglu" or "geglu"; residual + x W^T with "residual"); split: one
    output per weight, [T, N_i] each (q, k, v without a Split node); argmax: [y, argmax [T] int64], each row's
    first maximum (the LM head's greedy tokens, found by the op on the columns it just wrote).

        x [T, K] --> QLinear(codes, scales [, offsets] [, residual],
                             token_adapter, lora.scale, (A, A_scale, B, B_scale, rank) per target
                             [, norm weight], lora.dora, dora_scale per target, token_adapter_weight) --> y

    ws are HF [out, in] weights fused along out in order; `lora` = {"layer": i, "layers": n, "adapter":
    token_adapter input} gives each path its LoRA segment (graph inputs lora.{target}.a|a_scale|b|b_scale, the int8
    stacks of all n layers, read at layer i (attribute lora_layer), and lora.rank.{target}; DoRA rows: lora.dora
    and lora.{target}.dora_scale [n, slots, out]);
    `norm` = (weight [K], eps, path): the op projects RMSNorm(x) * weight (the norm before it, fused);
    act16: an int8 weight multiplies int16 activation codes (attribute act_bits 16; a LoRA still reads int8 codes):
    the LM head, where the final norm's few large channels set an int8 step too coarse for the rest, and the layer
    projections a build names (--act16: Gemma 3's q|k|v; custom_ops/src/kernels/qlinear.h).
    """
    assert epilogue in EPILOGUES
    path = path or group_path(paths)
    qs = [quant.quantize(hf_name(p), w) for w, p in zip(ws, paths)]
    q = qs[0] if len(qs) == 1 else QuantizedWeight.concat(qs)
    p = pack(q)
    ins = {"x": x, "codes": g.weight(f"{path}.qcodes{p.bits}", p.codes),       # the op's inputs by name
           "scales": g.weight(f"{path}.qscales", p.scales),
           "offsets": g.weight(f"{path}.qoffsets", p.offsets) if p.offsets is not None else "",
           "residual": residual or ""}
    attrs = {}
    if lora is not None:
        ins |= {"token_adapter": lora["adapter"], "lora_scale": C.LORA_SCALE}
        for j, (w, pth) in enumerate(zip(ws, paths)):   # segment j: the LoRA of output columns N_0 + .. + N_{j-1}
            target = pth.rsplit("/", 1)[1]
            out_dim, in_dim = w.shape
            name = functools.partial(C.lora_stack_name, target)
            chunks, layers = -(-in_dim // C.LORA_CHUNK), lora["layers"]
            ins |= {f"A{j}": g.input(name("a"), I8, [layers, "lora_slots", in_dim, "lora_rank"]),
                    f"A_scale{j}": g.input(name("a_scale"), F16, [layers, "lora_slots", chunks, "lora_rank"]),
                    f"B{j}": g.input(name("b"), I8, [layers, "lora_slots", "lora_rank", out_dim]),
                    f"B_scale{j}": g.input(name("b_scale"), F16, [layers, "lora_slots", out_dim]),
                    f"rank{j}": C.lora_rank_name(target)}
            ins[f"dora_scale{j}"] = g.input(name("dora_scale"), F32, [layers, "lora_slots", out_dim])
        ins["dora"] = g.input(C.LORA_DORA, TensorProto.INT32, ["lora_slots"])
        ins["token_adapter_weight"] = C.TOKEN_ADAPTER_WEIGHT
        attrs["lora_layer"] = lora["layer"]
    if norm is not None:
        weight, eps, norm_path = norm
        ins["norm_weight"] = g.weight(f"{norm_path}.weight", weight)
        attrs["norm_eps"] = float(eps)
    if split and len(ws) > 1:
        attrs["split"] = [int(w.shape[0]) for w in ws]
    if act16 and q.bits == 8:
        attrs["act_bits"] = 16
    if p.format == MXFP4:               # codes into the 2 x e2m1 table (quant_grid.on_mxfp4)
        attrs["weight_format"] = MXFP4
    assert not (argmax and (epilogue != "none" or "split" in attrs))
    outs = {"n_out": ARGMAX_OUT + 1, "skip": tuple(range(1, ARGMAX_OUT))} if argmax else \
        {"n_out": len(attrs.get("split", [0]))}
    y = g.op("QLinear", op_schema("QLinear").node_inputs(ins), path, domain=C.OPS_DOMAIN, K=q.k, N=q.n, bits=q.bits,
             block_size=q.block_size, epilogue=epilogue, packed_a=1, **outs, **attrs)
    return [y[0], y[ARGMAX_OUT]] if argmax else y

EMBED_BLOCK = 32
EMBED_TABLE = "model.embed_tokens.weight"     # HF name, and the fp32 table's initializer a tied fp32 head reads


def embedding(g: GraphBuilder, ids: str, table: np.ndarray, quant) -> str:
    """input_ids [T] -> [T, H]. With a quantized LM head the table is gathered from an int8 copy (symmetric,
    blocks of 32: llama.cpp's Q8_0) by com.microsoft GatherBlockQuantized, so no fp32 table [V, H] stays
    resident (SmolLM2: 28 MB instead of 113 MB); its error goes into the quality report. Else fp32 Gather.

        ids -> GatherBlockQuantized(codes [V, H] u8, scales [V, H / 32]) -> x [T, H]
    """
    name = EMBED_TABLE
    if quant is None or quant.lm_head == "fp32" or table.shape[1] % EMBED_BLOCK:
        return g.op("Gather", [g.weight(name, table), ids], "/model/embed_tokens", axis=0)
    q = quantize_by_rows(RTNQuantizer(8, EMBED_BLOCK, symmetric=True).quantize, table)
    quant.report[name] = {"bits": 8, "block_size": EMBED_BLOCK, "algo": "rtn", "max_rel": q.max_rel,
                          "rms_rel": q.rms_rel}
    g.opsets.setdefault("com.microsoft", 1)
    codes = g.weight(f"{name}.q8", q.data.reshape(q.n, -1))
    scales = g.weight(f"{name}.scales", q.scales.reshape(q.n, -1))
    return g.op("GatherBlockQuantized", [codes, ids, scales], "/model/embed_tokens", domain="com.microsoft",
                bits=8, block_size=EMBED_BLOCK, gather_axis=0, quantize_axis=1)
