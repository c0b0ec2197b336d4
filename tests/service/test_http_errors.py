"""Malformed input: each a 4xx in the OpenAI envelope, the server stays healthy; a short schemathesis run."""
from __future__ import annotations

import json

import pytest
import requests

JSON = {"Content-Type": "application/json"}
OK_BODY = {"prompt": "hi", "max_tokens": 2}
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


def _body(**kw) -> bytes:
    return json.dumps({**OK_BODY, **kw}).encode()


CASES = [
    # (id, path, raw body, headers, expected status, expected param or None)
    ("not-json", CMPL, b"{not json", JSON, 400, None),
    ("list-body", CMPL, b"[1, 2]", JSON, 400, None),
    ("scalar-body", CMPL, b"3", JSON, 400, None),
    ("null-body", CMPL, b"null", JSON, 400, None),
    ("string-body", CMPL, b'"prompt"', JSON, 400, None),
    ("nan", CMPL, b'{"prompt": "x", "temperature": NaN}', JSON, 400, None),
    ("deep-nesting", CMPL, b"[" * 100000 + b"]" * 100000, JSON, 400, None),
    ("wrong-content-type", CMPL, _body(), {"Content-Type": "text/plain"}, 415, None),
    ("no-content-type", CMPL, _body(), {}, 415, None),
    ("form-encoded", CMPL, b"prompt=hi", {"Content-Type": "application/x-www-form-urlencoded"}, 415, None),
    ("empty-body", CMPL, b"", JSON, 400, None),
    ("whitespace-body", CMPL, b"  \n", JSON, 400, None),
    ("invalid-utf8", CMPL, b'{"prompt": "\xff\xfe"}', JSON, 400, None),
    ("max_tokens-string", CMPL, _body(max_tokens="5"), JSON, 400, "max_tokens"),
    ("temperature-string", CMPL, _body(temperature="hot"), JSON, 400, "temperature"),
    ("stream-string", CMPL, _body(stream="yes"), JSON, 400, "stream"),
    ("prompt-number", CMPL, _body(prompt=5), JSON, 400, "prompt"),
    ("prompt-missing", CMPL, b'{"max_tokens": 3}', JSON, 400, "prompt"),
    ("prompt-empty", CMPL, _body(prompt=""), JSON, 400, "prompt"),
    ("prompt-mixed-list", CMPL, _body(prompt=[1, "a"]), JSON, 400, "prompt"),
    ("prompt-batch-too-many", CMPL, _body(prompt=["a"] * 33), JSON, 400, "prompt"),
    ("seed-negative", CMPL, _body(seed=-1), JSON, 400, "seed"),
    ("temperature-negative", CMPL, _body(temperature=-0.5), JSON, 400, "temperature"),
    ("top_p-zero", CMPL, _body(top_p=0), JSON, 400, "top_p"),
    ("top_p-above-one", CMPL, _body(top_p=1.5), JSON, 400, "top_p"),
    ("max_tokens-zero", CMPL, _body(max_tokens=0), JSON, 400, "max_tokens"),
    ("max_tokens-negative", CMPL, _body(max_tokens=-3), JSON, 400, "max_tokens"),
    ("prompt-past-context", CMPL, _body(prompt="x" * 600), JSON, 400, None),   # max_tokens past it: capped (below)
    ("five-stop-strings", CMPL, _body(stop=["a", "b", "c", "d", "e"]), JSON, 400, "stop"),
    ("stop-empty-string", CMPL, _body(stop=[""]), JSON, 400, "stop"),
    ("token-ids-out-of-vocab", CMPL, _body(prompt=[1, 2, 99999]), JSON, 400, None),
    ("token-ids-negative", CMPL, _body(prompt=[1, -2]), JSON, 400, None),
    ("token-ids-huge", CMPL, _body(prompt=[[1, 2**70], "a"]), JSON, 400, "prompt"),   # was a 500 (OverflowError)
    ("n-nine", CMPL, _body(n=9), JSON, 400, "n"),
    ("logprobs-too-many", CMPL, _body(logprobs=50), JSON, 400, "logprobs"),
    ("unknown-model", CMPL, _body(model="gpt-4"), JSON, 404, "model"),
    ("chat-no-messages", CHAT, b'{"messages": []}', JSON, 400, "messages"),
    ("chat-messages-string", CHAT, b'{"messages": "hi"}', JSON, 400, "messages"),
    ("chat-bad-role", CHAT, b'{"messages": [{"role": "wizard", "content": "x"}]}', JSON, 400, "messages"),
    ("chat-content-number", CHAT, b'{"messages": [{"role": "user", "content": 5}]}', JSON, 400, "messages"),
    ("chat-top_logprobs-alone", CHAT, b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}',
     JSON, 400, "top_logprobs"),
    # OpenAI's message types (the generation that never ends on a message of nothing was one of these)
    ("chat-tool-no-call-id", CHAT, b'{"messages": [{"role": "tool"}]}', JSON, 400, "messages"),
    ("chat-tool-no-content", CHAT, b'{"messages": [{"role": "tool", "tool_call_id": "c"}]}', JSON, 400, "messages"),
    ("chat-user-null-content", CHAT, b'{"messages": [{"role": "user", "content": null}]}', JSON, 400, "messages"),
    ("chat-user-no-content", CHAT, b'{"messages": [{"role": "user"}]}', JSON, 400, "messages"),
    ("chat-assistant-nothing", CHAT, b'{"messages": [{"role": "assistant", "tool_calls": []}]}', JSON, 400,
     "messages"),
    ("chat-empty-parts", CHAT, b'{"messages": [{"role": "user", "content": []}]}', JSON, 400, "messages"),
    ("max_tokens-fraction", CMPL, _body(max_tokens=2.5), JSON, 400, "max_tokens"),
    ("n-with-many-prompts", CMPL, _body(prompt=["a"] * 9, n=3), JSON, 400, "n"),
    ("best_of-above-one", CMPL, _body(best_of=2, n=2), JSON, 400, "best_of"),
    ("two-guides", CMPL, _body(guided_regex="a", guided_choice=["a"]), JSON, 400, "guided_choice"),
    ("detokenize-oov", "/detokenize", b'{"tokens": [99999]}', JSON, 400, None),
    ("tokenize-no-prompt", "/tokenize", b'{}', JSON, 400, "prompt"),
]


