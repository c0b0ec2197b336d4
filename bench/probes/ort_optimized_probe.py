"""Session creation of a store model: ORT optimizing at load, vs loading a pre-optimized model file
(optimized_model_filepath), vs no optimization (docs/notes/benchmarks.md, Startup). Median of 5, seconds.

    python bench/probes/ort_optimized_probe.py NAME
"""
import argparse
import os
import statistics
import time

import onnxruntime as ort

from ortllm.runtime import contract as C
from ortllm.runtime.ops_library import register_ops
from ortllm.runtime.store import Store


def session_seconds(path: str, level, out: str | None = None) -> float:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    register_ops(so)
    so.graph_optimization_level = level
    if out:
        so.optimized_model_filepath = out
    t = time.perf_counter()
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a model of the local store (NAME:TAG)")
    name = ap.parse_args(argv).name
    model = str(Store().path(name) / C.MODEL)
    work = "/tmp/st-opt-" + name.replace(":", "_")
    os.makedirs(work, exist_ok=True)
    if not os.path.exists(f"{work}/{C.MODEL_DATA}"):
        os.link(os.path.realpath(str(Store().path(name) / C.MODEL_DATA)), f"{work}/{C.MODEL_DATA}")
    opt = work + "/opt.onnx"
    level = ort.GraphOptimizationLevel
    session_seconds(model, level.ORT_ENABLE_ALL, opt)
    at_load = [session_seconds(model, level.ORT_ENABLE_ALL) for _ in range(5)]
    pre = [session_seconds(opt, level.ORT_DISABLE_ALL) for _ in range(5)]
    none = [session_seconds(model, level.ORT_DISABLE_ALL) for _ in range(5)]
    print(name, "optimize at load", statistics.median(at_load), "pre-optimized file", statistics.median(pre),
          "no optimization", statistics.median(none))


if __name__ == "__main__":
    main()
