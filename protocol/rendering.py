"""One generation rendered into an API's wire format, apart from HTTP.

The service's lifecycle (service/lifecycle.py) owns a request from admission to its last byte: submit, waiting,
streaming, the timeout, cancelling for a client that left, metrics, tracing, errors. Each API is a Renderer of
the engine's events (OpenAI chat and completions: protocol/generation.py; Anthropic Messages: messages.py;
Responses: responses.py; Ollama: ollama.py; the embeddings routes: embeddings.py), called in this order:

    streamed      opening()  delta(i, text, last) ...  finished(i, out, outs) ...  closing(outs)  trailer()
                  an error once the status line is out: stream_error(err), then trailer()
                  (a client that left gets nothing more)
    not streamed  body(outs)                       the answer as one JSON object
    refused       error_body(err, request_id)      the API's error envelope (the service's one error handler)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from ortllm.runtime.engine import CompletionOutput, RequestHandle

from .errors import APIError
from .harmony import HarmonyReply
from .openai import GenerationRequest


@dataclass
class Generation:
    """What a renderer reads of one submitted request: choice i is handles[i] (prompt p's j-th completion is
    choice p * n + j)."""
    req: GenerationRequest | Any       # an embeddings request: protocol.embeddings.EmbeddingRequest
    request_id: str
    model: str                          # what answered: an adapter or the base model
    created: int                        # unix seconds
    handles: list[RequestHandle]
    prompts: list[list[int]]            # per prompt, its token ids
    t_arrival: float                    # time.perf_counter() when the request arrived
    token_text: Callable[[int], str]    # one token id's text
    prompt_text: Callable[[int], str]   # prompt p's text (echo)
    harmony: bool = False               # the model replies in harmony (gpt-oss): chat replies split by channel


class Renderer:
    """One API's rendering of one Generation; a fresh renderer per request (it may hold the answer's state)."""

    media_type = "text/event-stream"
    stream_headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

    def __init__(self, gen: Generation):
        self.gen = gen

    def opening(self) -> list[bytes]:
        return []

    def delta(self, i: int, text: str, last: bool) -> list[bytes]:
        """Choice i's next text (may be ""); last: the engine has finished it (finished() follows)."""
        raise NotImplementedError

    def finished(self, i: int, out: CompletionOutput, outs: list[CompletionOutput | None]) -> list[bytes]:
        """Choice i has ended with out; outs: every choice's output so far (None: still running)."""
        raise NotImplementedError

    def closing(self, outs: list[CompletionOutput]) -> list[bytes]:
        return []

    def stream_error(self, err: APIError) -> bytes:
        raise NotImplementedError

    def trailer(self) -> list[bytes]:
        return []

    def body(self, outs: list[CompletionOutput]) -> dict:
        raise NotImplementedError

    @staticmethod
    def error_body(err: APIError, request_id: str | None) -> dict:
        """The API's error envelope (OpenAI's unless the API says otherwise)."""
        return err.body()


class ChatAnswer(Renderer):
    """An API that answers one chat choice from the chat path's deltas ({"content": text} and, with tools, the
    tool-call parser's {"tool_calls": [...]}): Anthropic Messages and Responses. A subclass says how its blocks
    or items are built (feed_deltas, close) and how an event is written (event)."""

    def __init__(self, gen: Generation):
        super().__init__(gen)
        self.reader = chat_reader(gen.req, gen.request_id, gen.harmony)

    def feed_deltas(self, deltas: list[dict]) -> list[dict]:
        raise NotImplementedError

    def close(self, out: CompletionOutput) -> tuple[dict, list[dict]]:
        """(the finished answer object, the stream events that close it)."""
        raise NotImplementedError

    def event(self, e: dict) -> bytes:
        raise NotImplementedError

    def final_events(self, answer: dict) -> list[dict]:
        raise NotImplementedError

    def delta(self, i: int, text: str, last: bool) -> list[bytes]:
        return [self.event(e) for e in self.feed_deltas(chat_deltas(self.reader, text, last))]

    def finished(self, i: int, out: CompletionOutput, outs: list) -> list[bytes]:
        answer, closing = self.close(out)
        return [self.event(e) for e in closing + self.final_events(answer)]

    def body(self, outs: list[CompletionOutput]) -> dict:
        self.feed_deltas(chat_deltas(self.reader, outs[0].text, True))
        return self.close(outs[0])[0]


def chat_reader(req: GenerationRequest, reader_id: str, harmony: bool = False):
    """The parser of one chat reply: harmony's channels (harmony.py) for a harmony model, the tool-call parser
    (tool_calls.py) with tools, its calls named after reader_id; None: neither (the text is the content)."""
    tools = req.tools.reader(reader_id) if req.tools else None
    return HarmonyReply(tools) if harmony else tools


def chat_deltas(reader, text: str, last: bool) -> list[dict]:
    """A text delta as the chat path's deltas: {"content": text}, or what the reply's parser makes of it
    ({"reasoning_content": ...} too for harmony; APIs without a reasoning field drop those)."""
    if reader is None:
        return [{"content": text}] if text else []
    return reader.feed(text) + (reader.finish() if last else [])


def sse(obj: dict, event: str | None = None) -> bytes:
    """One server-sent event: `data: JSON` (OpenAI), or `event: TYPE` + `data: JSON` (Messages, Responses)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
