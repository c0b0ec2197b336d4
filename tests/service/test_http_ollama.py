"""Ollama's API through the official `ollama` client against a live server on 127.0.0.1 (the real SmolLM2)."""
from __future__ import annotations

import json

import jsonschema
import ollama
import pytest


def _client(live) -> ollama.Client:
    return ollama.Client(host=live.url, timeout=120)


def test_generate_and_chat(smol_live):
    c = _client(smol_live)
    r = c.generate(model=smol_live.model, prompt="What is the capital of France?",
                   options={"temperature": 0, "num_predict": 12})
    assert r.done and r.response and r.eval_count <= 12 and r.prompt_eval_count > 0
    parts = list(c.generate(model=smol_live.model, prompt="What is the capital of France?", stream=True,
                            options={"temperature": 0, "num_predict": 12}))
    assert parts[-1].done and "".join(p.response for p in parts) == r.response     # streamed == non-streamed
    msgs = [{"role": "user", "content": "Say hello."}]
    r = c.chat(model=smol_live.model, messages=msgs, options={"temperature": 0, "num_predict": 10, "seed": 1})
    assert r.message.role == "assistant" and r.message.content
    parts = list(c.chat(model=smol_live.model, messages=msgs, stream=True,
                        options={"temperature": 0, "num_predict": 10}))
    assert len(parts) > 2 and "".join(p.message.content for p in parts) == r.message.content


def test_format_json_and_schema(smol_live):
    c = _client(smol_live)
    r = c.chat(model=smol_live.model, messages=[{"role": "user", "content": "A cat as JSON"}], format="json",
               options={"temperature": 0, "num_predict": 200})
    assert isinstance(json.loads(r.message.content), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
              "required": ["name", "legs"], "additionalProperties": False}
    r = c.generate(model=smol_live.model, prompt="A cat as JSON", format=schema,
                   options={"temperature": 0, "num_predict": 100})
    jsonschema.validate(json.loads(r.response), schema)


def test_models_listing(smol_live):
    c = _client(smol_live)
    names = [m.model for m in c.list().models]
    assert names[0] == smol_live.model and set(smol_live.engine.adapters.names()) <= set(names)
    assert c.show(smol_live.model).modelinfo["llama.context_length"] == smol_live.engine.context_length
    assert [m.model for m in c.ps().models] == names
    assert smol_live.get("/api/version").json()["version"]


def test_errors(smol_live):
    c = _client(smol_live)
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="no-such-model", prompt="x")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model=smol_live.model, prompt="x", options={"temperature": -1}, stream=False)
    assert e.value.status_code == 400 and "temperature" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model=smol_live.model, prompt="x", format={"type": "strin"}, stream=False)
    assert e.value.status_code == 400


def test_json_without_content_type(smol_live):
    """Issue 37: Ollama's documentation sends `curl URL -d '{...}'` (curl's default Content-Type is
    application/x-www-form-urlencoded) and Ollama reads the body as JSON; /api/* did answer 415. The OpenAI
    routes still ask for application/json."""
    import shutil
    import subprocess

    import requests

    body = json.dumps({"model": smol_live.model, "messages": [{"role": "user", "content": "Say hello."}],
                       "stream": False, "options": {"temperature": 0, "num_predict": 8}})
    r = requests.post(smol_live.url + "/api/chat", data=body.encode(), timeout=60)     # no Content-Type at all
    assert "Content-Type" not in r.request.headers
    assert r.status_code == 200 and r.json()["message"]["content"] and r.json()["done"], r.text
    if shutil.which("curl"):                              # the documentation's own command
        out = subprocess.run(["curl", "-s", smol_live.url + "/api/chat", "-d", body], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        assert json.loads(out)["message"] == r.json()["message"]
    lines = requests.post(smol_live.url + "/api/generate", timeout=60, data=json.dumps(
        {"model": smol_live.model, "prompt": "Say hello.", "options": {"num_predict": 4}}), stream=True)
    assert lines.status_code == 200 and json.loads(list(lines.iter_lines())[-1])["done"]
    r = requests.post(smol_live.url + "/api/chat", data=b"{not json", timeout=60)
    assert r.status_code == 400 and "not valid JSON" in r.text
    r = requests.post(smol_live.url + "/v1/chat/completions", data=body.encode(), timeout=60)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
