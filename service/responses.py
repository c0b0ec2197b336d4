"""POST /v1/responses: OpenAI's Responses API, stateless, on the chat path (protocol/responses.py translates the
body and renders the answer, streamed as typed server-sent events or not; lifecycle.py runs it)."""
from __future__ import annotations

from flask import Blueprint, request

from ortllm.protocol.responses import RESPONSE, ResponsesRenderer, parse_response

from .body import read_json_object
from .lifecycle import answer
from .openapi import GENERATE, document, streamed

bp = Blueprint("responses", __name__, url_prefix="/v1")


@bp.post("/responses")
@document("OpenAI Responses API, stateless: answer input items, call function tools (stream: typed server-sent "
          "events)", body=RESPONSE, errors=GENERATE, ok=streamed("Response", "text/event-stream", "the response"))
def create_response():
    rr = parse_response(read_json_object(request))
    return answer("responses", rr.chat, lambda gen: ResponsesRenderer(gen, rr))
