"""A gpt-oss artifact served on 127.0.0.1, talked to with the official `openai` client: the prompt is harmony's
rendering (openai-harmony's ids, reasoning_effort its Reasoning line), and a harmony reply comes back split, the
analysis channel as reasoning_content and the final channel as content, whole and streamed; Ollama's /api/chat
gives it as message.thinking.

A random model does not speak harmony, so the reply is forced: guided_grammar (a Lark grammar, llguidance) allows
one harmony reply, token by token, with its markers as special tokens; the engine, the detokenizer, the parser and
the server are the real ones. The model is tests/reference/harmony_ref.py's tiny gpt-oss with o200k_harmony's
201088 rows."""
from __future__ import annotations

import json

import openai
import pytest
import requests

from tests.reference.harmony_ref import ANSWER, FORCED_REPLY, REASONING, harmony_prompt_ids
from tests.service.conftest import start_live, stop_live

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def live(gpt_oss_harmony_artifact):
    lv = start_live(gpt_oss_harmony_artifact, num_blocks=64)
    yield lv
    stop_live(lv)


def _client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _forced(**kw) -> dict:
    return {"max_tokens": 64, "temperature": 0, "extra_body": {"guided_grammar": FORCED_REPLY, **kw}}


def test_chat_reply_split_into_reasoning_and_content(live, harmony_encoding):
    c = _client(live)
    r = c.chat.completions.create(model=live.model, messages=CHAT, **_forced())
    msg = r.choices[0].message
    assert (msg.content, msg.reasoning_content) == (ANSWER, REASONING)
    assert r.choices[0].finish_reason == "stop" and {200002, 200012} <= set(live.engine.eos_token_ids)
    assert r.usage.prompt_tokens == len(harmony_prompt_ids(harmony_encoding, CHAT, None))
    assert r.usage.completion_tokens >= 14        # the markers and both messages' text were generated


def test_streamed_as_deltas(live):
    c = _client(live)
    chunks = list(c.chat.completions.create(model=live.model, messages=CHAT, stream=True, **_forced()))
    assert chunks[0].choices[0].delta.role == "assistant"
    kinds = []
    for ch in chunks[1:]:
        d = ch.choices[0].delta
        for k in ("reasoning_content", "content"):
            if getattr(d, k, None):
                kinds.append((k, getattr(d, k)))
    assert "".join(t for k, t in kinds if k == "reasoning_content") == REASONING
    assert "".join(t for k, t in kinds if k == "content") == ANSWER
    # reasoning first, then the answer (the grammar forces its tokens as drafts: several a step, so few chunks)
    first_content = [k for k, _ in kinds].index("content")
    assert all(k == "content" for k, _ in kinds[first_content:]) and first_content >= 1
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_reasoning_effort_is_the_reasoning_line(live, harmony_encoding):
    """reasoning_effort renders harmony's `Reasoning:` line: the prompt is openai-harmony's with that effort."""
    from ortllm.protocol.generation import prompt_ids
    from ortllm.protocol.openai import parse_chat
    for effort in ("low", "high"):
        req = parse_chat({"messages": CHAT, "reasoning_effort": effort})
        assert prompt_ids(live.engine, req) == harmony_prompt_ids(harmony_encoding, CHAT, effort)
    r = _client(live).chat.completions.create(model=live.model, messages=CHAT, reasoning_effort="high",
                                              **_forced())
    assert r.usage.prompt_tokens == len(harmony_prompt_ids(harmony_encoding, CHAT, "high"))
    bad = live.post("/v1/chat/completions", json={"messages": CHAT, "reasoning_effort": "max"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"


def test_completions_keep_the_raw_harmony_text(live):
    """/v1/completions is not a chat: its text is the reply as decoded, harmony's markers in it."""
    r = _client(live).completions.create(model=live.model, prompt="<|start|>user<|message|>hi<|end|>"
                                         "<|start|>assistant", **_forced())
    assert r.choices[0].text == (f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant"
                                 f"<|channel|>final<|message|>{ANSWER}")


def test_ollama_chat_thinking(live, harmony_encoding):
    """Ollama's /api/chat over the same engine: a harmony reply is message.thinking + message.content, streamed
    and not (the reply forced through the engine API, as Ollama's body has no grammar field)."""
    from ortllm.protocol.ollama import OllamaRenderer, chat_request
    from ortllm.protocol.bodies import OLLAMA_CHAT
    from ortllm.protocol.generation import prompt_ids
    from ortllm.protocol.rendering import Generation
    from ortllm.runtime.sampling_params import Guide, SamplingParams

    req = chat_request(OLLAMA_CHAT.read({"model": live.model, "messages": CHAT}), {})
    ids = prompt_ids(live.engine, req)
    params = SamplingParams(max_tokens=64, temperature=0, guide=Guide("lark", FORCED_REPLY, "guided_grammar"))
    h = live.engine.submit(ids, params)
    deltas = list(h)
    out = h.result(timeout=60)
    gen = Generation(req, "r", live.model, 0, [h], [ids], 0.0, str, str, harmony=live.engine.tokenizer.harmony)
    body = OllamaRenderer(gen, "message").body([out])
    assert body["message"] == {"role": "assistant", "content": ANSWER, "thinking": REASONING} and body["done"]
    streamer = OllamaRenderer(gen, "message")
    lines = [json.loads(b) for i, d in enumerate(deltas) for b in streamer.delta(0, d, i == len(deltas) - 1)]
    assert "".join(x["message"].get("thinking", "") for x in lines) == REASONING
    assert "".join(x["message"]["content"] for x in lines) == ANSWER
    # think: a level is the reasoning effort; the live route answers (the random model's text: whatever it is)
    for think, effort in (("high", "high"), (True, None)):
        v = OLLAMA_CHAT.read({"model": live.model, "messages": CHAT, "think": think})
        assert prompt_ids(live.engine, chat_request(v, {})) == harmony_prompt_ids(harmony_encoding, CHAT, effort)
    r = requests.post(live.url + "/api/chat", json={"model": live.model, "messages": CHAT, "stream": False,
                                                    "think": "low", "options": {"num_predict": 4}}, timeout=60)
    assert r.status_code == 200 and r.json()["done"]
    assert r.json()["prompt_eval_count"] == len(harmony_prompt_ids(harmony_encoding, CHAT, "low"))
    r = requests.post(live.url + "/api/generate", json={"model": live.model, "prompt": "hi", "raw": True,
                                                        "think": "low", "stream": False,
                                                        "options": {"num_predict": 2}}, timeout=60)
    assert r.status_code == 200, r.text
