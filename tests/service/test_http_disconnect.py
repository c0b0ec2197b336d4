"""A client that leaves has its request cancelled and its KV freed within 1 s: 1, 10, 20 and 50 chat streams
dropped at once after their first chunk, 5 times each, read through /metrics as a monitor would; and
non-streaming requests dropped before their answer (raw sockets on a live server); and one stream dropped
mid-answer through each streaming API, counted as cancelled under its own endpoint."""
from __future__ import annotations

import json
import socket
import statistics
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

ROUNDS = 5
LIMIT_S = 1.0


def _open(live, body: dict, path: str = "/v1/completions") -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    raw = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    return s


def _gauges(live) -> dict[str, float]:
    """The engine gauges of GET /metrics (what a monitor scrapes)."""
    text = live.get("/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name in ("ortllm_kv_blocks_in_use", "ortllm_requests_running", "ortllm_requests_waiting")}


def _used(live) -> int:
    st = live.engine.stats()
    return st["kv_blocks_total"] - st["kv_blocks_free"]


def _settle(live, baseline: int) -> float:
    """Seconds until the KV blocks in use are back at baseline (fails after 10 s)."""
    t0 = time.monotonic()
    assert live.wait_idle_kv(baseline, timeout=10) <= baseline
    return time.monotonic() - t0


def _first_chunk(s: socket.socket) -> None:
    got = b""
    while b"data: " not in got:
        more = s.recv(4096)
        assert more, "the server closed a stream before its first chunk"
        got += more
    assert got.startswith(b"HTTP/1.1 200"), got[:200]


def _drop_round(live, n: int, baseline: dict[str, float]) -> float:
    """n chat streams, each read to its first chunk, closed at once while their prefill holds KV blocks; the
    seconds until /metrics shows the KV blocks in use back at baseline and nothing running or waiting."""
    body = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
            "max_tokens": 400, "temperature": 0.8, "ignore_eos": True, "stream": True}
    socks = [_open(live, body, "/v1/chat/completions") for _ in range(n)]
    try:
        for s in socks:
            _first_chunk(s)
        end = time.monotonic() + 30
        while True:                 # admitted: the engine holds their KV (the first step is running)
            g = _gauges(live)
            if g["ortllm_kv_blocks_in_use"] > baseline["ortllm_kv_blocks_in_use"] and g["ortllm_requests_running"]:
                break
            assert time.monotonic() < end, f"{n} streams never got KV blocks: {g}"
            time.sleep(0.01)
    finally:
        t0 = time.monotonic()
        for s in socks:
            s.close()
    while True:
        g = _gauges(live)
        dt = time.monotonic() - t0
        if g == baseline or dt > 30:
            return dt
        time.sleep(0.01)


@pytest.mark.parametrize("n", [1, 10, 20, 50])
def test_dropped_streams_cancelled_and_kv_freed_within_a_second(smol_live, n):
    """Issue 37: 20 chat streams dropped at once were freed after up to 7.3 s on a busy 2-core machine: the model
    run in progress (a 512-token prefill step) had to end before any cancellation took effect. The engine now
    ends a run whose rows were mostly cancelled (runtime/engine.py _StepAbort)."""
    live = smol_live
    live.wait_idle_kv(0)
    baseline = _gauges(live)
    assert baseline["ortllm_requests_running"] == 0 and baseline["ortllm_requests_waiting"] == 0
    times = [_drop_round(live, n, baseline) for _ in range(ROUNDS)]
    print(f"\n{n} streams dropped at once, {ROUNDS} rounds: KV back at baseline and nothing running after "
          f"median {statistics.median(times):.3f} s, max {max(times):.3f} s ({', '.join(f'{t:.3f}' for t in times)}); "
          f"aborted model runs so far: {live.engine.stats()['aborted_steps']}")
    assert max(times) < LIMIT_S, times
    assert live.engine.stats()["running"] == 0


def test_dropped_non_streaming_requests_are_cancelled(smol_live):
    baseline = _used(smol_live)
    socks = [_open(smol_live, {"prompt": "Count to a thousand:", "max_tokens": 1500, "ignore_eos": True,
                               "temperature": 0}) for _ in range(4)]
    end = time.monotonic() + 10
    while _used(smol_live) <= baseline and time.monotonic() < end:
        time.sleep(0.02)
    for s in socks:
        s.close()
    assert _settle(smol_live, baseline) < 1.0


