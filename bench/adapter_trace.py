"""The multi-adapter trace that lora-trace replays on ortllm and on each peer (bench/trace_peers.py): arrivals,
prompts, lengths and adapters, and the figures of one replay."""
from __future__ import annotations

import numpy as np

TRACE_RATE = 4.0          # requests/s of run_trace's default trace
TRACE_SLOTS = 16          # concurrent sequences: ortllm's max_num_seqs, llama-server's --parallel


def make_trace(n_adapters: int, requests: int, rate: float, vocab: int, seed: int = 0) -> list[dict]:
    """Gamma arrivals (shape 2, mean gap 1/rate s), adapter index ~ Zipf(s=1) over n_adapters, prompts of 16-127
    random tokens, 16-95 new tokens: [{at (s from the start), prompt, max_tokens, adapter (index)}]. The same
    (n_adapters, requests, rate, seed) gives the same trace for every system."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, n_adapters + 1)
    zipf /= zipf.sum()
    gaps = rng.gamma(2.0, 1.0 / (2.0 * rate), requests)
    picks = rng.choice(n_adapters, requests, p=zipf)
    trace = []
    for at, k in zip(np.cumsum(gaps), picks):
        prompt = rng.integers(3, vocab, int(rng.integers(16, 128))).tolist()
        trace.append({"at": float(at), "prompt": prompt, "max_tokens": int(rng.integers(16, 96)), "adapter": int(k)})
    return trace


def trace_summary(ttft, latency, tokens: int, wall: float) -> dict:
    """The rows' figures of one replay: tok/s over the wall time and the percentiles of TTFT and latency (s)."""
    return {"throughput": tokens / wall, "ttft_p50": float(np.percentile(ttft, 50)),
            "ttft_p99": float(np.percentile(ttft, 99)), "latency_p50": float(np.percentile(latency, 50)),
            "latency_p99": float(np.percentile(latency, 99))}
