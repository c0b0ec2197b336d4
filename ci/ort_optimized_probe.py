"""Session creation of an artifact: ORT optimizing at load vs loading a pre-optimized model file (optimized_model_filepath)
vs no optimization (docs/benchmarks.md, Startup).  python ci/ort_optimized_probe.py NAME  (median of 5, seconds)."""
import sys, time, os, statistics, onnxruntime as ort
from ortllm.runtime.ops_library import register_ops
from ortllm.runtime.store import Store
p = str(Store().path(sys.argv[1]) / "model.onnx")
d = "/tmp/st-opt-" + sys.argv[1].replace(":", "_"); os.makedirs(d, exist_ok=True)
if not os.path.exists(d + "/model.onnx.data"): os.link(os.path.realpath(p + ".data"), d + "/model.onnx.data")
opt = d + "/opt.onnx"
def sess(path, level, out=None):
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; register_ops(so)
    so.graph_optimization_level = level
    if out: so.optimized_model_filepath = out
    t = time.perf_counter(); ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]); return time.perf_counter() - t
sess(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, opt)
a = [sess(p, ort.GraphOptimizationLevel.ORT_ENABLE_ALL) for _ in range(5)]
b = [sess(opt, ort.GraphOptimizationLevel.ORT_DISABLE_ALL) for _ in range(5)]
c = [sess(p, ort.GraphOptimizationLevel.ORT_DISABLE_ALL) for _ in range(5)]
print(sys.argv[1], "optimize at load", statistics.median(a), "pre-optimized file", statistics.median(b), "no optimization", statistics.median(c))
