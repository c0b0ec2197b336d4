"""Ollama's answers to /api/generate (field "response") and /api/chat (field "message"), apart from HTTP.

Streamed (Ollama's default) as NDJSON, one JSON object a line: a line per text delta, then the final line
(done: true, done_reason, token counts and durations in ns). Not streamed: the final line alone, with the whole
text. With tools (/api/chat) the text is held and parsed by the OpenAI path's tool-call parser at the end; Ollama's
tool-call arguments are an object, not JSON text. An error once the stream has begun is a line {"error": message}.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from ortllm.runtime.engine import CompletionOutput

from .errors import APIError
from .rendering import Generation, Renderer


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

    def delta(self, i: int, text: str, last: bool) -> list[bytes]:
        return [_line(self._payload(text))] if text and not self.gen.req.tools else []

    def finished(self, i: int, out: CompletionOutput, outs: list) -> list[bytes]:
        return [_line(self._final(out, out.text if self.gen.req.tools else ""))]

    def stream_error(self, err: APIError) -> bytes:
        return _line({"error": err.message})

    def body(self, outs: list[CompletionOutput]) -> dict:
        return self._final(outs[0], outs[0].text)

    def _payload(self, text: str) -> dict:
        return {"model": self.gen.model, "created_at": now(),
                self.field: {"role": "assistant", "content": text} if self.field == "message" else text}

    def _final(self, out: CompletionOutput, text: str) -> dict:
        ns = lambda s: int(s * 1e9)          # noqa: E731
        gen, h = self.gen, self.gen.handles[0]
        line = {**self._payload(text), "done": True, "done_reason": out.finish_reason,
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
