"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as a translation onto the chat path.

A Messages body is checked against MESSAGES (declared here with fields.py; /openapi.json publishes it), then
translated into the chat body it means and read by openai.parse_chat: one validation and one generation path.

    system (a string or text blocks)        -> a system message first
    user content: text blocks               -> a user message; tool_result blocks -> role tool messages
    assistant content: text, tool_use       -> an assistant message with tool_calls (the input as arguments)
    a last assistant turn (prefill)         -> the reply continues its text (written after the generation prompt)
    max_tokens, stop_sequences              -> max_tokens, stop
    output_config.format {json_schema}      -> response_format json_schema (structured output)
    tools [{name, description, input_schema}] -> function tools;  tool_choice auto | any | tool | none ->
                                               auto | required | the named function | none

The reply goes through the chat path's tool-call parser (tool_calls.py); ContentBlocks turns its deltas into
text and tool_use blocks and the stream events that build them, so a streamed answer and a non-streamed one
are built by the same code (MessagesRenderer). Streamed as Anthropic streams a message, `event: TYPE` +
`data: {...}`:

    message_start                                   (the message, no content, stop_reason null)
    content_block_start, content_block_delta ..., content_block_stop     per block: text (text_delta) or
                                                    tool_use (input_json_delta: the input's JSON text)
    message_delta                                   (stop_reason, stop_sequence, usage)
    message_stop
 Errors use Anthropic's envelope ({"type": "error", "error": {"type", "message"}}).
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass

from .bodies import ADAPTER_MIX, MAX_TOOLS, MIN_P, NAME_PATTERN, SEED
from .errors import APIError
from .fields import Body, Field, Rule, both, boolean, integer, number, sent_as, string
from .openai import GenerationRequest, parse_chat
from .rendering import ChatAnswer, Generation, sse
from .structured import check_schema

MAX_STOP_SEQUENCES = 16

_TEXT_BLOCKS = {"type": "array", "items": {"type": "object", "required": ["type", "text"],
                                           "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}
_BLOCK = {
    "type": "object", "required": ["type"],
    "properties": {
        "type": {"enum": ["text", "tool_use", "tool_result"],
                 "description": "text, tool_use (an earlier answer's call, sent back) or tool_result (its "
                                "result); images and documents are not supported"},
        "text": {"type": "string"}, "id": {"type": "string"}, "name": {"type": "string"},
        "input": {"type": "object"}, "tool_use_id": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, _TEXT_BLOCKS]}, "is_error": {"type": "boolean"}},
    "allOf": [
        {"if": {"properties": {"type": {"const": "text"}}}, "then": {"required": ["text"]}},
        {"if": {"properties": {"type": {"const": "tool_use"}}}, "then": {"required": ["id", "name", "input"]}},
        {"if": {"properties": {"type": {"const": "tool_result"}}}, "then": {"required": ["tool_use_id"]}}]}


def _turn(role: str, *blocks: str) -> dict:
    """A turn of `role` takes these block types only."""
    return {"if": {"required": ["role"], "properties": {"role": {"const": role}}},
            "then": {"properties": {"content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
                "properties": {"type": {"enum": list(blocks)}}}}]}}}}


CONVERSATION = Field("messages", {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"enum": ["user", "assistant"]},
                   "content": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _BLOCK}],
                               "description": "a string or a non-empty list of content blocks"}},
    "allOf": [_turn("user", "text", "tool_result"), _turn("assistant", "text", "tool_use")]}},
                     required=True, description="the conversation, user and assistant turns (tool_use blocks in the "
                                                "assistant's, tool_result blocks in the user's); a last assistant turn "
                                                "of text after another turn or a system prompt is continued "
                                                "(prefill), any other is answered")
SYSTEM = Field("system", {"anyOf": [{"type": "string"}, _TEXT_BLOCKS], "description": "a string or text blocks"},
               description="the system prompt")
TOOLS = Field("tools", {"type": "array", "maxItems": MAX_TOOLS, "items": {
    "type": "object", "required": ["name", "input_schema"],
    "properties": {"type": {"enum": ["custom"], "description": "client tools only (no server tools here)"},
                   "name": {"type": "string", "pattern": NAME_PATTERN}, "description": {"type": "string"},
                   "input_schema": {"type": "object", "required": ["type"],
                                    "properties": {"type": {"const": "object"}},
                                    "description": "a JSON Schema of type object"}}}},
              description="tools the model may use; a call comes back as a tool_use block")
TOOL_CHOICE = Field("tool_choice", {
    "type": "object", "required": ["type"],
    "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}, "name": {"type": "string"},
                   "disable_parallel_tool_use": {"type": "boolean"}},
    "if": {"properties": {"type": {"const": "tool"}}}, "then": {"required": ["name"]}},
    description="auto (default with tools); any: some tool must be used; tool: the named one; none")
OUTPUT_CONFIG = Field("output_config", {"type": "object", "properties": {
    "format": {"type": ["object", "null"], "required": ["type", "schema"],
               "properties": {"type": {"const": "json_schema"}, "schema": {"type": "object",
                                                                          "description": "a JSON Schema"}}},
    "effort": {"description": "accepted; no effect here"}}},
    description="format {type: json_schema, schema}: the text is JSON that validates against the schema")
