"""Structured output, tools, n, logit_bias, echo and usage details through the official `openai` client against a
live server on 127.0.0.1 (the real SmolLM2 where the model's behaviour matters, the tiny model for errors)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
                   "required": ["zone"]}}}


def _client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _schemas() -> list[dict]:
    """50 schemas: nested objects, arrays, enums, bounded numbers, optional fields, anyOf, nullable.
    Numbers carry multipleOf: a bare "number" lets a small model write digits until max_tokens."""
    s = lambda n=20: {"type": "string", "maxLength": n}          # noqa: E731
    base = [
        {"type": "object", "properties": {"name": s(), "age": {"type": "integer", "minimum": 0, "maximum": 120}},
         "required": ["name", "age"]},
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
        {"type": "object", "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.01}},
         "required": ["x"]},
        {"type": "object", "properties": {"tags": {"type": "array", "items": s(10), "minItems": 1, "maxItems": 3}},
         "required": ["tags"]},
        {"type": "object", "properties": {"point": {"type": "object", "properties": {
            "x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"]},
        {"type": "object", "properties": {"title": s(), "year": {"type": "integer", "minimum": 1900,
                                                                  "maximum": 2030}, "note": s(30)},
         "required": ["title", "year"], "additionalProperties": False},
        {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
            "type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}, "label": s(8)},
            "required": ["id", "label"], "additionalProperties": False}}}, "required": ["items"],
         "additionalProperties": False},
        {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                              {"type": "string", "maxLength": 5}]}},
         "required": ["value"], "additionalProperties": False},
        {"type": "object", "properties": {"maybe": {"type": ["string", "null"], "maxLength": 10}},
         "required": ["maybe"], "additionalProperties": False},
    ]
    prompts_keys = ["answer", "result", "data", "output", "reply"]
    out = []
    for i in range(50):
        schema = json.loads(json.dumps(base[i % len(base)]))
        variant = i // len(base)
        if variant >= 1:       # wrap in an outer object under a varying key
            schema = {"type": "object", "properties": {prompts_keys[variant]: schema},
                      "required": [prompts_keys[variant]], "additionalProperties": False}
        if variant >= 2:       # an optional extra field
            schema["properties"]["rank"] = {"type": "integer", "minimum": 1, "maximum": 5}
        if variant >= 3:       # and a required enum beside it
            schema["properties"]["level"] = {"enum": ["low", "mid", "high"]}
            schema["required"] = schema["required"] + ["level"]
        if variant >= 4:
            schema["properties"]["scores"] = {
                "type": "array", "items": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.5},
                "maxItems": 4}
        out.append(_closed(schema))
    return out


def _closed(schema):
    """additionalProperties: false on every object, as OpenAI's strict mode requires: with open objects a small
    model may keep adding keys until max_tokens (the output then cannot parse, whatever the decoder)."""
    if isinstance(schema, dict):
        schema = {k: _closed(v) for k, v in schema.items()}
        if schema.get("type") == "object":
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [_closed(v) for v in schema]
    return schema


SCHEMAS = _schemas()


def test_fifty_json_schemas_all_validate(smol_live):
    """Every output of 50 varied schemas parses and validates (16 concurrent clients, greedy and sampled)."""
    c = _client(smol_live)

    def one(i_schema):
        i, schema = i_schema
        r = c.chat.completions.create(
            model=smol_live.model, max_tokens=300, temperature=0 if i % 2 else 0.8, seed=i,
            messages=[{"role": "user", "content": f"Fill in this JSON (example {i}): {json.dumps(schema)[:200]}"}],
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}})
        return i, r.choices[0]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, enumerate(SCHEMAS)))
    for i, choice in results:
        assert choice.finish_reason == "stop", (i, choice)
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[i])


def test_json_object_and_guided_fields(smol_live):
    c = _client(smol_live)
    r = c.chat.completions.create(model=smol_live.model, max_tokens=200, temperature=0,
                                  messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                                  response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = c.completions.create(model=smol_live.model, prompt="Is the sky blue? Answer:", max_tokens=5, temperature=0,
                             extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].text in ("yes", "no")
    r = c.completions.create(model=smol_live.model, prompt="A US zip code:", max_tokens=10, temperature=0,
                             extra_body={"guided_regex": "[0-9]{5}"})
    assert len(r.choices[0].text) == 5 and r.choices[0].text.isdigit()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = c.completions.create(model=smol_live.model, prompt="JSON with a number:", max_tokens=30, temperature=0,
                             extra_body={"guided_json": schema})
    jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_tool_call_round_trip(smol_live):
    """required -> a valid call; the call and the tool's result go back; the model answers in text."""
    c = _client(smol_live)
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat.completions.create(model=smol_live.model, messages=msgs, tools=[WEATHER, TIME],
                                  tool_choice="required", temperature=0, max_tokens=80)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time") and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, {t["function"]["name"]: t for t in (WEATHER, TIME)}[call.function.name]
                        ["function"]["parameters"])
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21})}]
    r2 = c.chat.completions.create(model=smol_live.model, messages=msgs, tools=[WEATHER, TIME], temperature=0,
                                   max_tokens=30)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.choices[0].message.content or r2.choices[0].message.tool_calls
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens     # the call and its result were in the prompt