@pytest.mark.parametrize("path,raw,headers,status,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_is_4xx_envelope(tiny_live, path, raw, headers, status, param):
    r = requests.post(tiny_live.url + path, data=raw, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    assert r.headers["X-Request-Id"]


def test_huge_bodies_and_prompts(tiny_live):
    r = tiny_live.post(CMPL, json={"prompt": "word " * 200_000, "max_tokens": 4})      # 1 MB prompt
    assert r.status_code in (400, 413) and "error" in r.json()
    r = tiny_live.post(CMPL, data=b'{"prompt": "' + b"a" * (3 << 20) + b'"}', headers=JSON)  # past max_body_bytes
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_entity_too_large"
    r = tiny_live.post(CMPL, json={"prompt": "go " * 600, "max_tokens": 4})                # past the context
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_max_tokens_past_the_context_is_capped(tiny_live):
    """The one rule (runtime.sampling_params.fit_max_tokens): max_tokens past the context is capped to the room
    left and the completion ends with finish_reason "length"; only a prompt that leaves no room is a 400."""
    r = tiny_live.post(CMPL, json={"prompt": "x" * 500, "max_tokens": 100_000, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    usage = body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 512, usage      # llama-tiny-random: 512 context
    assert body["choices"][0]["finish_reason"] == "length"
    r = tiny_live.post(CMPL, json={"prompt": "x" * 512, "max_tokens": 4})          # no room left for a token
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_routing_errors_in_envelope(tiny_live):
    r = tiny_live.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = tiny_live.get(CMPL)
    assert r.status_code == 405 and "error" in r.json()
    assert r.headers["Allow"] == "OPTIONS, POST"                # RFC 9110: a 405 says what the route takes
    r = requests.request("TRACE", tiny_live.url + "/v1/messages", timeout=30)
    assert r.status_code == 405 and set(r.headers["Allow"].split(", ")) == {"OPTIONS", "POST"}


def test_integer_valued_numbers_are_integers(tiny_live):
    """JSON Schema's integer (what the reference APIs publish) is any number without a fraction: 3.0 is one, and
    reaches the engine as 3 (Anthropic's max_tokens, OpenAI's n, Ollama's options, token ids)."""
    r = tiny_live.post(CMPL, json={"prompt": [1.0, 2.0], "max_tokens": 3.0, "n": 2.0, "seed": 7.0})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
    assert r.json()["usage"]["completion_tokens"] <= 6
    r = tiny_live.post("/v1/messages", json={"model": tiny_live.model, "max_tokens": 21493.0,
                                             "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    r = tiny_live.post("/api/generate", json={"model": tiny_live.model, "prompt": "hi", "stream": False,
                                              "options": {"num_predict": 2.0, "top_k": 15713.0}})
    assert r.status_code == 200 and r.json()["eval_count"] <= 2, r.text


def test_still_healthy_after_abuse(tiny_live):
    assert tiny_live.get("/health").status_code == 200
    assert tiny_live.complete("fine", max_tokens=3)["choices"][0]["finish_reason"] in ("length", "stop")


def test_client_fixture_envelope(client):
    """The Flask test client (no socket) sees the same envelope."""
    r = client.post(CMPL, data=b"[]", content_type="application/json")
    assert r.status_code == 400 and r.get_json()["error"]["type"] == "invalid_request_error"
    assert client.get("/health").get_json()["status"] in ("ok", "degraded")


def test_schemathesis_over_openapi(tiny_live):
    """Bounded property run over /openapi.json: every generated request (valid and invalid) must get a documented
    status, a non-5xx answer and, for JSON, a body that matches the schema; a valid one is not refused (but for
    what no schema can state: contract_checks.py) and an invalid one is. The longer run, every check and several
    seeds: ci/schemathesis_contract.sh."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(tiny_live.url + "/openapi.json")
    checked = 0
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=6, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                if (isinstance(case.body, dict) and isinstance(case.body.get("max_tokens", ""), (int, type(None)))
                        and mode == GenerationMode.POSITIVE):
                    case.body["max_tokens"] = min(case.body["max_tokens"] or 1, 8)   # keep the run short
                r = case.call(base_url=tiny_live.url, timeout=60)
                assert r.status_code < 500, f"{case.method} {case.path} -> {r.status_code}: {r.text[:300]}"
                # schemathesis' Response: lower-case header names, a list of values each
                if (r.headers.get("content-type") or [""])[0].startswith("application/json") and r.status_code >= 400:
                    body = r.json()
                    if case.path.startswith("/v1/messages"):            # Anthropic's routes: Anthropic's envelope
                        assert set(body) == {"type", "error", "request_id"} and set(body["error"]) == {"type",
                                                                                                   "message"}
                    else:
                        assert set(body["error"]) == {"message", "type", "param", "code"}, body
                case.validate_response(r, checks=_checks())
            try:
                run()
            except Unsatisfiable:   # nothing invalid to send (an operation without parameters or body)
                assert mode == GenerationMode.NEGATIVE
                continue
            checked += 1
    assert checked >= 10
    assert tiny_live.get("/health").status_code == 200


def _checks():
    from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                                   response_schema_conformance, status_code_conformance)

    from tests.service.contract_checks import positive_data_acceptance_documented
    return [status_code_conformance, content_type_conformance, response_schema_conformance,
            positive_data_acceptance_documented, negative_data_rejection]
