"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the official `anthropic`
client against a live server on 127.0.0.1 (the real SmolLM2; the tiny model for the API key)."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from ortllm.service.config import ServiceConfig

WEATHER = {"name": "get_weather", "description": "the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"extra_body": {"temperature": 0}}     # newer clients send no sampling fields; the body still may


def _client(live, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key=key, max_retries=0, timeout=120)


def test_create_and_stream_agree(smol_live):
    c = _client(smol_live)
    kw = dict(model=smol_live.model, max_tokens=24, messages=QUESTION, **GREEDY)
    m = c.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant" and m.model == smol_live.model
    assert [b.type for b in m.content] == ["text"] and "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert 0 < m.usage.output_tokens <= 24 and m.usage.input_tokens + m.usage.cache_read_input_tokens > 5

    events = list(c.messages.create(**kw, stream=True))             # the raw events
    types = [e.type for e in events]
    n = types.count("content_block_delta")
    assert types == ["message_start", "content_block_start", *["content_block_delta"] * n, "content_block_stop",
                     "message_delta", "message_stop"] and n > 0
    start = events[0].message
    assert start.content == [] and start.stop_reason is None and start.id.startswith("msg_")
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == m.content[0].text
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == m.usage.output_tokens

    with c.messages.stream(**kw) as s:                                # the client's accumulating helper
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == m.content[0].text           # streamed == non-streamed
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens
    total = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert total == m.usage.input_tokens + m.usage.cache_read_input_tokens
    assert c.messages.count_tokens(model=smol_live.model, messages=QUESTION).input_tokens == total


def test_system_stop_sequences_and_max_tokens(smol_live):
    c = _client(smol_live)
    base = c.messages.create(model=smol_live.model, max_tokens=24, messages=QUESTION, **GREEDY).content[0].text
    word = base.split()[3]                                          # "The capital of France is Paris." -> France
    m = c.messages.create(model=smol_live.model, max_tokens=24, messages=QUESTION, stop_sequences=["zzz", word],
                          **GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == base[:base.index(word)]            # the stop sequence is left out
    events = list(c.messages.create(model=smol_live.model, max_tokens=24, messages=QUESTION, stop_sequences=[word],
                                    stream=True, **GREEDY))
    assert events[-2].delta.stop_reason == "stop_sequence" and events[-2].delta.stop_sequence == word

    m = c.messages.create(model=smol_live.model, max_tokens=3, messages=[{"role": "user", "content": "Tell me a "
                                                                          "long story about a dragon."}], **GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3

    system = [{"type": "text", "text": "You are a geography teacher. "}, {"type": "text", "text": "Be brief."}]
    m = c.messages.create(model=smol_live.model, max_tokens=24, system=system, messages=QUESTION, **GREEDY)
    chat = [{"role": "system", "content": "You are a geography teacher. Be brief."}, *QUESTION]
    assert (m.usage.input_tokens + m.usage.cache_read_input_tokens
            == smol_live.post("/tokenize", json={"messages": chat}).json()["count"])
    assert c.messages.count_tokens(model=smol_live.model, system=system, messages=QUESTION).input_tokens == \
        smol_live.post("/tokenize", json={"messages": chat}).json()["count"]


def test_tool_use_and_tool_result(smol_live):
    c = _client(smol_live)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=smol_live.model, max_tokens=60, messages=ask, tools=[WEATHER], tool_choice={"type": "any"},
              **GREEDY)
    m = c.messages.create(**kw)
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    use = m.content[0]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])

    events = list(c.messages.create(**kw, stream=True))
    assert events[1].type == "content_block_start" and events[1].content_block.type == "tool_use"
    assert events[1].content_block.input == {} and events[1].content_block.name == "get_weather"
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert json.loads(partial) == use.input
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.content[0].input == use.input and final.stop_reason == "tool_use"

    named = c.messages.create(**{**kw, "tool_choice": {"type": "tool", "name": "get_weather"}})
    assert named.content[0].name == "get_weather"

    follow = c.messages.create(model=smol_live.model, max_tokens=40, **GREEDY, messages=[
        *ask, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                  "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": [{"type": "text", "text": "sunny, 21 degrees Celsius"}]}]}])
    text = follow.content[0].text
    assert follow.stop_reason == "end_turn" and ("sunny" in text.lower() or "21" in text)


