"""/openapi.json on a live server (the real SmolLM2, an adapter in the artifact, an API key): every route the app
serves is in it, it is valid OpenAPI 3.1, `model` lists what is served when it is asked for, and each request
body's schema is the parser's: a body of only its required fields is accepted, and one without any of them is a
400 naming that field."""
from __future__ import annotations

import copy
import re
import shutil

import jsonschema
import pytest
import requests

from ortllm.runtime.adapter_files import add_adapter
from ortllm.service.config import ServiceConfig
from tests.reference.peft_lora import make_peft_lora

KEY = "doc-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    from ortllm.pipeline.sources import load_model
    out = tmp_path_factory.mktemp("lora") / "qv"
    make_peft_lora(load_model("smollm2-135m-instruct")[1], out, seed=3, r=8, targets=["q_proj", "v_proj"])
    return out


@pytest.fixture(scope="module")
def doc_live(smollm2_engine, lora, tmp_path_factory):
    from tests.service.conftest import start_live, stop_live
    art = tmp_path_factory.mktemp("doc") / "art"
    shutil.copytree(smollm2_engine, art)
    add_adapter(art, lora, "tuned")
    # max_model_len bounds a chat without max_tokens (it fills the room left): minimal bodies stay short
    live = start_live(art, ServiceConfig(api_key=KEY, allowed_paths=(lora.parent,)), num_blocks=128,
                      max_model_len=192)
    yield live
    stop_live(live)


def _spec(live) -> dict:
    r = live.get("/openapi.json")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    return r.json()


