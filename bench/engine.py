"""Engine scenarios on one artifact: single-stream and batched decode, prefill 512, Python share of a step.

Decode throughput of a batch = tokens generated after the last request's first token / the time since then
(decode_rate: tokens that early requests made while later ones were still in prefill are not counted);
prefill = seconds until the first token of a 512-token prompt. Medians over `repeats` runs.
KV bytes per token and peak RSS are the `memory` scenario (ortllm.bench.memory), in a fresh process.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

from .results import row

PROMPT_LEN, NEW_TOKENS = 64, 128
# Throughput scenarios measure plain decoding, one token per row per step, as the peers do: speculative
# decoding (on by default) would draft from the repetitive text a model makes after a random prompt and
# measure that instead. The `speculative` scenario (bench/speculative.py) measures drafts on vs off.
PLAIN = {"spec_max_tokens": 0}


def decode_rate(handles, end: float) -> float:
    """Aggregate decode tok/s once every request of the batch has its first token: tokens stamped after the
    last first-token time / (end - that time)."""
    first = max(h.first_token_time for h in handles)
    return sum(1 for h in handles for t in h.token_times if t > first) / (end - first)


def decode_run(engine: Engine, batch: int, rng, adapters=(None,), new_tokens: int = NEW_TOKENS) -> tuple[float, float]:
    """One batch of `batch` greedy requests (request i on adapters[i % len(adapters)]); returns (aggregate
    decode tok/s after the last prefill, Python share of the steps)."""
    vocab = engine.vocab_size
    before = engine.stats()
    handles = [engine.submit(rng.integers(3, vocab, PROMPT_LEN).tolist(),
                             SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                                            adapter=adapters[i % len(adapters)])) for i in range(batch)]
    outs = [h.result() for h in handles]
    end = time.monotonic()
    after = engine.stats()
    if any(len(o.token_ids) != new_tokens for o in outs):
        raise RuntimeError(f"generated {[len(o.token_ids) for o in outs]} tokens per request, wanted {new_tokens}")
    step, run = after["step_time_s"] - before["step_time_s"], after["run_time_s"] - before["run_time_s"]
    return decode_rate(handles, end), (1 - run / step) if step else 0.0


def run(artifact: Path, batches=(1, 4, 8, 16, 32), repeats: int = 3, threads: int | None = None,
        system: str = "ortllm") -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    overrides = {"threads": threads} if threads else {}
    with Engine.from_artifact(artifact, max_num_seqs=max(batches), **PLAIN, **overrides) as engine:
        decode_run(engine, 1, rng)  # warm the allocator and caches
        for b in batches:
            tps, py = zip(*(decode_run(engine, b, rng) for _ in range(repeats)))
            name = "single-stream decode" if b == 1 else "batched decode"
            rows.append(row(name, system, b, "decode_tokens_per_s", list(tps), "tok/s"))
            rows.append(row(name, system, b, "python_share_of_step", list(py), "fraction"))
        n = min(512, engine.context_length - 2)   # tiny test models have short contexts
        once = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        ttft = []
        for _ in range(repeats):   # a fresh prompt each time: a repeated one would hit the prefix cache
            h = engine.submit(rng.integers(3, engine.vocab_size, n).tolist(), once)
            h.result()
            ttft.append(h.first_token_time - h.submitted)
        rows.append(row(f"prefill {n}", system, 1, "time_to_first_token", ttft, "s"))
    return rows