def test_prefill_continues_the_assistant_turn(smol_live):
    """A last assistant turn is continued: the reply is what follows its text (Anthropic's prefill)."""
    c = _client(smol_live)
    base = c.messages.create(model=smol_live.model, max_tokens=24, messages=QUESTION, **GREEDY).content[0].text
    head = base[:base.index(" is") + 3]                            # "The capital of France is"
    m = c.messages.create(model=smol_live.model, max_tokens=24, **GREEDY,
                          messages=[*QUESTION, {"role": "assistant", "content": head}])
    assert head + m.content[0].text == base
    counted = c.messages.count_tokens(model=smol_live.model, messages=[*QUESTION, {"role": "assistant",
                                                                                    "content": head}])
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_output_config_json_schema(smol_live):
    c = _client(smol_live)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
              "required": ["name", "legs"], "additionalProperties": False}
    m = c.messages.create(model=smol_live.model, max_tokens=80, messages=[{"role": "user", "content": "A cat as "
                                                                           "JSON"}],
                          output_config={"format": {"type": "json_schema", "schema": schema}}, **GREEDY)
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_a_last_tool_use_turn_is_answered(smol_live):
    """A last assistant turn with a tool_use block is no prefill (only text is continued): it is a finished turn and
    the reply is a new one (the document cannot say "the last message" apart from the others)."""
    c = _client(smol_live)
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    m = c.messages.create(model=smol_live.model, max_tokens=4, messages=[*QUESTION, call], **GREEDY)
    assert m.role == "assistant" and m.usage.output_tokens >= 1


@pytest.mark.parametrize("kw, field", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"extra_body": {"temperature": 3}}, "temperature"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}, "messages"),
    ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}, "tools"),
    ({"tool_choice": {"type": "tool"}, "tools": [WEATHER]}, "tool_choice"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
])
def test_errors_in_anthropics_envelope(smol_live, kw, field):
    c = _client(smol_live)
    body = {"model": smol_live.model, "max_tokens": 4, "messages": QUESTION, **kw}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(**body)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert field in e.value.body["error"]["message"], e.value.body
    assert e.value.body["request_id"] == e.value.response.headers["X-Request-Id"]


def test_unknown_model_and_count_tokens_errors(smol_live):
    c = _client(smol_live)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    assert e.value.body["error"]["type"] == "not_found_error" and "no-such-model" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        c.messages.count_tokens(model="no-such-model", messages=QUESTION)
    r = smol_live.post("/v1/messages", data="{", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = smol_live.post("/v1/messages", data=json.dumps({"model": smol_live.model}))      # no Content-Type
    assert r.status_code == 415 and r.json()["type"] == "error"


def test_api_key_as_x_api_key(make_live, tiny_engine):
    live = make_live(tiny_engine, ServiceConfig(api_key="sekret", load_in_background=False), num_blocks=64)
    m = _client(live, "sekret").messages.create(model=live.model, max_tokens=4, messages=QUESTION, **GREEDY)
    assert m.usage.output_tokens >= 1                                  # the client's x-api-key header
    with pytest.raises(anthropic.AuthenticationError) as e:
        _client(live, "wrong").messages.create(model=live.model, max_tokens=4, messages=QUESTION)
    assert e.value.body["error"]["type"] == "authentication_error"
    r = live.post("/v1/messages", json={"model": live.model, "max_tokens": 2, "messages": QUESTION},
                  headers={"Authorization": "Bearer sekret"})
    assert r.status_code == 200, r.text
