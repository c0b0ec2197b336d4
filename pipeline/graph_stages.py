"""The fp32 engine graph cut into stages, each a graph of its own holding only its weights: the layer-by-layer
reference of the in-build quality check (pipeline/layer_reference.py), for models whose fp32 copy does not fit in
memory. A stage is built from graph_engine's own blocks (attention, mlp, head), so it computes on its rows what the
whole fp32 engine graph computes there; only LoRA is left out (no adapters: MultiLoRA's slot -1 adds nothing).

    embed:    input_ids [T] -> Gather [-> * embedding scale] -> hidden_out [T, H]
    layer i:  hidden [T, H] + positions [T], cu_seqlens [S + 1], context_lens [S], block_tables [S, max_blocks],
              every layer's fp32 KV pool (key_cache, value_cache [L, num_blocks, Hkv, block_size, D]; layer i's
              slice written through key_cache_out.i / value_cache_out.i, aliased by the runner as the engine does)
              -> attention (PagedAttention) -> MLP (dense or mixture of experts) -> hidden_out [T, H]
    head:     hidden [S, H] -> final norm -> LM head [S, V] [-> softcap] -> logits
"""
from __future__ import annotations

from onnx import TensorProto

from ortllm.runtime import contract as C

from .graph_blocks import rope_tables, scale_embedding
from .graph_engine import attention, head, mlp
from .graph_qlinear import EMBED_TABLE, embedding
from .onnx_builder import GraphBuilder
from .weights import ModelWeights

F32, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
HIDDEN_IN, HIDDEN_OUT = "hidden", "hidden_out"     # a stage's input and output [T, H]
EMBED, HEAD = "embed", "head"                       # the stages besides the layers (0 .. L - 1)


def build_stage_graph(weights: ModelWeights, stage: str | int, model_path, data_path, block_size: int) -> None:
    """Write one stage (EMBED, a layer index, or HEAD) of the fp32 engine graph of `weights` to model_path (+ its
    external data at data_path), reading only that stage's tensors."""
    cfg, w = weights.config, weights.tensors
    g = GraphBuilder(data_path, extra_opsets={C.OPS_DOMAIN: 1})
    if stage == EMBED:
        x = scale_embedding(g, embedding(g, g.input(C.ENGINE_INPUT_IDS, I64, ["T"]), w[EMBED_TABLE], None), cfg)
        g.identity(x, g.output(HIDDEN_OUT, F32, ["T", cfg.hidden_size]), "/model/stage")
    elif stage == HEAD:
        x = g.input(HIDDEN_IN, F32, ["S", cfg.hidden_size])
        if cfg.tie_word_embeddings:       # a tied fp32 head reads the embedding table's initializer
            g.weight(EMBED_TABLE, w[EMBED_TABLE])
        logits, _ = head(g, x, weights, EMBED_TABLE, None)
        g.identity(logits, g.output(C.LOGITS, F32, ["S", cfg.vocab_size]), "/lm_head/logits")
    else:
        i = int(stage)
        kind = cfg.layer_types[i]
        batch = {
            "positions": g.input(C.POSITIONS, I32, ["T"]),
            "cu_seqlens": g.input(C.CU_SEQLENS, I32, ["S_plus_1"]),
            "context_lens": g.input(C.CONTEXT_LENS, I32, ["S"]),
            "block_tables": g.input(C.BLOCK_TABLES, I32, ["S", "max_blocks"]),
            "adapter": None,
            "rope": {kind: tuple(g.weight(f"model.rope.{kind}.{f}", t) for f, t in zip(
                ("cos", "sin"), rope_tables(cfg, kind)))},
        }
        x = attention(g, cfg, g.input(HIDDEN_IN, F32, ["T", cfg.hidden_size]), w, i, batch, "fp32", block_size)
        x = mlp(g, cfg, x, w, i, None)
        g.identity(x, g.output(HIDDEN_OUT, F32, ["T", cfg.hidden_size]), f"/model/layers.{i}/stage")
    g.save(model_path, f"ortllm_engine_stage_{stage}", doc=f"ortllm fp32 engine graph, stage {stage}")
