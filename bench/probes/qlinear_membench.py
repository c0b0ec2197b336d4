"""QLinear alone at decode (one token): N nodes of one shape, each with its own int4 weights (Q4_1 grid, blocks of
32), all reading the same x [1, K], in one session. With enough nodes the weights come from memory, as in the
engine's step; with few they stay in L3 (the op's compute and per-call costs alone).

    .venv/bin/python bench/probes/qlinear_membench.py [--k 576] [--n 960] [--nodes 200] [--threads 2] [--runs 30]

Prints microseconds per node (minimum over the runs, the Python cost of one `run` spread over the nodes) and
the weight bytes per second. SmolLM2's shapes: q|k|v 576 x 960, o 576 x 576, gate|up 576 x 3072, down 1536 x
576, the LM head 576 x 49152. Compare ops libraries with ORTLLM_OPS_LIBRARY=path, alternating. Dev tooling.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import numpy_helper

from ortllm.bench.op_graphs import F32, model, qlinear_node, session, value_info
from ortllm.pipeline.qlinear_pack import pack
from ortllm.pipeline.quantize import RTNQuantizer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--n", type=int, default=960)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    w = pack(RTNQuantizer(4, 32, False).quantize(rng.standard_normal((a.n, a.k), dtype=np.float32) * 0.05))
    nodes, inits, outs = [], [], []
    for i in range(a.nodes):
        codes = w.codes.copy()            # every node its own weight bytes (the same values but the first 16)
        codes.reshape(-1)[:16] = rng.integers(0, 255, 16)
        inits += [numpy_helper.from_array(codes, f"codes{i}"), numpy_helper.from_array(w.scales, f"scales{i}"),
                  numpy_helper.from_array(w.offsets, f"offsets{i}")]
        nodes.append(qlinear_node(["x", f"codes{i}", f"scales{i}", f"offsets{i}"], [f"y{i}"], K=a.k, N=a.n, bits=4,
                                  block_size=32))
        outs.append(value_info(f"y{i}", F32, [None, a.n]))
    sess = session(model(nodes, [value_info("x", F32, [None, a.k])], outs, inits, name="qlinear_membench"), a.threads)
    x = {"x": rng.standard_normal((1, a.k), dtype=np.float32)}
    for _ in range(5):
        sess.run(None, x)
    best = float("inf")
    for _ in range(a.runs):
        t0 = time.perf_counter()
        sess.run(None, x)
        best = min(best, time.perf_counter() - t0)
    node_bytes = w.codes.nbytes + w.scales.nbytes + w.offsets.nbytes
    print(f"K={a.k} N={a.n} x {a.nodes} nodes ({a.nodes * node_bytes / 1e6:.1f} MB), threads {a.threads}: "
          f"{best / a.nodes * 1e6:.1f} us per node, {a.nodes * node_bytes / best / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
