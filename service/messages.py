"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat path
(protocol/messages.py translates the body and renders the answer, streamed or not; lifecycle.py runs it). Errors,
before or during a stream, are in Anthropic's envelope; the key may come as `x-api-key` (the `anthropic` client's
header) or `Authorization: Bearer` (auth.py)."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from ortllm.protocol.generation import prompt_ids, resolve_adapter
from ortllm.protocol.messages import COUNT_TOKENS, MESSAGES, MessagesRenderer, parse_messages

from .body import read_json_object
from .lifecycle import answer, speaks
from .openapi import GENERATE, POST, document, json_ok, streamed
from .resources import current_resources

bp = Blueprint("anthropic", __name__, url_prefix="/v1")
speaks(bp, MessagesRenderer)


@bp.post("/messages")
@document("Anthropic Messages API: answer a conversation, use tools (stream: server-sent events)", body=MESSAGES,
          errors=GENERATE, error_schema="AnthropicError",
          ok=streamed("AnthropicMessage", "text/event-stream", "the message"))
def create_message():
    mr = parse_messages(read_json_object(request))
    return answer("messages", mr.chat, lambda gen: MessagesRenderer(gen, mr))


@bp.post("/messages/count_tokens")
@document("Anthropic Messages API: the prompt's token count (as /v1/messages would render it)", body=COUNT_TOKENS,
          errors=(*POST, 404), error_schema="AnthropicError", ok=json_ok("AnthropicTokenCount"))
def count_tokens():
    mr = parse_messages(read_json_object(request), count_only=True)
    res, model = current_resources().route(mr.chat.model)
    engine = res.require_engine()
    resolve_adapter(engine, res.model_name, model)
    return jsonify({"input_tokens": len(prompt_ids(engine, mr.chat))})
