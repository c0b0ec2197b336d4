"""What ONNX Runtime's thread-pool settings do to a decode step (issue #17 item 4): single-stream and batched
decode under each setting, systems alternated round by round in one process (an engine per round, closed
before the next, so no idle pool competes), medians and ratios to ORT's defaults.

    .venv/bin/python bench/probes/ort_settings.py ARTIFACT [--batches 1,16] [--rounds 3] [--threads 2]

Dev tooling: the settings reach the model runner through ORTLLM_ORT_CONFIG ("key=value,key=value").
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

SETTINGS = {
    "default (allow_spinning=1)": "",
    "allow_spinning=0": "session.intra_op.allow_spinning=0",
    "dynamic_block_base=4": "session.dynamic_block_base=4",
    "force_spinning_stop=1": "session.force_spinning_stop=1",
}


def decode_rate(artifact: str, batch: int, threads: int, new_tokens: int, prompt_tokens: int, seed: int) -> float:
    import numpy as np

    from ortllm.bench.engine import PLAIN
    from ortllm.runtime import Engine, SamplingParams
    rng = np.random.default_rng(seed)
    with Engine.from_artifact(artifact, max_num_seqs=batch, threads=threads, **PLAIN) as engine:
        def prompts():
            return [rng.integers(100, engine.vocab_size, prompt_tokens).tolist() for _ in range(batch)]
        first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        full = SamplingParams(max_tokens=new_tokens + 1, temperature=0.0, ignore_eos=True)
        engine.generate(prompts(), first)                       # warm
        t0 = time.perf_counter()
        engine.generate(prompts(), first)
        t1 = time.perf_counter()
        engine.generate(prompts(), full)
        t2 = time.perf_counter()
    return batch * new_tokens / ((t2 - t1) - (t1 - t0))         # prefill + first token subtracted


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=64)
    a = p.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    rates: dict[tuple[str, int], list[float]] = {}
    for r in range(a.rounds):
        for name, config in SETTINGS.items():
            os.environ["ORTLLM_ORT_CONFIG"] = config
            for b in batches:
                rates.setdefault((name, b), []).append(
                    decode_rate(a.artifact, b, a.threads, a.new_tokens, a.prompt_tokens, seed=r))
    for b in batches:
        base = statistics.median(rates[(next(iter(SETTINGS)), b)])
        for name in SETTINGS:
            med = statistics.median(rates[(name, b)])
            print(f"B={b:<3d} {name:28s} {med:8.1f} tok/s  {med / base:5.2f}x  "
                  f"(rounds: {', '.join(f'{v:.1f}' for v in rates[(name, b)])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
