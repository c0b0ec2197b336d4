"""Adapters over HTTP: `model` selects one, /v1/models lists them with their parent, and POST/DELETE
/v1/adapters load and unload them at run time behind the API key."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.service.config import ServiceConfig
from tests.reference.peft_lora import make_peft_lora

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def lora_dirs(tmp_path_factory):
    from ortllm.pipeline.sources import load_model
    weights = load_model("llama-tiny-random")[1]
    base = tmp_path_factory.mktemp("loras")
    for k, targets in enumerate([["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"], ["o_proj"]]):
        make_peft_lora(weights, base / f"l{k}", seed=10 + k, r=8, targets=targets)
    return base


@pytest.fixture
def live_with_adapters(tiny_engine, lora_dirs, tmp_path, make_live):
    art = tmp_path / "art"
    shutil.copytree(tiny_engine, art)
    add_adapter(art, lora_dirs / "l0", "qv")
    add_adapter(art, lora_dirs / "l1", "mlp")
    return make_live(art, ServiceConfig(api_key=KEY, http_threads=32, allowed_paths=(lora_dirs,)), num_blocks=256)


def test_models_and_generation_through_openai_client(live_with_adapters):
    import openai
    live = live_with_adapters
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {live.model, "qv", "mlp"}
    assert models["qv"].model_extra["parent"] == live.model
    for model in (live.model, "qv", "mlp"):
        got = client.completions.create(model=model, prompt="abc", max_tokens=10, temperature=0)
        want = live.engine.generate(["abc"], SamplingParams(max_tokens=10, temperature=0.0,
                                                            adapter=None if model == live.model else model))[0]
        assert got.choices[0].text == want.text and got.model == model
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="abc", max_tokens=4)


def test_mixed_adapter_load_equals_single_requests(live_with_adapters):
    """32 concurrent clients x 10 requests over the base model and 2 adapters, streaming and not: no failure,
    each greedy output equal to the same request sent alone."""
    live = live_with_adapters
    models = [live.model, "qv", "mlp"]
    jobs = [(models[i % 3], f"prompt {i % 7}", i % 2 == 0) for i in range(320)]

    def run(job):
        model, prompt, stream = job
        r = live.post("/v1/completions", headers=AUTH, json={"model": model, "prompt": prompt, "max_tokens": 8,
                                                              "temperature": 0, "stream": stream})
        assert r.status_code == 200, r.text
        if not stream:
            return r.json()["choices"][0]["text"]
        import json
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])

    alone = {(m, p): run((m, p, False)) for m, p, _ in jobs}
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(run, jobs))
    assert results == [alone[(m, p)] for m, p, _ in jobs]


def test_load_and_unload_at_run_time(live_with_adapters, lora_dirs):
    live = live_with_adapters
    body = {"name": "late", "path": str(lora_dirs / "l2")}
    assert live.post("/v1/adapters", json=body).status_code == 401
    r = live.post("/v1/adapters", json=body, headers=AUTH)
    assert r.status_code == 201 and r.json()["parent"] == live.model
    assert live.post("/v1/adapters", json=body, headers=AUTH).status_code == 409
    bad = live.post("/v1/adapters", json={"name": "x", "path": str(lora_dirs / "nonexistent")}, headers=AUTH)
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    outside = live.post("/v1/adapters", json={"name": "x", "path": "/nonexistent"}, headers=AUTH)
    assert outside.status_code == 403 and "--allowed-path" in outside.json()["error"]["message"]
    out = live.post("/v1/completions", headers=AUTH, json={"model": "late", "prompt": "abc", "max_tokens": 6})
    assert out.status_code == 200 and out.json()["model"] == "late"

    assert live.server and live.post("/v1/completions", headers=AUTH,
                                     json={"model": "late", "prompt": "x", "max_tokens": 2}).status_code == 200
    r = requests_delete(live, "/v1/adapters/late")
    assert r.status_code == 200 and r.json()["deleted"] is True
    gone = live.post("/v1/completions", headers=AUTH, json={"model": "late", "prompt": "abc", "max_tokens": 6})
    assert gone.status_code == 404
    ids = [m["id"] for m in live.get("/v1/models", headers=AUTH).json()["data"]]
    assert "late" not in ids and "qv" in ids
    assert requests_delete(live, "/v1/adapters/late").status_code == 404


def test_adapter_management_needs_a_key_off_loopback(tiny_live, lora_dirs):
    """The one rule of service/auth.py (MANAGE): no key and a non-loopback bind -> 403 naming --api-key."""
    from ortllm.service.app import create_app
    config = ServiceConfig(host="0.0.0.0", allowed_paths=(lora_dirs,))
    client = create_app(config, engine=tiny_live.engine).test_client()
    r = client.post("/v1/adapters", json={"name": "x", "path": str(lora_dirs / "l0")})
    assert r.status_code == 403 and "--api-key" in r.get_json()["error"]["message"]


def requests_delete(live, path):
    import requests
    return requests.delete(live.url + path, headers=AUTH, timeout=30)


def test_playground_adapter_picker(live_with_adapters, browser, tmp_path):
    """The page lists the adapters from /v1/models and sends `model` for the one picked."""
    import os
    from pathlib import Path

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    live = live_with_adapters
    browser.get(live.url + "/")
    browser.find_element(By.ID, "api_key").send_keys(KEY)
    browser.execute_script("refresh()")
    wait = WebDriverWait(browser, 30, poll_frequency=0.1)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "adapter")).options) == 3)
    Select(browser.find_element(By.ID, "adapter")).select_by_value("mlp")
    Select(browser.find_element(By.ID, "mode")).select_by_value("completion")
    mt = browser.find_element(By.ID, "max_tokens")
    mt.clear()
    mt.send_keys("12")
    browser.find_element(By.ID, "prompt").send_keys("Once upon a time")
    browser.find_element(By.ID, "send").click()
    # the stream ended: the stats line has its final count (the random model's text may be only whitespace)
    wait.until(lambda d: " tokens · " in d.find_element(By.ID, "stats").text)
    wait.until(lambda d: d.find_element(By.ID, "send").is_enabled())
    out = browser.execute_script("return document.getElementById('output').textContent")
    prompt = "Once upon a time"   # the random model ends "abc" at once, with and without the adapter
    want = live.post("/v1/completions", headers=AUTH, json={"model": "mlp", "prompt": prompt, "max_tokens": 12,
                                                             "temperature": 0}).json()["choices"][0]["text"]
    base = live.post("/v1/completions", headers=AUTH, json={"prompt": prompt, "max_tokens": 12,
                                                             "temperature": 0}).json()["choices"][0]["text"]
    assert out == want and want != base
    shot = Path(os.environ.get("ORTLLM_TEST_ARTIFACTS", tmp_path)) / "playground-adapter.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shot))


def test_adapter_mixes_over_openai_ollama_and_anthropic(live_with_adapters):
    """`adapters` {name: weight} in an OpenAI (extra_body), Ollama or Anthropic body: the engine's mix, the same
    greedy text on every API; bad mixes are 400s naming the field (an unknown adapter a 404, as in `model`);
    /openapi.json declares it."""
    import anthropic
    import openai
    live = live_with_adapters
    mix = {"qv": 0.6, "mlp": -0.4}
    want = live.engine.generate(["abc"], SamplingParams(max_tokens=8, temperature=0.0, adapters=mix))[0]
    plain = live.engine.generate(["abc"], SamplingParams(max_tokens=8, temperature=0.0))[0]
    assert want.token_ids != plain.token_ids, "the mix must change the tokens"
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY)
    got = client.completions.create(model=live.model, prompt="abc", max_tokens=8, temperature=0,
                                    extra_body={"adapters": mix})
    assert got.choices[0].text == want.text
    r = live.post("/api/generate", headers=AUTH, json={"model": live.model, "prompt": "abc", "raw": True,
                                                       "stream": False, "adapters": mix,
                                                       "options": {"temperature": 0, "num_predict": 8}})
    assert r.status_code == 200 and r.json()["response"] == want.text, r.text
    msgs = anthropic.Anthropic(base_url=live.url, api_key=KEY).messages.create(
        model=live.model, max_tokens=8, messages=[{"role": "user", "content": "abc"}],
        extra_body={"adapters": mix, "temperature": 0})
    oai = client.chat.completions.create(model=live.model, max_tokens=8, temperature=0,
                                         messages=[{"role": "user", "content": "abc"}], extra_body={"adapters": mix})
    assert msgs.content[0].text == oai.choices[0].message.content
    for body, status, needle in (
            ({"adapters": {f"a{i}": 0.1 for i in range(5)}}, 400, "adapters"),
            ({"adapters": {"qv": 0.5, "nope": 0.5}}, 404, "'nope', which is not an adapter of this model"),
            ({"adapters": {"qv": "x"}}, 400, "adapters"),
            ({"model": "qv", "adapters": {"mlp": 0.5}}, 400, "name the base model in model")):
        r = live.post("/v1/completions", headers=AUTH, json={"model": live.model, "prompt": "abc", "max_tokens": 2,
                                                             **body})
        assert r.status_code == status and r.json()["error"]["param"] == "adapters" and needle in r.text, r.text
    for weight, needle in (("NaN", "NaN is not valid JSON"), ("1e999", "1e999 is out of range")):
        r = live.post("/v1/completions", headers={**AUTH, "Content-Type": "application/json"},     # non-finite
                      data='{"prompt": "abc", "max_tokens": 2, "adapters": {"qv": %s}}' % weight)
        assert r.status_code == 400 and needle in r.text, r.text
    schema = live.get("/openapi.json").json()["components"]["schemas"]
    for body in ("CompletionRequest", "ChatCompletionRequest", "OllamaChatRequest", "MessagesRequest"):
        assert "adapters" in schema[body]["properties"], body
