"""Where Engine.from_artifact's time goes, one fresh process per measurement (docs/notes/benchmarks.md, Startup).

    python bench/probes/startup_profile.py ARTIFACT_DIR_OR_STORE_NAME [--repeats 5]

Prints, per run, the parts of a load (medians over runs): reading and verifying the files (full re-hash vs the
hash cache), the ORT session (graph optimization included), the warm-up, and the whole from_artifact.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
T_START = time.perf_counter()
t0 = time.perf_counter()
from ortllm.runtime import engine as E, model_runner as M, artifact as A
t_import = time.perf_counter() - t0
path = sys.argv[1]
t = time.perf_counter(); A.load_artifact(path); t_verify = time.perf_counter() - t
parts = {}
orig_sess, orig_warm = M.ort.InferenceSession, M.ModelRunner._warm_up
def sess(*a, **k):
    t = time.perf_counter(); s = orig_sess(*a, **k); parts["session"] = time.perf_counter() - t; return s
def warm(self):
    t = time.perf_counter(); orig_warm(self); parts["warm_up"] = time.perf_counter() - t
M.ort.InferenceSession, M.ModelRunner._warm_up = sess, warm
t = time.perf_counter(); eng = E.Engine.from_artifact(path); t_load = time.perf_counter() - t
from ortllm.runtime.sampling_params import SamplingParams
t = time.perf_counter(); eng.generate(["hi"], SamplingParams(max_tokens=1)); t_first = time.perf_counter() - t
eng.close()
print(json.dumps({"import_s": t_import, "verify_s": t_verify, "from_artifact_s": t_load,
                  **{k + "_s": v for k, v in parts.items()}, "first_token_s": t_first,
                  "process_to_servable_s": time.perf_counter() - T_START - t_verify - t_first}))
"""


def run(path: str, full: bool) -> dict:
    env = {**os.environ, "ORTLLM_VERIFY": "1" if full else "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    path = a.artifact
    if not os.path.exists(path):
        from ortllm.runtime.store import Store
        path = str(Store().path(path))
    run(path, full=False)                          # fills the hash cache and the page cache
    for label, full in (("every file hashed (before; ORTLLM_VERIFY=1)", True), ("hash cache (after)", False)):
        runs = [run(path, full) for _ in range(a.repeats)]
        keys = runs[0].keys()
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        rng = {k: (min(r[k] for r in runs), max(r[k] for r in runs)) for k in keys}
        print(f"{label}: " + ", ".join(f"{k} {med[k]:.3f} ({rng[k][0]:.3f}-{rng[k][1]:.3f})" for k in keys))


if __name__ == "__main__":
    main()
