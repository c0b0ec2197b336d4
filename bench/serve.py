"""`serve` scenario: HTTP load against a real `ortllm serve`: TTFT, TPOT, ITL, goodput (docs/architecture.md,
Benchmarks).

The server runs as a user runs it, in its own process (`ortllm serve ARTIFACT --host 127.0.0.1 --port 0`),
so the clients' Python never shares its GIL. Per concurrency level C: a closed loop of C client threads in the
bench process, each sending its next request when its last stream ended, until C x ROUNDS requests are done;
random 64-token prompts (fresh per request: no prefix-cache hits), 128 new tokens, greedy, ignore_eos. The
levels alternate within each repeat (C = 1, 4, 16, 1, 4, 16, ...) so drift on the machine hits all alike.

Per repeat and level, over the requests that completed:
  ttft_pXX   send -> first chunk with text, per request                                      ms
  tpot_pXX   (end of stream - first text) / (tokens - 1), per request                        ms
  itl_pXX    gaps between successive chunks with text, all requests pooled                   ms
  request_throughput     completed requests / wall (first send -> last stream end)           req/s
  output_tokens_per_s    completion tokens of all requests / wall                            tok/s
  goodput                requests with TTFT <= slo_ttft_ms and TPOT <= slo_tpot_ms / wall    req/s
  goodput_fraction       those requests / requests sent (a failed request is never good)     fraction
Rows carry median/min/max over repeats, and as extra keys the SLOs, the shape and the requests sent and
failed at that level over all repeats.
"""
from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ortllm.runtime.artifact import read_manifest

from .child_server import ChildServer
from .client import StreamResult, random_prompts, stream_completion
from .errors import BenchError
from .results import row

CONCURRENCY = (1, 4, 16)
PROMPT_TOKENS, MAX_TOKENS = 64, 128
ROUNDS, QUICK_ROUNDS = 4, 2           # requests per level = C x rounds
SLO_TTFT_MS, SLO_TPOT_MS = 1000.0, 100.0
PERCENTILES = (50, 90, 99)
_URL = re.compile(r"serving .* at (http://[\d.]+:\d+) ")


class ServeProcess(ChildServer):
    """`ortllm serve` in a child process (bench/child_server.py); ready once it printed its URL (model loaded and
    warmed up); exit drains it with SIGTERM."""
    name = "ortllm serve"

    def __init__(self, artifact: Path, log_path: Path, threads: int | None = None, http_threads: int = 64,
                 start_timeout: float = 600.0, grace: float = 20.0, parallel: int | None = None):
        super().__init__([sys.executable, "-m", "ortllm", "serve", str(artifact), "--host", "127.0.0.1", "--port", "0",
                          "--http-threads", str(http_threads), "--drain-timeout", "5",
                          "--spec-max-tokens", "0",   # random prompts: plain decoding (bench/engine.py, PLAIN)
                          *(["--threads", str(threads)] if threads else []),
                          *(["--parallel", str(parallel)] if parallel else [])],
                         log_path, start_timeout, grace)

    def _ready(self) -> str | None:
        m = _URL.search(self.log_path.read_text(errors="replace"))
        return m.group(1) if m else None

    def _exited_message(self) -> str:
        text = self.log_path.read_text(errors="replace")
        last = (text.strip().splitlines() or ["(no output)"])[-1].removeprefix("ortllm: error: ")
        return f"ortllm serve exited with {self.proc.returncode} before it was ready: {last} (log: {self.log_path})"


def run_load(url: str, prompts: list, max_tokens: int, concurrency: int,
             timeout: float = 600.0) -> tuple[float, list[StreamResult | str]]:
    """Closed loop: `concurrency` client threads send the prompts, each its next one when its last stream ended.
    Returns (wall seconds from the first send to the last stream end, per prompt a StreamResult or the error)."""
    results: list[StreamResult | str | None] = [None] * len(prompts)
    todo = iter(range(len(prompts)))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = stream_completion(url, prompts[i], max_tokens, timeout=timeout)
            except Exception as e:  # noqa: BLE001 - a failed request is counted (never good), not fatal
                results[i] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(concurrency, len(prompts)))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results


