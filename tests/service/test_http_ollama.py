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
