"""POST /v1/responses: OpenAI's Responses API, stateless, on the chat path (protocol/responses.py translates the
body; api.start submits it; the reply is read by the chat path's tool-call parser).

Streamed as OpenAI streams a response: `event: TYPE` + `data: {...}` per event, numbered by sequence_number:

    response.created, response.in_progress               (the response, status in_progress, no output)
    response.output_item.added                           (a message, or a function_call)
      response.content_part.added, response.output_text.delta ..., response.output_text.done,
      response.content_part.done                         (a message)
      response.function_call_arguments.delta ..., .done  (a function call)
    response.output_item.done
    response.completed | response.incomplete             (the whole response, as the non-streamed answer)

An error after the stream has begun is an `error` event, then the stream ends.
"""
from __future__ import annotations

import json
import logging
from typing import Iterator

from flask import Blueprint, jsonify, request

from ortllm.protocol.responses import (RESPONSE, OutputItems, ResponseRequest, parse_response, response_object,
                                       response_status, response_usage)

from .api import Call, event_stream, start, wait_and_close
from .auth import require_api_key
from .body import read_json_object
from .errors import APIError, ClientGone
from .openapi import GENERATE, document, streamed

log = logging.getLogger("ortllm.service")
bp = Blueprint("responses", __name__, url_prefix="/v1")
bp.before_request(require_api_key)


@bp.post("/responses")
@document("OpenAI Responses API, stateless: answer input items, call function tools (stream: typed server-sent "
          "events)", body=RESPONSE, errors=GENERATE, ok=streamed("Response", "text/event-stream", "the response"))
def create_response():
    rr = parse_response(read_json_object(request))
    call = start("responses", rr.chat)
    answer = _Answer(rr, call)
    if rr.chat.stream:
        return event_stream(answer.sse(), call)
    out = wait_and_close(call)[0]
    answer.feed(out.text)
    return jsonify(answer.finish(out))


class _Answer:
    """One response being built from the engine's text deltas, streamed or not."""

    def __init__(self, rr: ResponseRequest, call: Call):
        self.rr, self.call = rr, call
        self.id = f"resp_{call.request_id}"
        tools = rr.chat.tools
        self.reader = tools.reader(call.request_id) if tools else None   # the chat path's tool-call parser
        self.items = OutputItems(call.request_id)
        self.seq = 0

    def feed(self, delta: str, last: bool = True) -> list[dict]:
        if self.reader is None:
            deltas = [{"content": delta}] if delta else []
        else:
            deltas = self.reader.feed(delta) + (self.reader.finish() if last else [])
        return self.items.feed(deltas)

    def finish(self, out) -> dict:
        """The items closed and the final response object; self.closing: the events that closed them."""
        status = response_status(out.finish_reason)
        self.closing = self.items.close(status)
        usage = response_usage(out.prompt_tokens, len(out.token_ids), out.cached_tokens)
        return self._object(status, self.items.items, usage)

    def _object(self, status: str, output: list[dict], usage: dict | None) -> dict:
        return response_object(self.rr, response_id=self.id, model=self.call.model, created=self.call.created,
                               status=status, output=output, usage=usage)

    # ------------------------------------------------ streaming
    def _event(self, e: dict) -> bytes:
        e = {"type": e["type"], "sequence_number": self.seq, **{k: v for k, v in e.items() if k != "type"}}
        self.seq += 1
        return (f"event: {e['type']}\ndata: ".encode() + json.dumps(e, separators=(",", ":")).encode() + b"\n\n")

    def sse(self) -> Iterator[bytes]:
        try:
            yield from self._events()
        except ClientGone:
            return
        except APIError as e:
            yield self._event({"type": "error", "code": e.code, "message": e.message, "param": e.param})
        except Exception as e:  # noqa: BLE001 - a bug; the status line has gone out, so say it in the stream
            log.exception("stream failed", extra={"request_id": self.call.request_id})
            yield self._event({"type": "error", "code": "internal_error", "param": None,
                               "message": f"internal error ({type(e).__name__}); request id {self.call.request_id}"})
        finally:
            self.call.close()

    def _events(self) -> Iterator[bytes]:
        start_obj = self._object("in_progress", [], None)
        yield self._event({"type": "response.created", "response": start_obj})
        yield self._event({"type": "response.in_progress", "response": start_obj})
        for _, delta, finish in self.call.events():
            for e in self.feed(delta, last=finish is not None):
                yield self._event(e)
            if finish is not None:
                out = self.call._finish(0, self.call.handles[0].result(timeout=5))
                final = self.finish(out)
                for e in self.closing:
                    yield self._event(e)
                kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
                yield self._event({"type": kind, "response": final})
