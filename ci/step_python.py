"""Where a decode step's Python goes: the engine's step timed part by part (scheduling, building the run's inputs,
session.run, sampling, the scheduler's update, the detokenizer), per step, in the engine's own loop.

    .venv/bin/python ci/step_python.py ARTIFACT [--batch 1] [--new-tokens 128] [--rounds 3] [--threads 2]

Each part is wrapped in a timer (about a microsecond each, counted in its part). "outside session.run" is what
engine.stats()["python_overhead"] reports as a share. Dev tooling: the wrappers patch the engine's classes in
this process only.
"""
from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(cls, name: str, label: str, acc: collections.Counter) -> None:
    f = getattr(cls, name)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            acc[label] += time.perf_counter() - t0

    setattr(cls, name, wrapper)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    import numpy as np

    from ortllm.bench.engine import PLAIN
    from ortllm.runtime import Engine, SamplingParams
    from ortllm.runtime import detokenizer, model_runner, sampler, scheduler

    acc: collections.Counter = collections.Counter()
    timed(model_runner.ModelRunner, "_run", "session.run", acc)
    timed(model_runner.ModelRunner, "execute", "execute (inputs + run)", acc)
    timed(scheduler.Scheduler, "schedule", "schedule", acc)
    timed(scheduler.Scheduler, "update_from_output", "update_from_output", acc)
    timed(sampler.Sampler, "sample", "sample", acc)
    timed(detokenizer.IncrementalDetokenizer, "step", "detokenizer", acc)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=a.new_tokens, temperature=0.0, ignore_eos=True)
    with Engine.from_artifact(a.artifact, max_num_seqs=max(a.batch, 1), threads=a.threads,
                              enable_prefix_cache=False, **PLAIN) as engine:
        vocab = engine.runner.vocab_size
        engine.generate([rng.integers(100, vocab, 64).tolist() for _ in range(a.batch)],
                        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))     # warm-up
        s0 = engine.stats()
        acc.clear()
        for _ in range(a.rounds):
            engine.generate([rng.integers(100, vocab, 64).tolist() for _ in range(a.batch)], params)
        s1 = engine.stats()
    steps = s1["steps"] - s0["steps"]
    step = (s1["step_time_s"] - s0["step_time_s"]) / steps
    run = acc["session.run"] / steps
    print(f"{a.artifact}: batch {a.batch}, {steps} steps of {step * 1e6:.0f} us; outside session.run "
          f"{(step - run) * 1e6:.0f} us ({(1 - run / step) * 100:.2f}%)")
    acc["inputs (execute - run)"] = acc.pop("execute (inputs + run)") - acc["session.run"]
    for label, total in acc.most_common():
        print(f"  {label:24s} {total / steps * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
