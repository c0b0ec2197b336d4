"""Engine decode speed for A/B runs: B sequences of P random prompt tokens, plain greedy decoding, 2 threads.

    .venv/bin/python bench/probes/engine_decode.py ARTIFACT [--batch 1] [--prompt 64]     # decode and prefill
    .venv/bin/python bench/probes/engine_decode.py ARTIFACT --prompt 1984 --cached        # decode after a long prompt

Three rounds; each times a 1-token run (prefill) and a 65-token run of the same prompts and prints the best
decode rate, B x 64 tokens over the difference. With --cached the prompt stays in the prefix cache, so only the
decode of the long context is timed (the bench's long-context scenario, in process). The procedure of the
`/tmp/vn/dec.py` and `/tmp/vn/lc.py` runs that older docs paragraphs cite. Compare code or ops libraries
(ORTLLM_OPS_LIBRARY=path) alternating, run by run. Dev tooling.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--cached", action="store_true", help="keep the prompt in the prefix cache (long context)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode-steps", type=int, default=None, help="SchedulerConfig.decode_steps (default: its own)")
    a = p.parse_args(argv)
    import numpy as np

    from ortllm.runtime import Engine, SamplingParams
    from ortllm.runtime.ops_library import ops_isa

    rng = np.random.default_rng(0)
    new = 64
    steps = {} if a.decode_steps is None else {"decode_steps": a.decode_steps}
    with Engine.from_artifact(a.artifact, max_num_seqs=max(a.batch, 1), threads=a.threads, spec_max_tokens=0,
                              enable_prefix_cache=a.cached, **steps) as engine:
        prompts = [rng.integers(100, engine.vocab_size, a.prompt).tolist() for _ in range(a.batch)]
        engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))   # warm-up
        best, first = 0.0, float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            t1 = time.perf_counter()
            engine.generate(prompts, SamplingParams(max_tokens=new + 1, temperature=0.0, ignore_eos=True))
            t2 = time.perf_counter()
            first = min(first, t1 - t0)
            best = max(best, a.batch * new / ((t2 - t1) - (t1 - t0)))
    print(f"{ops_isa()} B={a.batch} P={a.prompt}{' cached' if a.cached else ''}: decode {best:.1f} tok/s, "
          f"first token {first * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