MODEL = string("model", required=True, minLength=1, description="the served model or adapter (GET /v1/models)")

MESSAGES = Body("MessagesRequest", [
    MODEL, CONVERSATION, integer("max_tokens", None, 1, required=True,
                                 description="the most tokens to generate (capped to the room the context leaves)"),
    SYSTEM,
    Field("stop_sequences", {"type": "array", "maxItems": MAX_STOP_SEQUENCES,
                             "items": {"type": "string", "minLength": 1}},
          description="strings that end the generation (left out of the text; stop_reason says which)"),
    # sampling: newer `anthropic` clients send none of these (extra_body does); older ones do
    number("temperature", 1.0, 0, 1, description="0: greedy"),
    number("top_p", None, 0, 1, lo_open=True), integer("top_k", None, 0, 2**31 - 1, description="0: off"),
    TOOLS, TOOL_CHOICE, OUTPUT_CONFIG,
    boolean("stream", False, "server-sent events: message_start ... message_stop"),
    Field("metadata", {"type": "object"}, description="accepted, not used"),
    SEED, MIN_P, ADAPTER_MIX,
], rules=[                          # those of the chat body it becomes
    Rule(both(sent_as("tool_choice", properties={"type": {"not": {"const": "none"}}}),
              {"not": sent_as("tools", minItems=1)}), "tool_choice needs tools: send them in tools", "tool_choice"),
    Rule(both(sent_as("tool_choice", properties={"type": {"enum": ["any", "tool"]}}),
              sent_as("output_config", required=["format"], properties={"format": {"type": "object"}})),
         "a forced tool use (tool_choice any or tool) cannot be combined with output_config.format", "tool_choice"),
])
COUNT_TOKENS = Body("MessagesCountTokensRequest", [MODEL, CONVERSATION, SYSTEM, TOOLS, TOOL_CHOICE],
                    rules=MESSAGES.rules[:1])


@dataclass
class MessagesRequest:
    chat: GenerationRequest     # the chat request it became
    stop_sequences: list[str]


def parse_messages(body: dict, count_only: bool = False) -> MessagesRequest:
    v = (COUNT_TOKENS if count_only else MESSAGES).read(body)
    turns, prefill = v["messages"], ""
    last = turns[-1]
    if last["role"] == "assistant" and (len(turns) > 1 or v["system"]) and (
            isinstance(last["content"], str) or all(b["type"] == "text" for b in last["content"])):
        prefill = _text(last["content"])          # prefill: the reply continues this text
        turns = turns[:-1]
    chat: dict = {"model": v["model"], "messages": _messages(v["system"], turns)}
    if not count_only:
        chat.update({k: v[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "stream", "seed", "min_p",
                                       "adapters") if v[k] is not None})
    if v["tools"]:
        tools = []
        for i, t in enumerate(v["tools"]):
            schema = check_schema(t["input_schema"], f"tools[{i}].input_schema")
            tools.append({"type": "function", "function": {
                "name": t["name"], **({"description": t["description"]} if t.get("description") else {}),
                "parameters": schema}})
        chat["tools"] = tools
    choice = v["tool_choice"]
    if choice is not None:
        kind = choice["type"]
        chat["tool_choice"] = ({"type": "function", "function": {"name": choice["name"]}} if kind == "tool"
                               else {"any": "required"}.get(kind, kind))
    fmt = (v.get("output_config") or {}).get("format")
    if fmt is not None:
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": check_schema(fmt["schema"], "output_config.format.schema")}}
    req = parse_chat(chat)
    req.prefill = prefill
    stops = list(v.get("stop_sequences") or [])
    req.params.stop = stops
    return MessagesRequest(req, stops)


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


def _messages(system, messages: list[dict]) -> list[dict]:
    out: list[dict] = [{"role": "system", "content": _text(system)}] if system else []
    for i, m in enumerate(messages):
        content = m["content"]
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if m["role"] == "assistant":
            calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
                     for b in content if b["type"] == "tool_use"]
            msg = {"role": "assistant", "content": "".join(b["text"] for b in content if b["type"] == "text")}
            out.append({**msg, "tool_calls": calls} if calls else msg)
            continue
        text: list[str] = []
        for b in content:                 # (CONVERSATION: a user turn has no tool_use blocks)
            if b["type"] == "tool_result":
                result = _text(b.get("content") or "")
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": ("Error: " + result) if b.get("is_error") else result})
            else:
                text.append(b["text"])
        if text:
            out.append({"role": "user", "content": "".join(text)})
    return out


# ---------------------------------------------------------------- the answer

