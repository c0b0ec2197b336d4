"""`ortllm serve --ray`: the service as a Ray Serve application on a local Ray instance (127.0.0.1, 2 CPUs),
2 engine replicas x 1 thread behind the adapter-aware router. Real engines, the real openai client.

The tiny model with 4 adapters carries the routing and failure tests (one deployment for the module); the
SmolLM2 test runs `ortllm serve --ray` as a user does and compares with the single-process server."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'ortllm[ray]'")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'ortllm[ray]'")

from ortllm.service.config import ServiceConfig                     # noqa: E402
from tests.service.ray_fixtures import ADAPTERS, ENGINE_OVERRIDES, free_port, zipf_trace  # noqa: E402

TIMEOUT_S = 60                      # any one HTTP request; a hung request fails the test instead of CI


@pytest.fixture(scope="module")
def ray_tiny(tiny_lora_artifact):
    """2 replicas x 1 thread; each replica holds 2 adapter slots (4 adapters do not fit in one)."""
    from ortllm.service import ray_serve
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - say why Ray cannot start here, and skip
        pytest.skip(f"a local Ray instance did not start: {type(e).__name__}: {e}")
    config = ServiceConfig(artifact=tiny_lora_artifact, port=free_port(), drain_timeout_s=5,
                           engine_overrides=ENGINE_OVERRIDES)
    try:
        url, _ = ray_serve.start(config, ray_serve.RayOptions(replicas=2, threads_per_replica=1))
        yield url
    finally:
        ray_serve.stop(True)


def post(url: str, path: str, body: dict, **kw) -> requests.Response:
    return requests.post(url + path, json=body, timeout=TIMEOUT_S, **kw)


def health(url: str) -> dict:
    return requests.get(url + "/health", timeout=TIMEOUT_S).json()


def test_openai_client_stream_and_not_through_two_replicas(ray_tiny):
    import openai
    client = openai.OpenAI(base_url=ray_tiny + "/v1", api_key="none", timeout=TIMEOUT_S, max_retries=0)
    ids = {m.id for m in client.models.list().data}
    assert set(ADAPTERS) <= ids
    full = client.completions.create(model="a1", prompt="one two three", max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True})
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="a1", prompt="one two three", max_tokens=12, temperature=0, stream=True,
        extra_body={"ignore_eos": True}))
    assert full.choices[0].text == streamed and full.usage.completion_tokens == 12
    chat = client.chat.completions.create(model="a2", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                          temperature=0)
    chat_streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="a2", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, stream=True))
    assert chat.choices[0].message.content == chat_streamed


def test_errors_are_the_single_process_envelope(ray_tiny):
    r = post(ray_tiny, "/v1/completions", {"prompt": "x", "max_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(ray_tiny, "/v1/completions", {"model": "nope", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = requests.post(ray_tiny + "/v1/chat/completions", data=b"{not json", timeout=TIMEOUT_S,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_zipf_trace_keeps_each_adapter_on_its_own_replica(ray_tiny):
    """4 adapters, 2 slots per replica: the router splits them 2 + 2 and keeps sending each to its holder."""
    trace = zipf_trace(48, seed=1)

    def one(i_name):
        i, name = i_name
        r = post(ray_tiny, "/v1/completions", {"model": name, "prompt": f"request {i}", "max_tokens": 8,
                                               "temperature": 0})
        assert r.status_code == 200, r.text
        return name, r.headers["X-Ortllm-Replica"]

    with ThreadPoolExecutor(4) as ex:
        served = list(ex.map(one, enumerate(trace)))
    where: dict[str, set] = {}
    for name, replica in served:
        where.setdefault(name, set()).add(replica)
    assert all(len(r) == 1 for r in where.values()), where         # each adapter on one replica
    assert len(set().union(*where.values())) == 2, where            # both replicas used
    holders = {name: next(iter(r)) for name, r in where.items()}
    end = time.monotonic() + 10          # residency arrives with the replicas' next routing stats (every 0.5 s)
    while True:
        resident = {r["replica"]: set(r.get("resident", ())) for r in health(ray_tiny)["replicas"]}
        if all(name in resident.get(rid, ()) for name, rid in holders.items()) or time.monotonic() > end:
            break
        time.sleep(0.25)
    metrics = requests.get(ray_tiny + "/metrics", timeout=TIMEOUT_S).text
    hits = sum(float(v) for v in re.findall(r'^ortllm_adapter_locality_hits_total\{replica="[^"]+"\} (\S+)',
                                            metrics, re.M))
    total = sum(float(v) for v in re.findall(
        r'^ortllm_adapter_locality_requests_total\{replica="[^"]+"\} (\S+)', metrics, re.M))
    print(f"\nadapter locality: {hits:.0f}/{total:.0f} = {hits / total:.3f}; resident per replica: {resident}; "
          f"adapters per replica: {where}")
    assert total >= 48 and hits / total >= 0.85
    for name, rid in holders.items():                                 # the holder has it resident now
        assert name in resident[rid], (name, resident)


def test_metrics_and_health_cover_every_replica(ray_tiny):
    h = health(ray_tiny)
    assert h["status"] == "ok" and len(h["replicas"]) == 2 and all(r["status"] == "ok" for r in h["replicas"])
    text = requests.get(ray_tiny + "/metrics", timeout=TIMEOUT_S).text
    replicas = set(re.findall(r'^ortllm_requests_running\{replica="([^"]+)"\}', text, re.M))
    assert replicas == {r["replica"] for r in h["replicas"]}


def test_429_only_when_every_replica_is_full(ray_tiny):
    """max_num_seqs 4 + max_queued 4 per replica: 24 long requests at once fill both; a 429 is the single
    process server's envelope, and requests beyond one replica's room were served by the other.

    A tiny-model request lasts well under a second, so a burst can drain a slot before the burst's last
    requests arrive: the requests run to the context's end (480 tokens) and a burst that never filled both
    replicas is sent again, at most 3 times."""
    body = {"prompt": "count", "max_tokens": 480, "temperature": 0, "ignore_eos": True}
    for _ in range(3):
        with ThreadPoolExecutor(24) as ex:
            rs = list(ex.map(lambda _: post(ray_tiny, "/v1/completions", body), range(24)))
        ok = [r for r in rs if r.status_code == 200]
        full = [r for r in rs if r.status_code == 429]
        assert len(ok) + len(full) == 24, [r.status_code for r in rs]
        if full:
            break
    assert full and full[0].json()["error"]["code"] == "overloaded" and full[0].headers["Retry-After"]
    assert len({r.headers["X-Ortllm-Replica"] for r in ok}) == 2 and len(ok) > 8


def test_killing_a_replica_mid_load_hangs_nothing(ray_tiny):
    """SIGKILL one replica's process under load: every request ends (200, or a clear 503 / stream error),
    /health says degraded, Serve restarts the replica, and the service keeps answering."""
    pids = {r["replica"]: r["pid"] for r in health(ray_tiny)["replicas"]}
    victim = sorted(pids)[0]

    def one(i):
        body = {"model": ADAPTERS[i % 4], "prompt": f"load {i}", "max_tokens": 400, "temperature": 0,
                "ignore_eos": True, "stream": i % 2 == 0}
        r = post(ray_tiny, "/v1/completions", body, stream=body["stream"])
        if not body["stream"]:
            return r.status_code, r.text
        lines = [ln for ln in r.iter_lines() if ln]
        return r.status_code, b"\n".join(lines).decode()

    t0 = time.monotonic()
    with ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(one, i) for i in range(16)]
        time.sleep(0.5)
        os.kill(pids[victim], signal.SIGKILL)
        seen = []
        end = time.monotonic() + 10
        while time.monotonic() < end and "degraded" not in seen:
            seen.append(health(ray_tiny)["status"])
        results = [f.result(timeout=TIMEOUT_S) for f in futs]
    assert time.monotonic() - t0 < TIMEOUT_S
    assert "degraded" in seen, seen
    for status, text in results:
        if status == 200 and text.startswith("data:"):
            assert text.endswith("data: [DONE]")
            if '"error"' in text:
                assert "replica_failed" in text
        else:
            # 429: the survivor alone was full (4 running + 4 queued), its own clear answer
            assert status == 200 or (status == 503 and "replica_failed" in text) or \
                (status == 429 and '"code":"overloaded"' in text), (status, text)
    print(f"\nafter the kill: {sum(s == 200 and 'error' not in t for s, t in results)}/16 completed whole")
    r = post(ray_tiny, "/v1/completions", {"prompt": "still there", "max_tokens": 4})
    assert r.status_code == 200
    end = time.monotonic() + 45                                      # Serve starts a new replica
    while time.monotonic() < end:
        h = health(ray_tiny)
        if h["status"] == "ok" and len(h["replicas"]) == 2:
            break
        time.sleep(0.5)
    assert h["status"] == "ok" and victim not in {r["replica"] for r in h["replicas"]}, h


@pytest.mark.slow
def test_cli_on_smollm2_equals_single_process_and_drains_on_sigterm(smollm2_engine, smol_live):
    """`ortllm serve ARTIFACT --ray` as a user runs it: greedy text equals the single-process server's
    (openai client, stream and not), and SIGTERM lets a request in flight finish before exit 0."""
    import openai
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ortllm", "serve", str(smollm2_engine), "--ray", "--port",
                             str(port), "--replicas", "2", "--threads-per-replica", "1", "--drain-timeout", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        end = time.monotonic() + 120
        lines = []
        while time.monotonic() < end and url is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if m := re.search(r"serving .*? at (http://\S+) ", line):
                url = m.group(1)
        assert url, "".join(lines)
        ray_client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=TIMEOUT_S, max_retries=0)
        one_client = openai.OpenAI(base_url=smol_live.url + "/v1", api_key="none", timeout=TIMEOUT_S,
                                   max_retries=0)
        prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
        for p in prompts:
            want = one_client.completions.create(model=smol_live.model, prompt=p, max_tokens=24, temperature=0)
            got = ray_client.completions.create(model=smol_live.model, prompt=p, max_tokens=24, temperature=0)
            assert got.choices[0].text == want.choices[0].text
            streamed = "".join(c.choices[0].text for c in ray_client.completions.create(
                model=smol_live.model, prompt=p, max_tokens=24, temperature=0, stream=True))
            assert streamed == want.choices[0].text
        msgs = [{"role": "user", "content": "Name three colors."}]
        want = one_client.chat.completions.create(model=smol_live.model, messages=msgs, max_tokens=24,
                                                  temperature=0)
        got = ray_client.chat.completions.create(model=smol_live.model, messages=msgs, max_tokens=24,
                                                 temperature=0)
        assert got.choices[0].message.content == want.choices[0].message.content

        # SIGTERM once a request is in flight at an engine (its first token has arrived; a fixed sleep raced with
        # a loaded machine): it runs to its end, then the server exits 0
        stream = ray_client.completions.create(model=smol_live.model, prompt="Tell a long story.", max_tokens=96,
                                               temperature=0, stream=True, stream_options={"include_usage": True},
                                               extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(c for c in chunks if c.choices and c.choices[0].text)
        proc.send_signal(signal.SIGTERM)
        rest = list(chunks)
        assert rest[-1].usage.completion_tokens == 96, rest[-3:]
        assert proc.wait(timeout=60) == 0
        out = proc.stdout.read()
        assert "ortllm: stopped" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_ray_options_are_checked():
    from ortllm.runtime.errors import ConfigError
    from ortllm.service.ray_serve import RayOptions
    with pytest.raises(ConfigError, match="both --min-replicas and --max-replicas"):
        RayOptions(min_replicas=1)
    with pytest.raises(ConfigError, match="1 <= min <= max"):
        RayOptions(min_replicas=3, max_replicas=2)
    with pytest.raises(ConfigError, match="threads_per_replica"):
        RayOptions(threads_per_replica=0)
    assert RayOptions(min_replicas=1, max_replicas=3).most_replicas == 3 and RayOptions().most_replicas == 2
