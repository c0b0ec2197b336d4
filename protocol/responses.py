"""OpenAI's Responses API (POST /v1/responses), stateless, as a translation onto the chat path.

A Responses body is checked against RESPONSE (declared here with fields.py; /openapi.json publishes it), then
translated into the chat body it means and read by openai.parse_chat: one validation and one generation path.

    input (a string, or items)          -> messages: a string is one user message; message items keep their
                                           role (developer -> system); function_call items join the assistant
                                           message before them as tool_calls; function_call_output -> role tool
    instructions                        -> a system message first
    max_output_tokens                   -> max_tokens
    tools [{type: function, name, ...}] -> tools [{type: function, function: {name, ...}}]
    tool_choice {type: function, name}  -> tool_choice {type: function, function: {name}}
    text.format {type: json_schema,...} -> response_format {type: json_schema, json_schema: {...}}
    previous_response_id, conversation  -> 400: nothing is stored here (store is off)

The reply goes through the chat path's tool-call parser (tool_calls.py); OutputItems turns its deltas into the
Responses output items (message with output_text, function_call) and the typed stream events, so a streamed
answer and a non-streamed one are built by the same code.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass

from .bodies import MAX_TOOLS, MIN_P, MODEL, NAME_PATTERN, REPETITION_PENALTY, SEED, TEMPERATURE, TOP_K, TOP_P
from .errors import APIError, bad_request
from .fields import Body, Field, Rule, both, boolean, integer, sent, sent_as, string
from .openai import GenerationRequest, parse_chat
from .rendering import ChatAnswer, Generation, sse
from .structured import check_schema

_TEXT_PARTS = {"type": "array", "items": {
    "type": "object", "required": ["type", "text"],
    "properties": {"type": {"enum": ["input_text", "output_text"],
                            "description": "text only (images, files and audio are not supported)"},
                   "text": {"type": "string"}}}}
_CONTENT = {"anyOf": [{"type": "string"}, _TEXT_PARTS], "description": "a string or a list of text parts"}
_ITEM = {
    "type": "object",
    "properties": {
        "type": {"enum": ["message", "function_call", "function_call_output"],
                 "description": "message (the default), function_call (a call of an earlier answer, sent back) "
                                "or function_call_output (its result)"},
        "role": {"enum": ["user", "system", "developer", "assistant"]},
        "content": _CONTENT,
        "call_id": {"type": "string", "minLength": 1}, "name": {"type": "string"},
        "arguments": {"type": "string", "description": "JSON text"},
        "output": _CONTENT, "id": {"type": "string"}, "status": {"type": "string"}},
    "allOf": [
        {"if": {"required": ["type"], "properties": {"type": {"const": "function_call"}}},
         "then": {"required": ["call_id", "name", "arguments"]}},
        {"if": {"required": ["type"], "properties": {"type": {"const": "function_call_output"}}},
         "then": {"required": ["call_id", "output"]}},
        {"if": {"anyOf": [{"not": {"required": ["type"]}}, {"properties": {"type": {"const": "message"}}}]},
         "then": {"required": ["role", "content"]}}]}

INPUT = Field("input", {"anyOf": [{"type": "string", "minLength": 1},
                                  {"type": "array", "minItems": 1, "items": _ITEM}]},
              required=True, description="a user message, or a list of items: messages, and function calls "
                                         "with their outputs sent back",
              hint="a non-empty string or a non-empty list of input items")
TOOLS = Field("tools", {"type": "array", "maxItems": MAX_TOOLS, "items": {
    "type": "object", "required": ["type", "name"],
    "properties": {"type": {"const": "function"},
                   "name": {"type": "string", "pattern": NAME_PATTERN},
                   "description": {"type": ["string", "null"]},
                   "parameters": {"type": ["object", "null"], "required": ["type"],
                                  "properties": {"type": {"const": "object"}},
                                  "description": "a JSON Schema of type object"},
                   "strict": {"type": ["boolean", "null"]}}}},
              description="function tools only (no built-in tools here)")
TOOL_CHOICE = Field("tool_choice", {"anyOf": [
    {"enum": ["none", "auto", "required"]},
    {"type": "object", "required": ["type", "name"],
     "properties": {"type": {"const": "function"}, "name": {"type": "string"}}}],
    "description": '"none", "auto", "required" or {type: function, name}'},
    description="auto (default with tools): the model may call; required or a named function: it must")
TEXT = Field("text", {"type": "object", "properties": {"format": {
    "type": "object", "required": ["type"],
    "properties": {"type": {"enum": ["text", "json_object", "json_schema"]},
                   "name": {"type": "string", "pattern": NAME_PATTERN}, "description": {"type": "string"},
                   "schema": {"type": "object", "description": "a JSON Schema"},
                   "strict": {"type": ["boolean", "null"]}},
    "if": {"properties": {"type": {"const": "json_schema"}}}, "then": {"required": ["schema"]}}}},
    description="format json_object: any JSON object; json_schema: one that validates against format.schema")

_FORCED = {"allOf": [sent("tool_choice"), {"properties": {"tool_choice": {"not": {"enum": ["none", "auto"]}}}}]}
RESPONSE = Body("ResponseRequest", [
    MODEL, INPUT,
    string("instructions", description="a system message before the input"),
    integer("max_output_tokens", None, 1, description="capped to the room the context leaves; default: that room"),
    TEMPERATURE, TOP_P, TOOLS, TOOL_CHOICE,
    boolean("parallel_tool_calls", True, "accepted: the model may answer with several calls either way"),
    TEXT,
    boolean("stream", False, "server-sent events: response.created ... response.completed"),
    Field("previous_response_id", False, description="not supported (null only): responses are not stored here; "
                                                     "send the whole conversation in input",
          hint="null (responses are not stored here: send the whole conversation in input)"),
    Field("conversation", False, description="not supported (null only): nothing is stored here; send the whole "
                                             "conversation in input",
          hint="null (nothing is stored here: send the whole conversation in input)"),
    boolean("store", None, "accepted; responses are never stored (the answer says store: false)"),
    Field("metadata", {"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string"}},
          description="returned with the response"),
    string("user", description="accepted, not used"),
    SEED, TOP_K, MIN_P, REPETITION_PENALTY,
], rules=[                          # those of the chat body it becomes
    Rule(both(_FORCED, {"not": sent_as("tools", minItems=1)}), "tool_choice needs tools: send the functions in tools",
         "tool_choice"),
    Rule(both(_FORCED, sent_as("text", required=["format"], properties={"format": {
        "properties": {"type": {"enum": ["json_object", "json_schema"]}}}})),
         "a forced function call (tool_choice required or a named function) cannot be combined with text.format "
         "json_object or json_schema", "tool_choice"),
])

_SAMPLING = ("model", "temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty", "stream")


@dataclass
class ResponseRequest:
    """A Responses request: the chat request it became, and what the response object echoes back."""
    chat: GenerationRequest
    echo: dict                  # instructions, max_output_tokens, temperature, top_p, tools, tool_choice, ...


def parse_response(body: dict) -> ResponseRequest:
    v = RESPONSE.read(body)           # previous_response_id, conversation: null only (their schema: false)
    chat = {k: v[k] for k in _SAMPLING if v[k] is not None}
    chat["messages"] = _messages(v["instructions"], v["input"])
    if v["max_output_tokens"] is not None:
        chat["max_tokens"] = v["max_output_tokens"]
    if v["tools"]:
        chat["tools"] = [_chat_tool(i, t) for i, t in enumerate(v["tools"])]
    choice = v["tool_choice"]
    if choice is not None:
        chat["tool_choice"] = ({"type": "function", "function": {"name": choice["name"]}}
                               if isinstance(choice, dict) else choice)
    fmt = (v["text"] or {}).get("format")
    if fmt is not None and fmt["type"] != "text":
        rf: dict = {"type": fmt["type"]}
        if fmt["type"] == "json_schema":
            rf["json_schema"] = {"name": fmt.get("name") or "response",
                                 "schema": check_schema(fmt["schema"], "text.format.schema")}
        chat["response_format"] = rf
    req = parse_chat(chat)
    echo = {"instructions": v["instructions"], "max_output_tokens": v["max_output_tokens"],
            "temperature": v["temperature"], "top_p": v["top_p"], "tools": [_tool_echo(t) for t in v["tools"] or []],
            "tool_choice": choice if choice is not None else "auto",
            "parallel_tool_calls": v["parallel_tool_calls"], "text": {"format": fmt or {"type": "text"}},
            "metadata": v["metadata"] or {}}
    return ResponseRequest(req, echo)


def _chat_tool(i: int, t: dict) -> dict:
    params = t.get("parameters")
    if params is not None:
        check_schema(params, f"tools[{i}].parameters")
    fn = {"name": t["name"], **({"description": t["description"]} if t.get("description") else {}),
          **({"parameters": params} if params is not None else {})}
    return {"type": "function", "function": fn}


def _tool_echo(t: dict) -> dict:
    return {"type": "function", "name": t["name"], "description": t.get("description"),
            "parameters": t.get("parameters"), "strict": t.get("strict")}


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def _messages(instructions: str | None, inp) -> list[dict]:
    """The chat messages of `instructions` + `input`."""
    out: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(inp, str):
        return out + [{"role": "user", "content": inp}]
    for i, item in enumerate(inp):
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "function_call":
            try:
                args = json.loads(item["arguments"])
            except ValueError:
                raise bad_request(f"input[{i}].arguments must be JSON text; got {item['arguments'][:60]!r}",
                                  param="input", code="invalid_json") from None
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": json.dumps(args, ensure_ascii=False)}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])})
    return out


# ---------------------------------------------------------------- the answer

class OutputItems:
    """The output items of one answer, built from the chat path's deltas ({"content": text} and the tool-call
    parser's {"tool_calls": [...]}); feed() and close() return the stream events that built them (without
    sequence_number, which the writer numbers).

        content       -> a message item (output_item.added, content_part.added), then output_text.delta
        a new call    -> the open item closed (its .done events), a function_call item added
        its arguments -> function_call_arguments.delta
    """

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.items: list[dict] = []
        self._open: dict | None = None        # the item being generated

    def feed(self, deltas: list[dict]) -> list[dict]:
        events: list[dict] = []
        for d in deltas:
            if d.get("content"):
                if self._open is None or self._open["type"] != "message":
                    events += self._close("completed") + self._add_message()
                part = self._open["content"][0]
                part["text"] += d["content"]
                events.append({"type": "response.output_text.delta", **self._where(), "content_index": 0,
                               "delta": d["content"], "logprobs": []})
            for tc in d.get("tool_calls") or ():
                fn = tc["function"]
                if "id" in tc:
                    events += self._close("completed")
                    item = {"id": f"fc_{self.request_id}_{len(self.items)}", "type": "function_call",
                            "status": "in_progress", "call_id": tc["id"], "name": fn["name"], "arguments": ""}
                    events += self._add(item)
                if fn.get("arguments"):
                    self._open["arguments"] += fn["arguments"]
                    events.append({"type": "response.function_call_arguments.delta", **self._where(),
                                   "delta": fn["arguments"]})
        return events

    def close(self, status: str) -> list[dict]:
        """The end of the answer: the open item done with status (completed | incomplete); an answer with no
        output gets an empty message, as OpenAI answers."""
        events = [] if self.items else self._add_message()
        return events + self._close(status)

    @property
    def calls(self) -> list[dict]:
        return [i for i in self.items if i["type"] == "function_call"]

    def _where(self) -> dict:
        return {"item_id": self._open["id"], "output_index": len(self.items) - 1}

    def _add(self, item: dict) -> list[dict]:
        self.items.append(item)
        self._open = item
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": copy.deepcopy(item)}]

    def _add_message(self) -> list[dict]:
        events = self._add({"id": f"msg_{self.request_id}_{len(self.items)}", "type": "message",
                            "status": "in_progress", "role": "assistant", "content": []})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._open["content"].append(part)
        return events + [{"type": "response.content_part.added", **self._where(), "content_index": 0,
                          "part": dict(part)}]

    def _close(self, status: str) -> list[dict]:
        item = self._open
        if item is None:
            return []
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            events += [{"type": "response.output_text.done", **self._where(), "content_index": 0,
                        "text": part["text"], "logprobs": []},
                       {"type": "response.content_part.done", **self._where(), "content_index": 0,
                        "part": dict(part)}]
        else:
            events.append({"type": "response.function_call_arguments.done", **self._where(),
                           "arguments": item["arguments"]})
        item["status"] = status
        events.append({"type": "response.output_item.done", "output_index": len(self.items) - 1,
                       "item": copy.deepcopy(item)})
        self._open = None
        return events


def response_object(req: ResponseRequest, *, response_id: str, model: str, created: int, status: str,
                    output: list[dict], usage: dict | None) -> dict:
    """The Response object: status in_progress (stream start), completed, or incomplete (max_output_tokens)."""
    return {"id": response_id, "object": "response", "created_at": created, "status": status,
            "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": model, "output": output, "previous_response_id": None, "reasoning": None, "store": False,
            "truncation": "disabled", "usage": usage, "user": None, **req.echo}


def response_status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def response_usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens}


class ResponsesRenderer(ChatAnswer):
    """One response built from the engine's text deltas, streamed or not. Streamed as OpenAI streams a response:
    `event: TYPE` + `data: {...}` per event, numbered by sequence_number:

        response.created, response.in_progress               (the response, status in_progress, no output)
        response.output_item.added                           (a message, or a function_call)
          response.content_part.added, response.output_text.delta ..., response.output_text.done,
          response.content_part.done                         (a message)
          response.function_call_arguments.delta ..., .done  (a function call)
        response.output_item.done
        response.completed | response.incomplete             (the whole response, as the non-streamed answer)

    An error after the stream has begun is an `error` event, then the stream ends."""

    def __init__(self, gen: Generation, rr: ResponseRequest):
        super().__init__(gen)
        self.rr = rr
        self.id = f"resp_{gen.request_id}"
        self.items = OutputItems(gen.request_id)
        self.seq = 0

    def feed_deltas(self, deltas: list[dict]) -> list[dict]:
        return self.items.feed(deltas)

    def close(self, out) -> tuple[dict, list[dict]]:
        status = response_status(out.finish_reason)
        closing = self.items.close(status)
        usage = response_usage(out.prompt_tokens, len(out.token_ids), out.cached_tokens)
        return self._object(status, self.items.items, usage), closing

    def _object(self, status: str, output: list[dict], usage: dict | None) -> dict:
        return response_object(self.rr, response_id=self.id, model=self.gen.model, created=self.gen.created,
                               status=status, output=output, usage=usage)

    def opening(self) -> list[bytes]:
        start = self._object("in_progress", [], None)
        return [self.event({"type": "response.created", "response": start}),
                self.event({"type": "response.in_progress", "response": start})]

    def final_events(self, answer: dict) -> list[dict]:
        kind = "response.incomplete" if answer["status"] == "incomplete" else "response.completed"
        return [{"type": kind, "response": answer}]

    def event(self, e: dict) -> bytes:
        e = {"type": e["type"], "sequence_number": self.seq, **{k: v for k, v in e.items() if k != "type"}}
        self.seq += 1
        return sse(e, e["type"])

    def stream_error(self, err: APIError) -> bytes:
        return self.event({"type": "error", "code": err.code, "message": err.message, "param": err.param})