def summarize(wall: float, results: list, slo_ttft_ms: float = SLO_TTFT_MS,
              slo_tpot_ms: float = SLO_TPOT_MS) -> dict[str, float]:
    """One load run -> {metric: value} (module docstring); raises BenchError if no request completed."""
    ok = [r for r in results if isinstance(r, StreamResult)]
    if not ok:
        raise BenchError(f"no request completed; the first error: {results[0]}")
    series = {"ttft": [r.ttft * 1e3 for r in ok],
              "tpot": [r.tpot * 1e3 for r in ok if r.tpot is not None],
              "itl": [g * 1e3 for r in ok for g in r.gaps]}
    out = {f"{name}_p{q}": float(np.percentile(xs, q)) for name, xs in series.items() if xs for q in PERCENTILES}
    good = sum(r.ttft * 1e3 <= slo_ttft_ms and (r.tpot is None or r.tpot * 1e3 <= slo_tpot_ms) for r in ok)
    out["request_throughput"] = len(ok) / wall
    out["output_tokens_per_s"] = sum(r.tokens for r in ok) / wall
    out["goodput"] = good / wall
    out["goodput_fraction"] = good / len(results)
    return out


UNITS = {"ttft": "ms", "tpot": "ms", "itl": "ms", "request_throughput": "req/s", "output_tokens_per_s": "tok/s",
         "goodput": "req/s", "goodput_fraction": "fraction"}


def run(artifact: Path, concurrency=CONCURRENCY, repeats: int = 3, threads: int | None = None, quick: bool = False,
        slo_ttft_ms: float = SLO_TTFT_MS, slo_tpot_ms: float = SLO_TPOT_MS, log_dir: Path | None = None,
        progress=None) -> list[dict]:
    """Start `ortllm serve` on the artifact, warm it up, run `repeats` rounds over the concurrency levels, stop
    it (always). Rows {scenario "serve", system "ortllm", batch = concurrency, metric, median, min, max, unit}."""
    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    artifact = Path(artifact)
    vocab = read_manifest(artifact).model.vocab_size
    rounds = QUICK_ROUNDS if quick else ROUNDS
    levels = sorted({int(c) for c in concurrency})
    samples: dict[tuple[int, str], list[float]] = {}
    failed = {c: 0 for c in levels}
    log_path = Path(log_dir or tempfile.mkdtemp(prefix="ortllm-bench-serve-")) / "serve.log"
    with ServeProcess(artifact, log_path, threads=threads, http_threads=max(64, 2 * max(levels))) as server:
        warm = random_prompts(vocab, max(levels), PROMPT_TOKENS, seed=99_999)
        run_load(server.url, warm, 8, max(levels))                    # allocator and caches at the widest batch
        for r in range(repeats):
            for c in levels:
                prompts = random_prompts(vocab, c * rounds, PROMPT_TOKENS, seed=1000 * r + c)
                wall, results = run_load(server.url, prompts, MAX_TOKENS, c)
                bad = [x for x in results if not isinstance(x, StreamResult)]
                failed[c] += len(bad)
                if bad:
                    progress(f"warning: serve C={c}: {len(bad)} of {len(results)} requests failed: {bad[0]}")
                for metric, v in summarize(wall, results, slo_ttft_ms, slo_tpot_ms).items():
                    samples.setdefault((c, metric), []).append(v)
                progress(f"serve C={c} round {r + 1}/{repeats}: {samples[(c, 'output_tokens_per_s')][-1]:.4g} tok/s, "
                         f"TTFT p50 {samples[(c, 'ttft_p50')][-1]:.4g} ms")
    extra = {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "prompt_tokens": PROMPT_TOKENS,
             "max_tokens": MAX_TOKENS}
    return [row("serve", "ortllm", c, metric, xs, unit(metric), requests=c * rounds * repeats, failed=failed[c],
                **extra) for (c, metric), xs in samples.items()]     # requests and failed: over all repeats


def unit(metric: str) -> str:
    """ttft_p90 -> ms, goodput -> req/s, ..."""
    return UNITS.get(metric) or UNITS[metric.rsplit("_", 1)[0]]
