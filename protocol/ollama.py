"""Ollama's /api/generate and /api/chat apart from HTTP: each body as the OpenAI request it means, and the answers
(field "response", or "message").

A read() Ollama body (protocol/bodies.py: its options take the OpenAI fields' schemas) becomes an OpenAI chat or
completion request (generate_request, chat_request), a model POST /api/create made supplying its system message and
parameters unless the request sends its own:

    options.num_predict -> max_tokens        options.repeat_penalty -> repetition_penalty
    options.temperature/top_p/top_k/min_p/seed/stop/presence_penalty/frequency_penalty -> the same names
    format "json" -> response_format json_object;  format {schema} -> response_format json_schema
    think "low" / "medium" / "high" -> reasoning_effort (chat and templated /api/generate)
    /api/generate: template applied (a chat of system + prompt) unless raw: true (a plain completion)

Streamed (Ollama's default) as NDJSON, one JSON object a line: a line per text delta, then the final line
(done: true, done_reason, token counts and durations in ns). Not streamed: the final line alone, with the whole
text. With tools (/api/chat) the text is held and parsed by the OpenAI path's tool-call parser at the end; Ollama's
tool-call arguments are an object, not JSON text. An error once the stream has begun is a line {"error": message}.
A harmony model's (gpt-oss) chat reply is split as protocol/harmony.py reads it: its analysis channel is the
`thinking` field (of "message" for /api/chat, top-level for /api/generate), its final channel the content.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from ortllm.runtime.engine import CompletionOutput

from . import openai
from .bodies import CHAT_FROM_OLLAMA, OLLAMA_OPTIONS
from .errors import APIError
from .harmony import HarmonyReply
from .rendering import Generation, Renderer

RAW_MAX_TOKENS = 128          # /api/generate raw: true without num_predict


def openai_body(v: dict) -> dict:
    """The sampling part of a read() Ollama body as OpenAI fields."""
    out = {"model": v["model"], "stream": v["stream"]} | ({"adapters": v["adapters"]} if v["adapters"] else {})
    for k, value in (v["options"] or {}).items():
        if k in OLLAMA_OPTIONS and value is not None:
            if k == "num_predict" and value < 0:      # Ollama's -1 / -2: until the context is full
                continue
            out[OLLAMA_OPTIONS[k].name] = value
    if isinstance(v.get("think"), str):          # a level; true / false: accepted, no effect (the field's note)
        out["reasoning_effort"] = v["think"]
    fmt = v["format"]
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    return out


def with_defaults(v: dict, modelfile: dict) -> dict:
    """A created model's parameters under the request's own options."""
    if modelfile.get("parameters"):
        v = {**v, "options": {**modelfile["parameters"], **(v["options"] or {})}}
    return v


def generate_request(v: dict, modelfile: dict) -> tuple[str, openai.GenerationRequest]:
    """A read() /api/generate body -> ("chat", the chat of its system and prompt), or with raw: true
    ("completions", a plain completion). modelfile: a created model's defaults ({} for none)."""
    v = with_defaults(v, modelfile)
    system = v["system"] if v["system"] is not None or v["raw"] else modelfile.get("system")
    oa = openai_body(v)
    if v["raw"]:
        oa.pop("reasoning_effort", None)          # no template to render it
        return "completions", openai.parse_completion(
            {**oa, "prompt": v["prompt"], "max_tokens": oa.get("max_tokens", RAW_MAX_TOKENS)})
    msgs = [{"role": "system", "content": system}] if system is not None else []
    return "chat", openai.parse_chat({**oa, "messages": msgs + [{"role": "user", "content": v["prompt"]}]})


def chat_request(v: dict, modelfile: dict) -> openai.GenerationRequest:
    """A read() /api/chat body -> the chat request, a created model's system message first unless it has one."""
    v = with_defaults(v, modelfile)
    messages = v["messages"]
    if modelfile.get("system") is not None and not any(isinstance(m, dict) and m.get("role") == "system"
                                                       for m in messages):
        messages = [{"role": "system", "content": modelfile["system"]}, *messages]
    extra = {"tools": v["tools"]} if v["tools"] else {}
    return openai.parse_chat({**openai_body(v), "messages": messages, **extra}, CHAT_FROM_OLLAMA)


def now() -> str:
    """Ollama's timestamps: UTC, ISO 8601 with a Z."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class OllamaRenderer(Renderer):
    media_type = "application/x-ndjson"
    stream_headers: dict = {}

    def __init__(self, gen: Generation, field: str):
        super().__init__(gen)
        self.field = field              # "response" (/api/generate) or "message" (/api/chat)
        # a harmony reply (gpt-oss, not raw): its analysis channel is Ollama's `thinking`, its final the content
        self.harmony = gen.harmony and gen.req.messages is not None
        self._reply = HarmonyReply() if self.harmony else None       # the streamed reply's parser

    def delta(self, i: int, text: str, last: bool) -> list[bytes]:
        if self.gen.req.tools:
            return []
        if self._reply is not None:
            deltas = self._reply.feed(text) + (self._reply.finish() if last else [])
            return [_line(self._payload(d.get("content", ""), d.get("reasoning_content", ""))) for d in deltas]
        return [_line(self._payload(text))] if text else []

    def finished(self, i: int, out: CompletionOutput, outs: list) -> list[bytes]:
        return [_line(self._final(out, out.text if self.gen.req.tools else ""))]

    def stream_error(self, err: APIError) -> bytes:
        return _line({"error": err.message})

    def body(self, outs: list[CompletionOutput]) -> dict:
        if self.harmony:
            reply = HarmonyReply()
            reply.feed(outs[0].text)
            reply.finish()
            return self._final(outs[0], reply.content, reply.reasoning)
        return self._final(outs[0], outs[0].text)

    def _payload(self, text: str, thinking: str = "") -> dict:
        if self.field == "message":
            msg = {"role": "assistant", "content": text} | ({"thinking": thinking} if thinking else {})
            return {"model": self.gen.model, "created_at": now(), "message": msg}
        return {"model": self.gen.model, "created_at": now(), "response": text} | (
            {"thinking": thinking} if thinking else {})

    def _final(self, out: CompletionOutput, text: str, thinking: str = "") -> dict:
        ns = lambda s: int(s * 1e9)          # noqa: E731
        gen, h = self.gen, self.gen.handles[0]
        line = {**self._payload(text, thinking), "done": True, "done_reason": out.finish_reason,
                "total_duration": ns(time.perf_counter() - gen.t_arrival), "prompt_eval_count": out.prompt_tokens,
                "eval_count": len(out.token_ids)}
        if h.first_token_time is not None:
            line["prompt_eval_duration"] = ns(h.first_token_time - h.submitted)
            line["eval_duration"] = ns(max(0.0, time.monotonic() - h.first_token_time))
        if self.field == "message" and gen.req.tools and out.finish_reason == "stop":
            reader = gen.req.tools.reader(gen.request_id)          # the OpenAI path's parser
            reader.feed(out.text)
            reader.finish()
            try:
                calls = [{"function": {"name": c["function"]["name"],
                                       "arguments": json.loads(c["function"]["arguments"])}} for c in reader.calls]
            except ValueError:
                calls = []
            if calls:
                line["message"] = {"role": "assistant", "content": reader.content, "tool_calls": calls}
        return line
