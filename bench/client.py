"""A streaming HTTP client of `/v1/completions`, timed per chunk: shared by `ortllm bench --scenario serve`
(ortllm.bench.serve) and `python -m ortllm.bench.http_engine`.

Standard library only (http.client), so the base install can run it. One request = one connection, greedy,
`ignore_eos`: every request generates exactly `max_tokens` tokens. The service sends one SSE chunk per text
delta (one per token, except where a UTF-8 character spans tokens), then a final chunk with the usage.
"""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from .errors import BenchError

FIRST_TOKEN = 3      # ids below 3 are special tokens in SmolLM2's vocabulary (as in ortllm.bench.engine)


class StreamError(BenchError):
    """The server answered with an HTTP error or an error chunk."""


@dataclass
class StreamResult:
    """Seconds on the client's clock (perf_counter), from just before the request was sent."""
    ttft: float                  # to the first chunk with text
    gaps: list[float]            # between successive chunks with text (inter-token latency, ITL)
    latency: float               # to the end of the stream ([DONE])
    tokens: int                  # completion_tokens of the final chunk's usage

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (latency - ttft) / (tokens - 1); None for one token."""
        return (self.latency - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


def random_prompts(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    """n prompts of `length` random token ids; a new seed per run keeps the prefix cache cold."""
    rng = np.random.default_rng(seed)
    return [rng.integers(FIRST_TOKEN, vocab, length).tolist() for _ in range(n)]


def stream_completion(url: str, prompt, max_tokens: int, timeout: float = 600.0, **body) -> StreamResult:
    """POST {url}/v1/completions with stream=True and time its chunks; raises StreamError or OSError."""
    u = urlsplit(url)
    payload = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                          "stream": True, **body}).encode()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise StreamError(f"HTTP {resp.status}: {resp.read(300).decode(errors='replace').strip()}")
        first = last = None
        gaps: list[float] = []
        tokens = 0
        for line in resp:                      # SSE: "data: {...}\n", blank line, ..., "data: [DONE]"
            if not line.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            ev = json.loads(line[6:])
            if "error" in ev:
                raise StreamError(ev["error"].get("message", str(ev["error"])))
            if any(c.get("text") for c in ev.get("choices", ())):
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
            if "usage" in ev:
                tokens = ev["usage"]["completion_tokens"]
        end = time.perf_counter()
    finally:
        conn.close()
    if first is None:
        raise StreamError(f"the stream ended without text ({tokens} tokens)")
    return StreamResult(first - t0, gaps, end - t0, tokens)
