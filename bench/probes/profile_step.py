"""Where a decode step's time goes: ONNX Runtime's per-node profile of an engine, summed by op type, and the
Python share of the step (engine.stats()["python_overhead"]: step wall time outside session.run).

    .venv/bin/python bench/probes/profile_step.py ARTIFACT [--batch 1] [--prompt-tokens 64] [--new-tokens 64]
                                                   [--threads 2]

Prints one line per op type (share of the ORT time, microseconds per step, calls per step). Dev tooling:
the profile is ORT's own (ORTLLM_ORT_PROFILE makes the model runner enable it).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    prefix = Path(tempfile.mkdtemp(prefix="ortllm-profile-")) / "ort"
    os.environ["ORTLLM_ORT_PROFILE"] = str(prefix)
    import numpy as np

    from ortllm.bench.engine import PLAIN
    from ortllm.runtime import Engine, SamplingParams

    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=a.new_tokens, temperature=0.0, ignore_eos=True)
    with Engine.from_artifact(a.artifact, max_num_seqs=max(a.batch, 1), threads=a.threads, **PLAIN) as engine:
        vocab = engine.vocab_size
        prompts = [rng.integers(100, vocab, a.prompt_tokens).tolist() for _ in range(a.batch)]
        engine.generate(prompts, params)
        stats = engine.stats()
        trace = engine.end_profiling()
    events = json.loads(Path(trace).read_text())
    by_op, calls = collections.Counter(), collections.Counter()
    runs = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            runs += 1
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            by_op[op] += e["dur"]
            calls[op] += 1
    total = sum(by_op.values())
    steps = max(runs, 1)
    print(f"{a.artifact}: batch {a.batch}, {runs} runs, ORT node time {total / steps:.0f} us per run, "
          f"python share of the step {stats['python_overhead'] * 100:.1f}%")
    for op, us in by_op.most_common():
        print(f"  {op:28s} {us / total * 100:5.1f}%  {us / steps:8.0f} us/run  {calls[op] / steps:6.1f} calls/run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
