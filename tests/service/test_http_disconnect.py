"""A client that leaves has its request cancelled and its KV freed within 1 s: 20 streams dropped after their first
chunk, and non-streaming requests dropped before their answer (raw sockets on a live server)."""
from __future__ import annotations

import json
import socket
import time


def _open(live, body: dict) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    raw = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
    return s


def _used(live) -> int:
    st = live.engine.stats()
    return st["kv_blocks_total"] - st["kv_blocks_free"]


def _settle(live, baseline: int) -> float:
    """Seconds until the KV blocks in use are back at baseline (fails after 10 s)."""
    t0 = time.monotonic()
    assert live.wait_idle_kv(baseline, timeout=10) <= baseline
    return time.monotonic() - t0


def test_twenty_dropped_streams_free_their_kv_within_a_second(smol_live):
    baseline = _used(smol_live)
    body = {"prompt": "Write a very long story about a dragon.", "max_tokens": 1500, "temperature": 0.8,
            "ignore_eos": True, "stream": True}
    socks = [_open(smol_live, body) for _ in range(20)]
    for s in socks:
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    assert _used(smol_live) > baseline
    for s in socks:
        s.close()
    assert _settle(smol_live, baseline) < 1.0
    assert smol_live.engine.stats()["running"] == 0


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