# ---------------------------------------------------------------- a client that leaves alone (issue 47 item 5)
# Read in-process (engine stats), not over HTTP: a /metrics scrape is itself traffic that wakes the server.

def _freed_alone(live, s: socket.socket) -> float:
    """Seconds from closing s (the only open request) until the engine holds no KV block and runs nothing."""
    end = time.monotonic() + 30
    while _used(live) == 0:            # admitted: its prefill holds KV blocks
        assert time.monotonic() < end, "the request never got KV blocks"
        time.sleep(0.005)
    t0 = time.monotonic()
    s.close()
    while True:
        st = live.engine.stats()
        if st["kv_blocks_total"] == st["kv_blocks_free"] and st["running"] == 0 and st["waiting"] == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > 30:
            return float("inf")
        time.sleep(0.005)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-streaming"])
def test_the_only_request_dropped_is_freed_without_other_traffic(smol_live, stream):
    """Issue 47: the last of 10 streams dropped one after another was cancelled only 20.2 s later, when the next
    connection arrived, and a non-streaming chat whose client timed out ran on to 8162 tokens. Now the request's
    own wait polls its client's socket (lifecycle.ClientWatch): the only request, dropped with nothing else
    arriving, is cancelled and its KV freed within a second, 3 times over."""
    live = smol_live
    assert live.wait_idle_kv(0) == 0
    body = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
            "max_tokens": 1500, "ignore_eos": True, "stream": stream}
    times = []
    for _ in range(3):
        s = _open(live, body, "/v1/chat/completions")
        if stream:
            _first_chunk(s)
        times.append(_freed_alone(live, s))
    print(f"\nthe only {'stream' if stream else 'request'} dropped: freed after "
          f"{', '.join(f'{t:.3f}' for t in times)} s")
    assert max(times) < LIMIT_S, times


# ---------------------------------------------------------------- a stream dropped mid-answer, through each API
STORY = "Tell me a very long story about a dragon."
# API: (path, body, a line that only a generated delta carries, the endpoint label its requests are counted under)
STREAMS = {
    "openai-chat": ("/v1/chat/completions", {"max_tokens": 400, "messages": [{"role": "user", "content": STORY}]},
                    b'"delta"', "chat"),
    "messages": ("/v1/messages", {"max_tokens": 400, "messages": [{"role": "user", "content": STORY}]},
                 b"content_block_delta", "messages"),
    "responses": ("/v1/responses", {"input": STORY, "max_output_tokens": 400}, b"response.output_text.delta",
                  "responses"),
    "ollama-chat": ("/api/chat", {"options": {"num_predict": 400}, "messages": [{"role": "user", "content": STORY}]},
                    b'"message"', "chat"),
}


def _cancelled(live, endpoint: str) -> float:
    """ortllm_requests_total{endpoint=..., finish_reason="cancelled"} from /metrics, over every model."""
    return sum(s.value for f in text_string_to_metric_families(live.get("/metrics", timeout=10).text)
               for s in f.samples if s.name == "ortllm_requests_total"
               and s.labels.get("endpoint") == endpoint and s.labels.get("finish_reason") == "cancelled")


@pytest.mark.parametrize("api", list(STREAMS))
def test_a_stream_dropped_mid_answer_is_cancelled(smol_live, api):
    """A client that hangs up mid-stream cancels its generation (its Call) and frees its KV, through every API,
    counted once under the API's own endpoint label."""
    path, body, delta, endpoint = STREAMS[api]
    live = smol_live
    baseline = _used(live)
    before = _cancelled(live, endpoint)
    r = requests.post(live.url + path, stream=True, timeout=60,
                      json={"model": live.model, "stream": True, **body})
    assert r.status_code == 200, r.text
    assert any(delta in line for line in r.iter_lines())       # generating
    r.close()
    end = time.monotonic() + 2
    while time.monotonic() < end and (live.engine.stats()["running"] or _cancelled(live, endpoint) == before):
        time.sleep(0.05)
    assert _cancelled(live, endpoint) == before + 1 and live.engine.stats()["running"] == 0
    assert live.wait_idle_kv(baseline, timeout=1) <= baseline
