"""Several models behind one server (`ortllm serve NAME NAME ...`): routing by `model` through the real openai
client, loading on first use, idle unloading, LRU eviction under a memory budget that never takes a model a
request holds; the store's `ps` and `rm` seeing the server."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import requests

from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.runtime.session_manager import estimate_bytes
from ortllm.runtime.store import Store
from ortllm.service.app import create_app
from ortllm.service.config import ServiceConfig
from ortllm.service.server import HTTPServer
from tests.reference.peft_lora import make_peft_lora

OVERRIDES = {"num_blocks": 64}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, tiny_engine):
    """tiny:fp32 (with adapter `qv`) and tiny:int8 in a fresh store."""
    from ortllm.cli.build import build_artifact as build
    from ortllm.pipeline.build import BuildOptions
    from ortllm.pipeline.sources import load_model

    root = tmp_path_factory.mktemp("multi")
    fp32 = root / "fp32"
    shutil.copytree(tiny_engine, fp32)
    make_peft_lora(load_model("llama-tiny-random")[1], root / "lora", seed=3, r=8, targets=["q_proj", "v_proj"])
    add_adapter(fp32, root / "lora", "qv")
    int8 = root / "int8"
    build("llama-tiny-random", int8, BuildOptions(quant="int8"), log=lambda m: None)
    store = Store(root / "home")
    from ortllm.runtime.store import ModelRef
    store.put(fp32, ModelRef("tiny", "fp32"), source=str(fp32))
    store.put(int8, ModelRef("tiny", "int8"), source=str(int8))
    return store


def _metric(text: str, name: str, default: float | None = None, **labels) -> float:
    """The sample of `name` with exactly `labels`; `default` where the series is absent (else that fails)."""
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}(?:_total)?\{{{re.escape(lab)}\}} (\S+)$", text, re.M)
    if m is None and default is not None:
        return default
    assert m, (name, labels, text[:2000])
    return float(m.group(1))


def _want(path, prompt, adapter=None, n=6):
    with Engine.from_artifact(path, **OVERRIDES) as e:
        return e.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0, adapter=adapter))[0].text


def test_ortllm_serve_two_store_models_through_openai_client(two_models):
    import openai

    store = two_models
    env = {**os.environ, "ORTLLM_HOME": str(store.home)}
    proc = subprocess.Popen([sys.executable, "-m", "ortllm", "serve", "tiny:fp32", "tiny:int8", "--port", "0",
                             "--keep-alive", "6"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = None
        for line in proc.stdout:
            if m := re.search(r"at (http://127\.0\.0\.1:\d+)", line):
                url = m.group(1)
                break
        assert url, proc.stderr.read()
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        cards = {m.id: m.model_extra for m in client.models.list().data}
        assert set(cards) == {"tiny:fp32", "tiny:int8", "qv", "tiny:fp32:qv"}
        assert not any(c["loaded"] for c in cards.values())                  # nothing loaded before use
        assert cards["qv"]["parent"] == "tiny:fp32"

        answers = {}
        for model in ("tiny:fp32", "tiny:int8", "qv", "tiny:fp32:qv"):
            r = client.completions.create(model=model, prompt="abc", max_tokens=6, temperature=0)
            answers[model] = r.choices[0].text
            assert r.model == (model.split(":")[-1] if model.endswith("qv") else model)
        assert answers["tiny:fp32"] == _want(store.path("tiny:fp32"), "abc")
        assert answers["tiny:int8"] == _want(store.path("tiny:int8"), "abc")
        assert answers["qv"] == answers["tiny:fp32:qv"] == _want(store.path("tiny:fp32"), "abc", "qv")
        chat = client.chat.completions.create(model="tiny:int8", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4, temperature=0)
        assert chat.model == "tiny:int8"
        with pytest.raises(openai.NotFoundError, match="tiny:fp32:qv"):
            client.completions.create(model="tiny:fp16", prompt="abc", max_tokens=2)

        loaded = {m.id: m.model_extra["loaded"] for m in client.models.list().data}
        assert loaded["tiny:fp32"] and loaded["tiny:int8"]
        metrics = requests.get(url + "/metrics", timeout=10).text
        assert _metric(metrics, "ortllm_model_loaded", model="tiny:int8") == 1.0
        # loaded once, and again only after it idled out: a slow load of tiny:int8 on a loaded 2-core host (> 6 s
        # seen in a suite run) may idle tiny:fp32 out between the requests above; it must never load per request
        idled = _metric(metrics, "ortllm_model_unloads", 0.0, model="tiny:fp32", reason="idle")
        assert _metric(metrics, "ortllm_model_loads", model="tiny:fp32") == 1.0 + idled

        ps = subprocess.run([sys.executable, "-m", "ortllm", "ps"], env=env, capture_output=True, text=True)
        assert "tiny:fp32" in ps.stdout and "loaded" in ps.stdout and url in ps.stdout, ps.stdout
        rm = subprocess.run([sys.executable, "-m", "ortllm", "rm", "tiny:int8"], env=env, capture_output=True,
                            text=True)
        assert rm.returncode == 1 and "served by a running server" in rm.stderr, rm.stderr

        # keep-alive 6 s: then both go
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if not any(m.model_extra["loaded"] for m in client.models.list().data):
                break
            time.sleep(0.25)
        assert not any(m.model_extra["loaded"] for m in client.models.list().data)
        metrics = requests.get(url + "/metrics", timeout=10).text
        assert _metric(metrics, "ortllm_model_unloads", model="tiny:fp32", reason="idle") == idled + 1
        assert _metric(metrics, "ortllm_model_loaded", model="tiny:fp32") == 0.0
        again = client.completions.create(model="tiny:fp32", prompt="abc", max_tokens=6, temperature=0)
        assert again.choices[0].text == answers["tiny:fp32"]                  # loads again on use
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0
    assert not list((store.home / "servers").glob("*.json"))                   # ps forgets a stopped server


def test_memory_budget_evicts_lru_but_never_a_model_in_use(two_models):
    store = two_models
    a, b = store.path("tiny:fp32"), store.path("tiny:int8")
    ea, eb = estimate_bytes(a, **OVERRIDES), estimate_bytes(b, **OVERRIDES)
    budget = max(ea, eb) + min(ea, eb) // 2       # room for either one, never both
    config = ServiceConfig(models=(("A", a), ("B", b)), memory_budget_bytes=budget, engine_overrides=OVERRIDES)
    app = create_app(config)
    pool = app.extensions["ortllm"]
    server = HTTPServer(app, "127.0.0.1", 0, threads=8).start()
    def post(model, **kw):
        return requests.post(server.url + "/v1/completions", timeout=60,
                             json={"model": model, "prompt": "abc", "temperature": 0, **kw})
    try:
        assert post("A", max_tokens=4).status_code == 200
        assert post("B", max_tokens=4).status_code == 200                     # A (idle) made room for B
        assert pool.by_name["A"].engine is None and pool.by_name["A"].unloads["memory"] == 1

        stream = requests.post(server.url + "/v1/completions", stream=True, timeout=60, json={
            "model": "B", "prompt": "abc", "max_tokens": 400, "ignore_eos": True, "stream": True})
        chunks = stream.iter_lines()
        next(line for line in chunks if line.startswith(b"data: "))                    # B is generating
        refused = post("A", max_tokens=4)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "memory_budget", refused.text
        assert "Retry-After" in refused.headers
        rest = [line for line in chunks if line]
        assert rest[-1] == b"data: [DONE]" and not any(b'"error"' in line for line in rest)   # B's request finished
        assert post("A", max_tokens=4).status_code == 200                     # B idle now: evicted for A
        assert pool.by_name["B"].unloads["memory"] == 1
    finally:
        server.stop()
        pool.close()
