"""`http-engine` scenario: 16 concurrent streams through the service vs the same engine driven in-process.

    ortllm bench ARTIFACT --scenario http-engine [--batches 16] [--repeats 3] [--threads N] --out DIR

One engine, one run, alternating: (a) in-process: `streams` requests submitted at once, each iterated for its
deltas on its own thread, as the service does; (b) HTTP: the service on that engine (waitress, 127.0.0.1), with
`streams` streaming clients in a separate process (so client-side JSON parsing does not take the server's GIL).
Greedy, ignore_eos, fixed random prompts: both sides generate exactly streams x max_tokens tokens. Reported:
aggregate generated tokens/s for both, their ratio, and the HTTP clients' TTFT and inter-chunk latency.
A benchmark, not a test; figures go to docs/notes/service.md with the machine and the command.
"""
from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

import numpy as np

STREAMS = 16                # concurrent streams unless --batches names others


def _in_process(engine, prompts, max_tokens: int) -> tuple[float, int]:
    from ortllm.runtime.sampling_params import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    counts = [0] * len(prompts)
    t0 = time.perf_counter()
    handles = [engine.submit(p, params) for p in prompts]

    def drain(i: int) -> None:
        for _ in handles[i]:
            pass
        counts[i] = len(handles[i].result().token_ids)
    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, sum(counts)


def _client_proc(url: str, prompts, max_tokens: int, go, results) -> None:
    """Runs in a child process: one streaming client thread per prompt, started together on `go`."""
    from ortllm.bench.client import stream_completion

    out = [None] * len(prompts)

    def one(i: int) -> None:
        r = stream_completion(url, prompts[i], max_tokens)
        out[i] = (r.ttft, r.gaps, r.tokens)

    while True:
        cmd = go.get()
        if cmd is None:
            return
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.put((time.perf_counter() - t0, list(out)))


def run(artifact: Path, streams: int = STREAMS, prompt_tokens: int = 64, max_tokens: int = 128, repeats: int = 3,
        threads: int | None = None) -> list[dict]:
    from ortllm.bench.client import random_prompts
    from ortllm.bench.engine import PLAIN
    from ortllm.bench.results import row
    from ortllm.runtime.engine import Engine

    from ortllm.service.app import create_app
    from ortllm.service.config import ServiceConfig
    from ortllm.service.server import HTTPServer

    overrides = {"max_num_seqs": max(streams, 1), **PLAIN}
    if threads:
        overrides["threads"] = threads
    engine = Engine.from_artifact(artifact, **overrides)
    app = create_app(ServiceConfig(http_threads=max(2 * streams, 8)), engine=engine)
    server = HTTPServer(app, "127.0.0.1", 0, threads=max(2 * streams, 8)).start()
    ctx = mp.get_context("spawn")
    go, results = ctx.Queue(), ctx.Queue()
    prompts = random_prompts(engine.vocab_size, streams, prompt_tokens, seed=0)
    proc = ctx.Process(target=_client_proc, args=(server.url, prompts, max_tokens, go, results), daemon=True)
    proc.start()
    eng_tps, http_tps, ratio, ttft, itl = [], [], [], [], []
    try:
        _in_process(engine, prompts[:2], 8)                         # warm up both paths
        go.put(1)
        results.get(timeout=600)
        for _ in range(repeats):
            wall, n = _in_process(engine, prompts, max_tokens)
            eng_tps.append(n / wall)
            go.put(1)
            wall_h, per = results.get(timeout=600)
            n_h = sum(p[2] for p in per)
            assert n_h == n == streams * max_tokens, (n_h, n)
            http_tps.append(n_h / wall_h)
            ratio.append(http_tps[-1] / eng_tps[-1])
            ttft += [p[0] for p in per]
            itl += [g for p in per for g in p[1]]
    finally:
        go.put(None)
        proc.join(30)
        server.stop()
        engine.close()
    scen = f"http {streams} streams ({prompt_tokens}-token prompts, {max_tokens} new)"
    pct = lambda xs, q: float(np.percentile(xs, q))  # noqa: E731
    return [
        row(scen, "ortllm engine (in-process)", streams, "decode_tokens_per_s", eng_tps, "tok/s"),
        row(scen, "ortllm service (HTTP, SSE)", streams, "decode_tokens_per_s", http_tps, "tok/s"),
        row(scen, "service / engine", streams, "throughput_ratio", ratio, "ratio"),
        *(row(scen, "ortllm service (HTTP, SSE)", streams, f"{name}_p{q}", [pct(xs, q)], "s")
          for name, xs in (("ttft", ttft), ("inter_chunk", itl)) for q in (50, 95)),
    ]
