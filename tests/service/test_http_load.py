"""Load, overload, a cancellation flood and injected model-run faults, against a live server."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from ortllm.service.config import ServiceConfig

PROMPTS = [f"prompt number {i} says {'ab' * i}" for i in range(16)]
BODY = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}


def _stream_text(url: str, body: dict, timeout: float = 60) -> str:
    text = ""
    with requests.post(url + "/v1/completions", json={**body, "stream": True}, stream=True, timeout=timeout) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                ev = json.loads(line[6:])
                assert "error" not in ev, ev
                text += "".join(c["text"] for c in ev["choices"])
    return text


def test_32_clients_x_10_requests(tiny_live):
    """Streaming and not, interleaved: zero failures, each greedy output equal to its single-request output."""
    alone = {p: tiny_live.complete(p, **BODY)["choices"][0]["text"] for p in PROMPTS}
    failures: list[str] = []

    def client(c: int) -> int:
        done = 0
        for i in range(10):
            p = PROMPTS[(c * 10 + i) % len(PROMPTS)]
            try:
                if (c + i) % 2:
                    got = _stream_text(tiny_live.url, {"prompt": p, **BODY})
                else:
                    got = tiny_live.complete(p, **BODY)["choices"][0]["text"]
                if got != alone[p]:
                    failures.append(f"client {c} request {i}: {got!r} != {alone[p]!r}")
                done += 1
            except Exception as e:  # noqa: BLE001 - collected and reported below
                failures.append(f"client {c} request {i}: {type(e).__name__}: {e}")
        return done

    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        done = sum(pool.map(client, range(32)))
    elapsed = time.perf_counter() - t0
    assert not failures, failures[:5]
    assert done == 320
    print(f"320 requests from 32 clients in {elapsed:.1f} s")
    metrics = tiny_live.get("/metrics").text
    assert 'ortllm_requests_total{endpoint="completions",finish_reason="length",model="llama-tiny-random"}' in metrics


def test_overload_429_then_recovers(tiny_engine, make_live):
    """max_queued=N: with one request running and N queued, the next gets 429 at once; the service recovers."""
    n = 3
    live = make_live(tiny_engine, ServiceConfig(http_threads=16), num_blocks=64, max_num_seqs=1, max_queued=n)
    real_execute = live.engine.runner.execute

    def slow_execute(*a, **k):          # a slower model: the running request holds its slot for seconds
        time.sleep(0.02)
        return real_execute(*a, **k)
    live.engine.runner.execute = slow_execute
    streams: list[requests.Response] = []
    try:
        long = {"prompt": "a long one", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
        first = requests.post(live.url + "/v1/completions", json=long, stream=True, timeout=60)
        streams.append(first)
        lines = first.iter_lines()                   # (keep a reference: a collected iterator hangs up)
        next(lines)                                  # its first chunk: it is running
        pool = ThreadPoolExecutor(n)
        for _ in range(n):
            pool.submit(lambda: streams.append(requests.post(live.url + "/v1/completions", json=long,
                                                             stream=True, timeout=60)))
        end = time.monotonic() + 10
        while live.engine.stats()["waiting"] < n and time.monotonic() < end:
            time.sleep(0.02)
        assert live.engine.stats()["waiting"] == n
        t0 = time.perf_counter()
        r = live.post("/v1/completions", json={"prompt": "one too many", "max_tokens": 2})
        assert r.status_code == 429 and time.perf_counter() - t0 < 1.0
        assert r.json()["error"]["type"] == "rate_limit_error" and r.headers["Retry-After"] == "1"
        live.engine.runner.execute = real_execute
        for s in streams:
            s.close()                                # clients walk away: their generations are cancelled
        pool.shutdown(wait=True)                     # the queued ones get their turn (their headers) ...
        for s in streams:
            s.close()                                # ... and walk away too
        end = time.monotonic() + 10
        while (live.engine.stats()["waiting"] or live.engine.stats()["running"]) and time.monotonic() < end:
            time.sleep(0.05)
        r = live.post("/v1/completions", json={"prompt": "after the storm", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert live.get("/health").status_code == 200
    finally:
        for s in streams:
            s.close()


def test_cancellation_flood(tiny_live):
    """100 streams abandoned after 0.5 s: a new request completes within 5 s, KV blocks return to baseline."""
    s = tiny_live.engine.stats()
    baseline = s["kv_blocks_total"] - s["kv_blocks_free"]
    opened = []

    def abandon(i: int) -> None:
        body = {"prompt": f"flood {i} " * 4, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
        with requests.post(tiny_live.url + "/v1/completions", json=body, stream=True, timeout=30) as r:
            opened.append(r.status_code)
            end = time.monotonic() + 0.5
            for _ in r.iter_content(chunk_size=None):
                if time.monotonic() > end:
                    break
        # leaving the with-block closes the connection mid-stream

    with ThreadPoolExecutor(100) as pool:
        list(pool.map(abandon, range(100)))
    assert opened.count(200) == 100
    t0 = time.perf_counter()
    r = tiny_live.post("/v1/completions", json={"prompt": "still there?", "max_tokens": 8, "temperature": 0}, timeout=5)
    assert r.status_code == 200 and time.perf_counter() - t0 < 5
    used = tiny_live.wait_idle_kv(baseline, timeout=10)
    assert used <= baseline, f"{used} KV blocks still in use (baseline {baseline})"
    stats = tiny_live.engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert 'ortllm_requests_total{endpoint="completions",finish_reason="cancelled"' in tiny_live.get("/metrics").text


def test_injected_model_run_failures(tiny_live):
    """While steps fail (a real ORT error from a bad block table), those requests get errors (503 / an error
    event in the stream) and /health says degraded; afterwards requests succeed and /health recovers."""
    engine = tiny_live.engine
    real_execute = engine.runner.execute
    armed = threading.Event()
    armed.set()

    def execute_with_bad_block(seqs, *a, **k):
        if armed.is_set():
            seqs[0].block_ids = [10 ** 6]
        return real_execute(seqs, *a, **k)

    engine.runner.execute = execute_with_bad_block
    try:
        r = tiny_live.post("/v1/completions", json={"prompt": "doomed", "max_tokens": 8})
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "model_run_failed" and "block" in err["message"]
        with tiny_live.post("/v1/completions", json={"prompt": "doomed", "max_tokens": 8, "stream": True},
                            stream=True) as s:
            events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith(b"data: {")]
        assert events[-1]["error"]["code"] == "model_run_failed"
        h = tiny_live.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "degraded"
    finally:
        armed.clear()
        engine.runner.execute = real_execute
    assert tiny_live.complete("healthy again", max_tokens=4)["choices"][0]["text"] is not None
    end = time.monotonic() + 5
    while tiny_live.get("/health").status_code != 200 and time.monotonic() < end:
        time.sleep(0.1)
    assert tiny_live.get("/health").json()["status"] == "ok"
    s = engine.stats()
    assert s["kv_blocks_free"] == s["kv_blocks_total"]


def test_request_timeout_cancels(tiny_engine, make_live):
    """Past request_timeout_s the generation is cancelled: 504 (or an error event in a stream), blocks freed."""
    live = make_live(tiny_engine, ServiceConfig(request_timeout_s=0.5), num_blocks=64)
    real_execute = live.engine.runner.execute

    def slow_execute(*a, **k):
        time.sleep(0.01)
        return real_execute(*a, **k)
    live.engine.runner.execute = slow_execute
    body = {"prompt": "slow", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    r = live.post("/v1/completions", json=body)
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
    assert time.perf_counter() - t0 < 3
    with live.post("/v1/completions", json={**body, "stream": True}, stream=True) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith(b"data: {")]
    assert events[-1]["error"]["code"] == "request_timeout"
    live.engine.runner.execute = real_execute
    assert live.wait_idle_kv(0) == 0
