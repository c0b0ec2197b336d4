"""`ortllm serve` as a user runs it (a subprocess): the URL when ready, the API key, SIGTERM drains and exits 0.
Plus /health through loading, a failed load and a dead engine, and the /metrics names."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from ortllm.service.app import create_app
from ortllm.service.config import ServiceConfig

REPO = Path(__file__).resolve().parents[2]


def _ortllm() -> list[str]:
    exe = Path(sys.executable).with_name("ortllm")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "ortllm"]


def _start(artifact, *args) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*_ortllm(), "serve", str(artifact), "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    end = time.monotonic() + 90
    while time.monotonic() < end:
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        if m:
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"ortllm serve did not print its URL: {proc.stderr.read()[-2000:]}")


def test_serve_key_drain_and_exit(tiny_engine):
    proc, url = _start(tiny_engine, "--api-key", "sesame", "--max-queued", "16", "--threads", "1",
                       "--decode-steps", "2")
    auth = {"Authorization": "Bearer sesame"}
    try:
        assert requests.get(url + "/health", timeout=10).json()["status"] == "ok"
        r = requests.get(url + "/v1/models", timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = requests.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 401
        assert requests.get(url + "/v1/models", headers=auth, timeout=10).json()["data"][0]["id"] == "llama-tiny-random"

        # 8 long streams in flight, then SIGTERM: they finish, new requests get 503, the process exits 0
        results: list[tuple[str | None, bool]] = []

        def stream(i: int) -> None:
            body = {"prompt": f"drain {i}", "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
            finish, done = None, False
            with requests.post(url + "/v1/completions", json=body, headers=auth, stream=True, timeout=120) as r:
                for line in r.iter_lines():
                    if line == b"data: [DONE]":
                        done = True
                    elif line.startswith(b"data: {"):
                        for c in json.loads(line[6:]).get("choices", []):
                            finish = c["finish_reason"] or finish
            results.append((finish, done))
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        end = time.monotonic() + 30
        while requests.get(url + "/metrics", timeout=10).text.count("ortllm_requests_running 8.0") == 0:
            assert time.monotonic() < end, "the 8 streams never ran together"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 5
        while (h := requests.get(url + "/health", timeout=10)).status_code == 200:
            assert time.monotonic() < end
            time.sleep(0.02)
        assert h.json()["status"] == "draining"
        r = requests.post(url + "/v1/completions", json={"prompt": "late", "max_tokens": 2}, headers=auth, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "draining" and "Retry-After" in r.headers
        for t in threads:
            t.join(120)
        assert results == [("length", True)] * 8
        assert proc.wait(60) == 0
        out = proc.stdout.read()
        assert "stopped" in out
        logs = [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]
        assert any(rec["msg"] == "draining" for rec in logs)
        assert all("request_id" in rec for rec in logs if rec["msg"] == "generation finished")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_health_loading_then_ok_and_failed_load(tiny_engine, tmp_path):
    app = create_app(ServiceConfig(artifact=tiny_engine, engine_overrides={"num_blocks": 32}))
    res = app.extensions["ortllm"]
    try:
        client = app.test_client()
        first = client.get("/health")              # loading takes a second; the first probe lands in it
        assert first.status_code == 503 and first.get_json()["status"] == "loading"
        assert res.ready.wait(60)
        assert client.get("/health").status_code == 200
    finally:
        res.close()
    broken = create_app(ServiceConfig(artifact=tmp_path))
    broken.extensions["ortllm"].ready.wait(30)
    c = broken.test_client()
    h = c.get("/health")
    assert h.status_code == 503 and h.get_json()["status"] == "failed"
    r = c.get("/v1/models")
    assert r.status_code == 503 and r.get_json()["error"]["code"] == "load_failed"


def test_dead_engine_is_503(tiny_engine, make_live):
    live = make_live(tiny_engine, num_blocks=32)

    def broken_schedule():
        raise RuntimeError("injected fatal scheduler bug")
    live.engine.scheduler.schedule = broken_schedule
    r = live.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})     # this one meets the fatal error
    assert r.status_code == 503
    end = time.monotonic() + 5
    while live.engine.dead is None and time.monotonic() < end:
        time.sleep(0.02)
    h = live.get("/health")
    assert h.status_code == 503 and h.json()["status"] == "dead"
    r = live.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"


def test_metrics_names(tiny_live):
    tiny_live.complete("metrics", max_tokens=4)
    text = tiny_live.get("/metrics").text
    for name in ("ortllm_requests_running", "ortllm_requests_waiting", "ortllm_time_to_first_token_seconds_bucket",
                 "ortllm_inter_token_latency_seconds_bucket", "ortllm_e2e_request_latency_seconds_bucket",
                 "ortllm_request_queue_time_seconds_bucket", "ortllm_prompt_tokens_total",
                 "ortllm_generation_tokens_total", "ortllm_batch_size_mean", "ortllm_kv_blocks_in_use",
                 "ortllm_prefix_cache_hit_rate", 'ortllm_requests_total{endpoint="completions"'):
        assert name in text, name
    spec = tiny_live.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.") and "/v1/chat/completions" in spec["paths"]
