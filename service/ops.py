"""Operational endpoints: /health, /metrics, /openapi.json, /tokenize, /detokenize."""
from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ortllm.protocol import openai as protocol
from ortllm.runtime.errors import InvalidTokenIds

from .auth import require_api_key
from .body import read_json_object
from .errors import bad_request
from .metrics import current_metrics
from .openapi import build_spec
from .resources import current_resources

bp = Blueprint("ops", __name__)


@bp.get("/health")
def health():
    status, body = current_resources().health()
    return jsonify(body), status


@bp.get("/metrics")
def metrics():
    return Response(generate_latest(current_metrics().registry), mimetype=CONTENT_TYPE_LATEST)


@bp.get("/openapi.json")
def openapi():
    res = current_resources()
    engine = res.engine
    return jsonify(build_spec(res.model_name or "model", engine.context_length if engine else 1 << 20))


@bp.post("/tokenize")
def tokenize():
    require_api_key()
    engine = current_resources().require_engine()
    body = read_json_object(request)
    add_special = body.get("add_special_tokens", True)
    if not isinstance(add_special, bool):
        raise bad_request("add_special_tokens must be true or false", param="add_special_tokens")
    if "messages" in body:
        req = protocol.parse_chat({"messages": body["messages"]})
        text = engine.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True)
        ids = engine.tokenizer.encode(text)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request("send prompt (a string) or messages (a conversation)", param="prompt")
        ids = engine.tokenizer.encode(prompt, add_special_tokens=add_special)
    return jsonify({"tokens": ids, "count": len(ids), "max_model_len": engine.context_length})


@bp.post("/detokenize")
def detokenize():
    require_api_key()
    engine = current_resources().require_engine()
    body = read_json_object(request)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("tokens must be a list of integer token ids", param="tokens")
    vocab = engine.tokenizer.vocab_size
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise InvalidTokenIds(f"token ids must be in [0, {vocab}); got {bad[:5]}")
    return jsonify({"prompt": engine.tokenizer.decode(tokens, skip_special_tokens=False)})