def _resolve(node, spec):
    """The schema with every $ref to #/components/schemas inlined."""
    if isinstance(node, dict):
        if "$ref" in node:
            return _resolve(spec["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]], spec)
        return {k: _resolve(v, spec) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, spec) for v in node]
    return node


def _minimal(s: dict):
    """The smallest value a schema accepts, from its required parts only (first enum value, first alternative)."""
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return next(v for v in s["enum"] if v is not None)
    if "anyOf" in s and s.get("type") != "object":
        return _minimal(next(b for b in s["anyOf"] if b.get("type") != "null"))
    t = s.get("type")
    t = next(x for x in t if x != "null") if isinstance(t, list) else t
    if t == "object":
        required = list(s.get("required", [])) + (s["anyOf"][0]["required"] if "anyOf" in s else [])
        out = {k: _minimal(s["properties"][k]) for k in required}
        for rule in s.get("allOf", []):       # if/then: what the value chosen so far needs too
            if "if" in rule and jsonschema.Draft202012Validator(rule["if"]).is_valid(out):
                out.update({k: _minimal(s["properties"][k]) for k in rule["then"].get("required", []) if k not in out})
        return out
    if t == "array":
        return [_minimal(s.get("items", {}))] * s.get("minItems", 0)
    if t == "string":
        return "x" * max(1, s.get("minLength", 1))
    if t in ("integer", "number"):
        return s.get("minimum", 0)
    if t == "boolean":
        return False
    raise AssertionError(f"no minimal value for {s}")


STORE_ROUTES = {"/api/pull", "/api/delete", "/api/copy", "/api/create"}


def _delete(live, adapter: str) -> None:
    r = requests.delete(f"{live.url}/v1/adapters/{adapter}", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text


def _bodies(spec: dict):
    """(method, path, resolved request body schema) for every operation that takes a body."""
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if "requestBody" in op:
                yield method, path, _resolve(op["requestBody"]["content"]["application/json"]["schema"], spec)


def test_every_route_is_documented_and_the_document_is_valid(doc_live):
    from openapi_spec_validator import validate

    spec = _spec(doc_live)
    validate(spec)                                   # OpenAPI 3.1, its schemas included
    assert spec["openapi"].startswith("3.1")
    routes = 0
    for rule in doc_live.app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[a-z]+:)?(\w+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            op = spec["paths"].get(path, {}).get(method.lower())
            assert op is not None, f"{method} {path} is served but not in /openapi.json"
            assert op["summary"] and op["responses"]
            routes += 1
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/adapters", "/v1/adapters/{name}",
                 "/api/generate", "/api/chat", "/api/tags", "/api/show", "/api/ps", "/api/version", "/health",
                 "/metrics", "/tokenize", "/detokenize", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
                 "/v1/embeddings", "/api/embed", "/api/embeddings", "/api/pull", "/api/delete", "/api/copy",
                 "/api/create", "/api/blobs/{digest}"):
        assert path in spec["paths"], path
    assert routes == sum(len(item) for item in spec["paths"].values())     # and nothing that is not served


def test_model_lists_what_is_served_now(doc_live, lora):
    def enums(spec):
        return [_resolve(spec["components"]["schemas"][name]["properties"]["model"], spec)
                for name in ("CompletionRequest", "ChatCompletionRequest", "OllamaGenerateRequest")]

    served = [m["id"] for m in doc_live.get("/v1/models", headers=AUTH).json()["data"]]
    assert served == [doc_live.model, "tuned"]
    for s in enums(_spec(doc_live)):
        assert served == (s["enum"] if "enum" in s else s["anyOf"][0]["enum"])
    r = doc_live.post("/v1/adapters", json={"name": "late", "path": str(lora)}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert all("late" in str(s) for s in enums(_spec(doc_live)))
    _delete(doc_live, "late")
    assert not any("late" in str(s) for s in enums(_spec(doc_live)))


def test_required_fields_are_enough_and_each_is_needed(doc_live, lora):
    """Per documented body: only its required fields (nested ones too) -> accepted by the parser and answered
    as documented; each required field left out -> 400 naming it."""
    spec = _spec(doc_live)
    checked = []
    for method, path, schema in _bodies(spec):
        body = _minimal(schema)
        if path == "/v1/adapters":                    # a real PEFT directory, and a name not served yet
            body.update(name="minimal", path=str(lora))
        op = spec["paths"][path][method]
        if path in STORE_ROUTES:        # they act on the local store: test_http_ollama_models.py, on its own store
            r = None
        else:
            r = requests.request(method, doc_live.url + path, json=body, headers=AUTH, timeout=120)
            assert str(r.status_code) in op["responses"] and r.status_code < 300, (path, body, r.text)
        if r is not None and r.headers["Content-Type"].startswith("application/json"):
            content = op["responses"][str(r.status_code)]["content"]["application/json"]["schema"]
            jsonschema.validate(r.json(), _resolve(content, spec))
        if path == "/v1/adapters":
            _delete(doc_live, "minimal")
        required = list(schema.get("required", [])) + (schema["anyOf"][0]["required"] if "anyOf" in schema else [])
        for name in required:
            missing = {k: v for k, v in copy.deepcopy(body).items() if k != name}
            r = requests.request(method, doc_live.url + path, json=missing, headers=AUTH, timeout=60)
            err = r.json()["error"]
            assert r.status_code == 400 and name in err["message"], (path, name, r.text)
            if r.json().get("type") == "error":                     # Anthropic's envelope: no param
                assert err["type"] == "invalid_request_error" and path.startswith("/v1/messages")
            else:
                assert err["param"] == name, (path, name, r.text)
        checked.append((path, required))
    assert {p for p, _ in checked} == {"/v1/completions", "/v1/chat/completions", "/api/generate", "/api/chat",
                                       "/api/show", "/tokenize", "/detokenize", "/v1/adapters", "/v1/responses",
                                       "/v1/messages", "/v1/messages/count_tokens", "/v1/embeddings", "/api/embed",
                                       "/api/embeddings", *STORE_ROUTES}
    assert all(req for _, req in checked), checked


def test_a_route_without_document_fails_the_document():
    """build_spec walks the URL map: a route added without @document is an error naming it, not a gap."""
    from flask import Flask

    from ortllm.service.openapi import build_spec, document, json_ok

    app = Flask(__name__)
    app.add_url_rule("/ok", "ok", document("documented", ok=json_ok("Health"))(lambda: "x"))
    assert "/ok" in build_spec(app, [])["paths"]
    app.add_url_rule("/forgotten", "forgotten", lambda: "x")
    with pytest.raises(RuntimeError, match="/forgotten"):
        build_spec(app, [])
