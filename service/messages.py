"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat path
(protocol/messages.py translates the body; api.start submits it; the reply is read by the chat path's tool-call
parser). Errors, before or during a stream, are in Anthropic's envelope; the key (auth.py) may come as `x-api-key` (the
`anthropic` client's header) or `Authorization: Bearer`.

Streamed as Anthropic streams a message, `event: TYPE` + `data: {...}`:

    message_start                                   (the message, no content, stop_reason null)
    content_block_start, content_block_delta ..., content_block_stop     per block: text (text_delta) or
                                                    tool_use (input_json_delta: the input's JSON text)
    message_delta                                   (stop_reason, stop_sequence, usage)
    message_stop
"""
from __future__ import annotations

import json
import logging
from typing import Iterator

from flask import Blueprint, g, jsonify, request

from ortllm.protocol.generation import prompt_ids, resolve_adapter
from ortllm.protocol.messages import (COUNT_TOKENS, MESSAGES, ContentBlocks, MessagesRequest, error_body,
                                      message_object, message_usage, parse_messages, stop_reason)

from .api import Call, event_stream, start, wait_and_close
from .body import read_json_object
from .errors import APIError, ClientGone, to_api_error
from .openapi import GENERATE, POST, document, json_ok, streamed
from .resources import current_resources

log = logging.getLogger("ortllm.service")
bp = Blueprint("anthropic", __name__, url_prefix="/v1")


@bp.errorhandler(Exception)
def _error(e: Exception):
    """Every error of these routes in Anthropic's envelope (the app's handler does the OpenAI one)."""
    err = to_api_error(e)
    if err is None:
        log.exception("unhandled error", extra={"path": request.path})
        err = APIError(500, f"internal error ({type(e).__name__}); report request id {g.get('request_id')}",
                       type="server_error", code="internal_error")
    elif err.status >= 500:
        log.warning("request failed", extra={"status": err.status, "code": err.code, "error": err.message})
    resp = jsonify(error_body(err, g.get("request_id")))
    resp.status_code = err.status
    resp.headers.update(err.headers)
    return resp


@bp.post("/messages")
@document("Anthropic Messages API: answer a conversation, use tools (stream: server-sent events)", body=MESSAGES,
          errors=GENERATE, error_schema="AnthropicError",
          ok=streamed("AnthropicMessage", "text/event-stream", "the message"))
def create_message():
    mr = parse_messages(read_json_object(request))
    call = start("messages", mr.chat)
    answer = _Answer(mr, call)
    if mr.chat.stream:
        return event_stream(answer.sse(), call)
    out = wait_and_close(call)[0]
    answer.feed(out.text)
    return jsonify(answer.finish(out))


@bp.post("/messages/count_tokens")
@document("Anthropic Messages API: the prompt's token count (as /v1/messages would render it)", body=COUNT_TOKENS,
          errors=(*POST, 404), error_schema="AnthropicError", ok=json_ok("AnthropicTokenCount"))
def count_tokens():
    mr = parse_messages(read_json_object(request), count_only=True)
    res, model = current_resources().route(mr.chat.model)
    engine = res.require_engine()
    resolve_adapter(engine, res.model_name, model)
    return jsonify({"input_tokens": len(prompt_ids(engine, mr.chat))})


class _Answer:
    """One message being built from the engine's text deltas, streamed or not."""

    def __init__(self, mr: MessagesRequest, call: Call):
        self.mr, self.call = mr, call
        self.id = f"msg_{call.request_id}"
        tools = mr.chat.tools
        self.reader = tools.reader(call.request_id) if tools else None   # the chat path's tool-call parser
        self.blocks = ContentBlocks(call.request_id)

    def feed(self, delta: str, last: bool = True) -> list[dict]:
        if self.reader is None:
            deltas = [{"content": delta}] if delta else []
        else:
            deltas = self.reader.feed(delta) + (self.reader.finish() if last else [])
        return self.blocks.feed(deltas)

    def finish(self, out) -> dict:
        """The blocks closed and the message; self.closing: the events that closed them."""
        self.closing = self.blocks.close()
        matched = self.call.handles[0].detok.stop_reason       # the stop string or token id that ended it
        self.stop = stop_reason(out.finish_reason, matched, self.mr.stop_sequences, self.blocks.has_calls)
        self.usage = message_usage(out.prompt_tokens, len(out.token_ids), out.cached_tokens)
        return message_object(message_id=self.id, model=self.call.model, content=self.blocks.content(),
                              stop=self.stop, usage=self.usage)

    # ------------------------------------------------ streaming
    @staticmethod
    def _event(e: dict) -> bytes:
        return f"event: {e['type']}\ndata: ".encode() + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"

    def sse(self) -> Iterator[bytes]:
        try:
            yield from self._events()
        except ClientGone:
            return
        except APIError as e:
            yield self._event(error_body(e, self.call.request_id))
        except Exception as e:  # noqa: BLE001 - a bug; the status line has gone out, so say it in the stream
            log.exception("stream failed", extra={"request_id": self.call.request_id})
            err = APIError(500, f"internal error ({type(e).__name__}); request id {self.call.request_id}")
            yield self._event(error_body(err, self.call.request_id))
        finally:
            self.call.close()

    def _events(self) -> Iterator[bytes]:
        prompt = len(self.call.prompts[0])
        yield self._event({"type": "message_start", "message": message_object(
            message_id=self.id, model=self.call.model, content=[], stop=(None, None),
            usage=message_usage(prompt, 0, 0))})
        for _, delta, finish in self.call.events():
            for e in self.feed(delta, last=finish is not None):
                yield self._event(e)
            if finish is not None:
                self.finish(self.call._finish(0, self.call.handles[0].result(timeout=5)))
                for e in self.closing:
                    yield self._event(e)
                yield self._event({"type": "message_delta", "usage": self.usage,
                                   "delta": {"stop_reason": self.stop[0], "stop_sequence": self.stop[1]}})
                yield self._event({"type": "message_stop"})