class ContentBlocks:
    """The content blocks of one answer, built from the chat path's deltas ({"content": text} and the tool-call
    parser's {"tool_calls": [...]}); feed() and close() return the stream events that built them.

        content       -> a text block (content_block_start), then text_delta
        a new call    -> the open block stopped, a tool_use block started (input {})
        its arguments -> input_json_delta (partial_json: the arguments' JSON text as generated)
    """

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.blocks: list[dict] = []
        self._args: dict[int, str] = {}       # tool_use block index -> its input's JSON text
        self._open = False

    def feed(self, deltas: list[dict]) -> list[dict]:
        events: list[dict] = []
        for d in deltas:
            if d.get("content"):
                if not self._open or self.blocks[-1]["type"] != "text":
                    events += self._stop() + self._start({"type": "text", "text": ""})
                self.blocks[-1]["text"] += d["content"]
                events.append({"type": "content_block_delta", "index": len(self.blocks) - 1,
                               "delta": {"type": "text_delta", "text": d["content"]}})
            for tc in d.get("tool_calls") or ():
                fn = tc["function"]
                if "id" in tc:
                    events += self._stop()
                    events += self._start({"type": "tool_use", "id": f"toolu_{self.request_id}_{len(self.blocks)}",
                                           "name": fn["name"], "input": {}})
                    self._args[len(self.blocks) - 1] = ""
                if fn.get("arguments"):
                    self._args[len(self.blocks) - 1] += fn["arguments"]
                    events.append({"type": "content_block_delta", "index": len(self.blocks) - 1,
                                   "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
        return events

    def close(self) -> list[dict]:
        """The end of the answer: the open block stopped (an answer with no content gets an empty text block)."""
        events = [] if self.blocks else self._start({"type": "text", "text": ""})
        return events + self._stop()

    def content(self) -> list[dict]:
        """The blocks of the non-streamed message: tool_use input parsed; a call whose arguments are not a JSON
        object (cut off by max_tokens) is given as the text it is."""
        out = []
        for i, b in enumerate(self.blocks):
            if b["type"] == "tool_use":
                try:
                    b = {**b, "input": json.loads(self._args[i])}
                    assert isinstance(b["input"], dict)
                except (ValueError, AssertionError):
                    b = {"type": "text", "text": self._args[i]}
            out.append(b)
        return out

    @property
    def has_calls(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)

    def _start(self, block: dict) -> list[dict]:
        self.blocks.append(block)
        self._open = True
        return [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": copy.deepcopy(block)}]

    def _stop(self) -> list[dict]:
        if not self._open:
            return []
        self._open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]


def stop_reason(finish_reason: str, matched, stop_sequences: list[str], has_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): matched is the stop string or token id the generation ended on, if any."""
    if finish_reason == "length":
        return "max_tokens", None
    if has_calls:
        return "tool_use", None
    if isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


def message_usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict:
    """Anthropic's usage: input_tokens excludes the prompt tokens read from the (prefix) cache."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached_tokens}


def message_object(*, message_id: str, model: str, content: list[dict], stop: tuple[str | None, str | None],
                   usage: dict) -> dict:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop[0], "stop_sequence": stop[1], "usage": usage}


# Anthropic's error type per HTTP status
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                504: "timeout_error"}


def error_body(err: APIError, request_id: str | None) -> dict:
    """An APIError in Anthropic's envelope."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(err.status, "invalid_request_error" if
                                                                err.status < 500 else "api_error"),
                                       "message": err.message},
            "request_id": request_id}


class MessagesRenderer(ChatAnswer):
    """One message built from the engine's text deltas, streamed or not."""

    def __init__(self, gen: Generation, mr: MessagesRequest):
        super().__init__(gen)
        self.mr = mr
        self.id = f"msg_{gen.request_id}"
        self.blocks = ContentBlocks(gen.request_id)

    def feed_deltas(self, deltas: list[dict]) -> list[dict]:
        return self.blocks.feed(deltas)

    def close(self, out) -> tuple[dict, list[dict]]:
        closing = self.blocks.close()
        matched = out.stop_reason           # the stop string or token id that ended it
        stop = stop_reason(out.finish_reason, matched, self.mr.stop_sequences, self.blocks.has_calls)
        usage = message_usage(out.prompt_tokens, len(out.token_ids), out.cached_tokens)
        return self._message(self.blocks.content(), stop, usage), closing

    def _message(self, content: list[dict], stop: tuple, usage: dict) -> dict:
        return message_object(message_id=self.id, model=self.gen.model, content=content, stop=stop, usage=usage)

    def opening(self) -> list[bytes]:
        start = self._message([], (None, None), message_usage(len(self.gen.prompts[0]), 0, 0))
        return [self.event({"type": "message_start", "message": start})]

    def final_events(self, answer: dict) -> list[dict]:
        return [{"type": "message_delta", "usage": answer["usage"],
                 "delta": {"stop_reason": answer["stop_reason"], "stop_sequence": answer["stop_sequence"]}},
                {"type": "message_stop"}]

    def event(self, e: dict) -> bytes:
        return sse(e, e["type"])

    def stream_error(self, err: APIError) -> bytes:
        return self.event(error_body(err, self.gen.request_id))

    @staticmethod
    def error_body(err: APIError, request_id: str | None) -> dict:
        return error_body(err, request_id)
