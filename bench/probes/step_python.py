"""Where a decode step's Python goes: the engine's step timed part by part (scheduling, building the run's inputs,
session.run, sampling, the scheduler's update, the detokenizer), per step, in the engine's own loop.

    .venv/bin/python bench/probes/step_python.py ARTIFACT [--batch 1] [--new-tokens 128] [--rounds 3] [--threads 2]
                                                        [--decode-steps K]

Each part is wrapped in a timer (about a microsecond each, counted in its part), per model step: with multi-step
decoding (decode_steps > 1) a schedule's parts are spread over its steps, and "chained steps" is the Python
between the runs of one schedule. "outside session.run" is what engine.stats()["python_overhead"] reports as a
share. Dev tooling: the wrappers patch the engine's classes in
this process only.
"""
from __future__ import annotations

import argparse
import collections
import functools
import time
from pathlib import Path


def timed(cls, name: str, label: str, acc: collections.Counter, minus: tuple[str, ...] = ()) -> None:
    """Time cls.name into acc[label], less what the labels in `minus` gained meanwhile (the parts inside it)."""
    f = getattr(cls, name)

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        t0, inner = time.perf_counter(), sum(acc[m] for m in minus)
        try:
            return f(*args, **kwargs)
        finally:
            acc[label] += time.perf_counter() - t0 - (sum(acc[m] for m in minus) - inner)

    setattr(cls, name, wrapper)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode-steps", type=int, default=None, help="SchedulerConfig.decode_steps (default: its own)")
    a = p.parse_args(argv)
    import numpy as np

    from ortllm.bench.engine import PLAIN
    from ortllm.runtime import Engine, SamplingParams
    from ortllm.runtime import detokenizer, model_runner, sampler, scheduler

    acc: collections.Counter = collections.Counter()
    timed(model_runner.ModelRunner, "_run", "session.run", acc)
    timed(model_runner.ModelRunner, "execute", "inputs (execute - run)", acc, ("session.run",))
    timed(model_runner.ModelRunner, "execute_steps", "chained steps (execute_steps - execute - runs)", acc,
          ("session.run", "inputs (execute - run)"))
    timed(scheduler.Scheduler, "schedule", "schedule", acc)
    timed(scheduler.Scheduler, "update_from_output", "update_from_output", acc)
    timed(sampler.Sampler, "sample", "sample", acc)
    timed(detokenizer.IncrementalDetokenizer, "step", "detokenizer", acc)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=a.new_tokens, temperature=0.0, ignore_eos=True)
    steps = {} if a.decode_steps is None else {"decode_steps": a.decode_steps}
    with Engine.from_artifact(a.artifact, max_num_seqs=max(a.batch, 1), threads=a.threads,
                              enable_prefix_cache=False, **PLAIN, **steps) as engine:
        vocab = engine.vocab_size
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
    for label, total in acc.most_common():
        print(f"  {label:48s} {total / steps * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