def test_streamed_named_tool_call(smol_live):
    """Streamed as OpenAI streams a call: a first delta with index, id, type, name and empty arguments, then only
    index + argument fragments as they are generated; the accumulated arguments validate against the tool's
    schema and equal the non-streamed call's."""
    c = _client(smol_live)
    kw = dict(model=smol_live.model, messages=[{"role": "user", "content": "What is the weather in Tokyo?"}],
              tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}},
              temperature=0, max_tokens=60)
    chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type, first.function.name, first.function.arguments) == (0, "function",
                                                                                         "get_weather", "")
    assert first.id.startswith("call_")
    assert len(rest) > 1, "the arguments came in one piece"
    assert all(d.index == 0 and d.id is None and d.type is None and d.function.name is None
               and d.function.arguments for d in rest)
    args = "".join(d.function.arguments for d in rest)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    assert not any(ch.choices[0].delta.content for ch in chunks if ch.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    # the client's own stream helper accumulates the same call
    with c.chat.completions.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert events.count("tool_calls.function.arguments.delta") > 1
    assert "tool_calls.function.arguments.done" in events
    assert call.id.startswith("call_") and (call.function.name, call.function.arguments) == ("get_weather", args)
    whole = c.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert (whole.message.tool_calls[0].function.name, whole.message.tool_calls[0].function.arguments) == (
        "get_weather", args)


def test_n_seeds_logit_bias_usage(smol_live):
    c = _client(smol_live)
    prompt = "Once upon a time, in a land far away, there lived a"
    r = c.completions.create(model=smol_live.model, prompt=prompt, n=4, max_tokens=8, temperature=1.0, seed=7)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert len({ch.text for ch in r.choices}) > 1                     # each its own random stream
    one = c.completions.create(model=smol_live.model, prompt=prompt, max_tokens=8, temperature=1.0, seed=7)
    assert one.choices[0].text == r.choices[0].text                   # choice 0 = the n=1 answer for that seed
    assert 4 <= r.usage.completion_tokens <= 32
    # the prompt is counted once; the repeated request found its blocks in the prefix cache
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    long = "The quick brown fox jumps over the lazy dog. " * 8
    c.completions.create(model=smol_live.model, prompt=long, max_tokens=1, temperature=0)
    again = c.completions.create(model=smol_live.model, prompt=long, max_tokens=1, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 64
    # logit_bias: +100 on one token makes it the only choice
    tid = smol_live.engine.tokenizer.encode(" banana")[0]
    r = c.completions.create(model=smol_live.model, prompt=prompt, max_tokens=3, temperature=0,
                             logit_bias={str(tid): 100})
    assert r.choices[0].text == " banana" * 3


def test_prompt_list_and_echo_logprobs(smol_live):
    c = _client(smol_live)
    r = c.completions.create(model=smol_live.model, prompt=["Paris is in", "Rome is in"], n=2, max_tokens=3,
                             temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text   # greedy
    # lm-eval's loglikelihood request: echo, logprobs, max_tokens 0
    r = c.completions.create(model=smol_live.model, prompt="The capital of France is Paris", echo=True, logprobs=1,
                             max_tokens=0, temperature=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == "The capital of France is Paris" and r.usage.completion_tokens == 0
    assert lp.token_logprobs[0] is None and all(x < 0 for x in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == r.choices[0].text
    # the prompt's logprobs equal the ones the model gives a greedy continuation of the shorter prompt
    short = c.completions.create(model=smol_live.model, prompt="The capital of France is", max_tokens=1,
                                 temperature=0, logprobs=1)
    assert short.choices[0].logprobs.tokens[0] == lp.tokens[-1]
    assert abs(short.choices[0].logprobs.token_logprobs[0] - lp.token_logprobs[-1]) < 1e-3


BAD = [
    ("n-nine", "completions", {"prompt": "x", "n": 9}, "n"),
    ("chat-n-nine", "chat", {"n": 9}, "n"),
    ("invalid-schema", "chat", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}},
     "response_format.json_schema.schema"),
    ("schema-not-object", "chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                               "schema": 5}}},
     "response_format.json_schema.schema"),
    ("response-format-type", "chat", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("unknown-function", "chat", {"tools": [WEATHER], "tool_choice": {"type": "function",
                                                                      "function": {"name": "launch"}}}, "tool_choice"),
    ("non-object-parameters", "chat", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}, "tools"),
    ("tool-choice-without-tools", "chat", {"tool_choice": "required"}, "tool_choice"),
    ("bad-tool-name", "chat", {"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
    ("echo-stream", "completions", {"prompt": "x", "echo": True, "stream": True}, "echo"),
    ("logit-bias-range", "completions", {"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ("logit-bias-key", "completions", {"prompt": "x", "logit_bias": {"tok": 1}}, "logit_bias"),
    ("logit-bias-oov", "completions", {"prompt": "x", "logit_bias": {"9999999": 1}}, "logit_bias"),
    ("two-guides", "completions", {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ("bad-regex", "completions", {"prompt": "x", "guided_regex": "(("}, "guided_regex"),
    ("format-and-forced-tool", "chat", {"tools": [WEATHER], "tool_choice": "required",
                                        "response_format": {"type": "json_object"}}, "tool_choice"),
]


@pytest.mark.parametrize("kind,extra,param", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_combinations_name_the_field(tiny_live, kind, extra, param):
    c = _client(tiny_live)
    with pytest.raises(openai.BadRequestError) as e:
        if kind == "chat":
            c.chat.completions.create(model=tiny_live.model, messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=2, **_split(extra))
        else:
            c.completions.create(model=tiny_live.model, max_tokens=2, **_split(extra))
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body
    assert "Traceback" not in e.value.body["message"]


def _split(extra: dict) -> dict:
    """Fields the client does not know travel in extra_body."""
    known = {"prompt", "n", "response_format", "tools", "tool_choice", "echo", "stream", "logit_bias"}
    out = {k: v for k, v in extra.items() if k in known}
    rest = {k: v for k, v in extra.items() if k not in known}
    return {**out, **({"extra_body": rest} if rest else {})}
