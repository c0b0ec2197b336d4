"""The fp32 engine graph's stages (pipeline/graph_stages.py) run one at a time over token windows, each window one
sequence of its own: what the layer-by-layer fp32 reference (pipeline/layer_reference.py) and the layer-by-layer
calibration (pipeline/calib_activations.LayerCalibration) share. A stage is built into a scratch directory, opened
(the directory is removed then: ONNX Runtime holds the weights) and dropped by the caller after its run, so the
process holds one stage's fp32 weights at a time.

    Stages(weights, scratch, block_size)
      .embed(windows)                     -> hidden [n, H] per window
      .layer(i, hidden, fetch, take)      -> layer i's output per window; take(key, x) gets, per window, the input
                                             [n, K] of each node path in fetch (a projection's matmul: calibration)
      .session(HEAD)                      -> the head stage's session (hidden [S, H] -> logits [S, V])
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from ortllm.runtime import contract as C

from .graph_stages import EMBED, HIDDEN_IN, HIDDEN_OUT, build_stage_graph
from .weights import ModelWeights


class Stages:
    def __init__(self, weights: ModelWeights, scratch: Path, block_size: int, threads: int | None = None):
        self.weights, self.scratch, self.block_size, self.threads = weights, Path(scratch), block_size, threads
        self._pool: dict[str, np.ndarray] = {}

    def session(self, stage, fetch: tuple[str, ...] = ()):
        """Build `stage` and open it; fetch: node paths whose input 0 the stage also outputs (in that order)."""
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper

        from ortllm.runtime.ops_library import register_ops

        d = self.scratch / f"stage-{stage}"
        d.mkdir(parents=True, exist_ok=True)
        build_stage_graph(self.weights, stage, d / C.MODEL, d / C.MODEL_DATA, self.block_size)
        path = d / C.MODEL
        if fetch:
            model = onnx.load(str(path), load_external_data=False)
            consumers = {n.name: n.input[0] for n in model.graph.node}
            missing = [k for k in fetch if k not in consumers]
            if missing:
                raise RuntimeError(f"stage {stage} has no node {missing[0]} (graph_engine's node paths changed)")
            for k in fetch:
                model.graph.output.append(helper.make_tensor_value_info(consumers[k], TensorProto.FLOAT, None))
            path = d / "capture.onnx"             # its external data: model.onnx.data beside it
            path.write_bytes(model.SerializeToString())
        so = ort.SessionOptions()
        if self.threads:
            so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        register_ops(so)
        # The whole graph's residual adds follow MultiLoRA, so ORT never folds them into the matmul before; here
        # they follow the matmul itself, and a Gemm with the residual as C rounds differently: kept apart, the
        # stages give the whole graph's bits (tests/pipeline/test_layer_reference.py)
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=["MatMulAddFusion"])
        session.fetched = [consumers[k] for k in fetch] if fetch else []
        shutil.rmtree(d, ignore_errors=True)
        return session

    def embed(self, windows: list[list[int]]) -> list[np.ndarray]:
        s = self.session(EMBED)
        return [s.run([HIDDEN_OUT], {C.ENGINE_INPUT_IDS: np.asarray(w, np.int64)})[0] for w in windows]

    def layer(self, i: int, hidden: list[np.ndarray], fetch: tuple[str, ...] = (),
              take: Callable[[str, np.ndarray], None] | None = None) -> list[np.ndarray]:
        """Layer i over each window's hidden states (a list, replaced in place and returned)."""
        cfg = self.weights.config
        blocks = -(-max(len(h) for h in hidden) // self.block_size)
        shape = (cfg.num_layers, 1 + blocks, cfg.num_kv_heads, self.block_size, cfg.head_dim)
        if not self._pool or next(iter(self._pool.values())).shape[1] < shape[1]:
            # every layer's pool (PagedAttention indexes it by its `layer`); blocks 1.. a window's, 0 the null block
            self._pool = {kind: np.zeros(shape, np.float32) for kind in C.cache_kinds(False)}
        session = self.session(i, fetch)
        for j, x in enumerate(hidden):
            hidden[j], fetched = _run_layer(session, i, x, self._pool, self.block_size)
            for key, arr in zip(fetch, fetched):
                take(key, arr)
        return hidden


def _run_layer(session, layer: int, x: np.ndarray, pool: dict[str, np.ndarray], block_size: int
               ) -> tuple[np.ndarray, list[np.ndarray]]:
    """One layer stage over one window x [n, H] as one sequence from position 0 (its KV in blocks 1..), the cache
    outputs bound to the layer's slice of the pool as runtime/model_runner.py binds them; returns the layer's output
    and the session's fetched tensors, each [n, K]."""
    import onnxruntime as ort

    n = len(x)
    out = np.empty_like(x)
    io = session.io_binding()
    for kind, arr in pool.items():
        io.bind_ortvalue_input(C.cache_name(kind), ort.OrtValue.ortvalue_from_numpy(arr))
        io.bind_ortvalue_output(C.cache_out_name(kind, layer), ort.OrtValue.ortvalue_from_numpy(arr[layer]))
    feeds = {HIDDEN_IN: np.ascontiguousarray(x, np.float32), C.POSITIONS: np.arange(n, dtype=np.int32),
             C.CU_SEQLENS: np.asarray([0, n], np.int32), C.CONTEXT_LENS: np.zeros(1, np.int32),
             C.BLOCK_TABLES: np.arange(1, 1 + -(-n // block_size), dtype=np.int32)[None]}
    for name, value in feeds.items():
        io.bind_cpu_input(name, value)
    io.bind_output(HIDDEN_OUT, "cpu", element_type=np.float32, shape=list(out.shape), buffer_ptr=out.ctypes.data)
    for name in session.fetched:
        io.bind_output(name, "cpu")
    session.run_with_iobinding(io)
    fetched = io.get_outputs()[-len(session.fetched):] if session.fetched else []
    return out, [v.numpy().reshape(n, -1) for v in fetched]
