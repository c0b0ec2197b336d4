"""OpenAI's Responses API (POST /v1/responses, stateless) through the official `openai` client's
`client.responses.create` / `.stream` / `.parse`, against a live server on 127.0.0.1 (the real SmolLM2)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

WEATHER = {"type": "function", "name": "get_weather", "description": "the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           "strict": True}
QUESTION = "What is the capital of France?"


def _client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _stream(c: openai.OpenAI, **kw):
    """(every event, the final response) of client.responses.stream."""
    with c.responses.stream(**kw) as s:
        events = list(s)
        return events, (s.get_final_response() if events[-1].type == "response.completed" else None)


def test_create_and_stream_agree(smol_live):
    c = _client(smol_live)
    kw = dict(model=smol_live.model, input=QUESTION, max_output_tokens=24, temperature=0)
    r = c.responses.create(**kw)
    assert r.object == "response" and r.status == "completed" and r.incomplete_details is None
    assert "Paris" in r.output_text and r.model == smol_live.model and r.store is False
    assert [(o.type, o.role, o.status) for o in r.output] == [("message", "assistant", "completed")]
    u = r.usage
    assert u.input_tokens > 5 and 0 < u.output_tokens <= 24 and u.total_tokens == u.input_tokens + u.output_tokens

    events, final = _stream(c, **kw)
    types = [e.type for e in events]
    deltas = [i for i, t in enumerate(types) if t == "response.output_text.delta"]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert deltas == list(range(4, 4 + len(deltas))) and deltas
    assert types[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(events[i].delta for i in deltas) == r.output_text == events[4 + len(deltas)].text
    assert final.output_text == r.output_text and final.status == "completed"       # streamed == non-streamed
    assert final.usage.output_tokens == u.output_tokens and final.id == events[0].response.id


def test_instructions_items_and_max_output_tokens(smol_live):
    c = _client(smol_live)
    items = [{"role": "developer", "content": "Answer in one word."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    r = c.responses.create(model=smol_live.model, instructions="You are a geography teacher.", input=items,
                           max_output_tokens=24, temperature=0)
    assert r.status == "completed" and "Paris" in r.output_text and r.instructions.startswith("You are")
    chat = [{"role": "system", "content": "You are a geography teacher."},
            {"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}]
    assert r.usage.input_tokens == smol_live.post("/tokenize", json={"messages": chat}).json()["count"]

    cut = dict(model=smol_live.model, input="Tell me a long story about a dragon.", max_output_tokens=3)
    r = c.responses.create(**cut, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events, final = _stream(c, **cut, temperature=0)
    assert events[-1].type == "response.incomplete" and final is None        # as OpenAI ends such a stream
    assert events[-1].response.output_text == r.output_text and events[-1].response.status == "incomplete"


def test_function_call_and_its_output_sent_back(smol_live):
    c = _client(smol_live)
    kw = dict(model=smol_live.model, input="What is the weather in Paris?", tools=[WEATHER],
              tool_choice="required", max_output_tokens=60, temperature=0)
    r = c.responses.create(**kw)
    assert [o.type for o in r.output] == ["function_call"] and r.status == "completed"
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"

    events, final = _stream(c, **kw)
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and "response.output_text.delta" not in types
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == call.arguments
    assert [(o.type, o.name, o.arguments) for o in final.output] == [("function_call", call.name, call.arguments)]
    assert final.output[0].parsed_arguments == json.loads(call.arguments)      # the client's own parsing

    named = c.responses.create(**{**kw, "tool_choice": {"type": "function", "name": "get_weather"}})
    assert named.output[0].name == "get_weather"

    # the call and its output sent back (stateless: the whole conversation in input)
    follow = c.responses.create(model=smol_live.model, max_output_tokens=40, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees Celsius"}])
    assert follow.status == "completed" and ("sunny" in follow.output_text.lower() or "21" in follow.output_text)


class Cat(BaseModel):
    name: str
    legs: int


def test_text_format_json_schema(smol_live):
    c = _client(smol_live)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
              "required": ["name", "legs"], "additionalProperties": False}
    r = c.responses.create(model=smol_live.model, input="A cat as JSON", max_output_tokens=80, temperature=0,
                           text={"format": {"type": "json_schema", "name": "cat", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    parsed = c.responses.parse(model=smol_live.model, input="A cat as JSON", max_output_tokens=80, temperature=0,
                               text_format=Cat)           # the client makes the schema from the pydantic model
    assert isinstance(parsed.output_parsed, Cat)
    r = c.responses.create(model=smol_live.model, input="A cat as JSON", max_output_tokens=80, temperature=0,
                           text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)


@pytest.mark.parametrize("kw, param", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"conversation": "conv_123"}, "conversation"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}}, "text.format.schema"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"}]}, "input"),
    ({"input": []}, "input"),
])
def test_bad_requests_name_the_field(smol_live, kw, param):
    c = _client(smol_live)
    body = {"model": smol_live.model, "input": "hi", "max_output_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(**body)
    assert e.value.body["param"] == param, e.value.body
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["message"]


def test_unknown_model_and_previous_response_message(smol_live):
    c = _client(smol_live)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="no-such-model", input="hi")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=smol_live.model, input="hi", previous_response_id="resp_1")
    assert "store" in e.value.body["message"] and "input" in e.value.body["message"]
