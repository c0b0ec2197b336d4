"""The official `openai` client, unchanged, against the live server; serving invariance (docs/architecture.md,
Conventions)."""
from __future__ import annotations

import json
import threading

import openai
import pytest
import requests

GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


def _client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_and_completions(tiny_live):
    c = _client(tiny_live)
    assert [m.id for m in c.models.list().data] == [tiny_live.model]
    r = c.completions.create(model=tiny_live.model, prompt="hello there", max_tokens=8, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.choices[0].text
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8
    pieces = list(c.completions.create(model=tiny_live.model, prompt="hello there", max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == r.choices[0].text
    assert pieces[-1].usage.completion_tokens == 8 and not pieces[-1].choices
    assert [p.choices[0].finish_reason for p in pieces if p.choices][-1] == "length"


def test_errors_map_to_openai_exceptions(tiny_live):
    c = _client(tiny_live)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=tiny_live.model, prompt="x", max_tokens=2, temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=tiny_live.model, messages=[{"role": "user", "content": "x"}], n=9)


@pytest.mark.slow
def test_chat_real_answer(smol_live):
    c = _client(smol_live)
    q = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model=smol_live.model, messages=q, max_tokens=24, temperature=0)
    assert "Paris" in r.choices[0].message.content, r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and r.usage.prompt_tokens > 5
    chunks = list(c.chat.completions.create(model=smol_live.model, messages=q, max_tokens=24, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def _sse_text(resp: requests.Response, chat: bool) -> tuple[str, list[dict]]:
    text, events = "", []
    for line in resp.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        events.append(ev)
        for ch in ev.get("choices", []):
            text += (ch["delta"].get("content") or "") if chat else ch["text"]
    return text, events


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_equals_non_streamed(tiny_live, path):
    chat = "chat" in path
    body = {**GREEDY, "max_tokens": 24, **({"messages": [{"role": "user", "content": "stream me"}]} if chat
                                            else {"prompt": "stream me"})}
    whole = tiny_live.post(path, json=body).json()
    want = whole["choices"][0]["message"]["content"] if chat else whole["choices"][0]["text"]
    with tiny_live.post(path, json={**body, "stream": True}, stream=True) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        got, events = _sse_text(r, chat)
    assert got == want and len(events) > 3
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    # cached_tokens may differ: the second of the two requests finds the first one's prompt in the prefix cache
    plain = lambda u: {k: v for k, v in u.items() if k != "prompt_tokens_details"}    # noqa: E731
    assert plain(events[-1]["usage"]) == plain(whole["usage"])


def test_identical_concurrent_greedy(tiny_live):
    outs: list[str] = []

    def one():
        outs.append(tiny_live.complete("the same prompt", **{**GREEDY, "max_tokens": 20})["choices"][0]["text"])
    ts = [threading.Thread(target=one) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert len(outs) == 8 and len(set(outs)) == 1


def test_seeded_sampling_repeats(tiny_live):
    body = {"temperature": 0.9, "top_p": 0.9, "seed": 7, "max_tokens": 16, "ignore_eos": True}
    a = tiny_live.complete("seeded", **body)["choices"][0]["text"]
    b = tiny_live.complete("seeded", **body)["choices"][0]["text"]
    assert a == b


def test_logprobs_shapes(tiny_live):
    r = tiny_live.complete("logprobs please", max_tokens=5, logprobs=3, ignore_eos=True)
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
    # top_logprobs is {token text: logprob}: byte tokens that decode to the same text share a key
    assert all(1 <= len(t) <= 3 for t in lp["top_logprobs"]) and all(v <= 0 for v in lp["token_logprobs"])
    r = tiny_live.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                                                     "temperature": 0, "ignore_eos": True, "logprobs": True,
                                                     "top_logprobs": 2}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(c["top_logprobs"]) == 2 and "bytes" in c for c in content)
    with tiny_live.post("/v1/completions", json={"prompt": "logprobs please", "max_tokens": 5, "temperature": 0,
                                                 "ignore_eos": True, "logprobs": 3, "stream": True}, stream=True) as s:
        _, events = _sse_text(s, chat=False)
    streamed = [t for e in events for c in e["choices"] if c["logprobs"] for t in c["logprobs"]["token_logprobs"]]
    assert streamed == lp["token_logprobs"]


def test_prompt_as_token_ids_and_tokenize_roundtrip(tiny_live):
    ids = tiny_live.post("/tokenize", json={"prompt": "round trip"}).json()["tokens"]
    assert tiny_live.post("/detokenize", json={"tokens": ids}).json()["prompt"].endswith("round trip")
    a = tiny_live.complete(ids, max_tokens=6, ignore_eos=True)
    b = tiny_live.complete("round trip", max_tokens=6, ignore_eos=True)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["prompt_tokens"] == len(ids)
