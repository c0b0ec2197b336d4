"""Operational endpoints: /health, /metrics, /openapi.json, /tokenize, /detokenize."""
from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ortllm.protocol import openai as protocol
from ortllm.protocol.bodies import DETOKENIZE, TOKENIZE
from ortllm.runtime.errors import InvalidTokenIds

from .api import model_cards
from .body import read_json_object
from .errors import APIError
from .metrics import current_metrics
from .openapi import POST, build_spec, document, json_ok
from .resources import current_resources

bp = Blueprint("ops", __name__)


@bp.get("/health")
@document("200 when serving; 503 while loading, draining, after a fatal engine error or while recent model runs "
          "failed", ok=json_ok("Health", "ok"), more={503: json_ok("Health", "not healthy")})
def health():
    status, body = current_resources().health()
    return jsonify(body), status


@bp.get("/metrics")
@document("Prometheus metrics", ok={"description": "text exposition format",
                                    "content": {"text/plain": {"schema": {"type": "string"}}}})
def metrics():
    return Response(generate_latest(current_metrics().registry), mimetype=CONTENT_TYPE_LATEST)


@bp.get("/openapi.json")
@document("This document (OpenAPI 3.1): `model` lists what is served now", ok=json_ok("OpenAPI"))
def openapi():
    pool = current_resources()
    bounds = {}
    try:
        models = [c["id"] for c in model_cards()]
        if not pool.lazy:              # one model: its limits (several: each its own, not one number)
            engine = pool.default.require_engine()
            bounds = {"token_id": engine.vocab_size - 1, "tokenizer_token_id": engine.tokenizer.vocab_size - 1,
                      "embedding_width": engine.hidden_size}
    except APIError:                   # still loading: the names known without the engine
        models = [pool.model_name] if pool.model_name else []
    return jsonify(build_spec(current_app, models, bounds, key=current_app.config["ORTLLM"].api_key is not None))


@bp.post("/tokenize")
@document("Token ids of a prompt or a conversation", body=TOKENIZE, ok=json_ok("Tokens"), errors=POST)
def tokenize():
    engine = current_resources().require_engine()
    v = TOKENIZE.read(read_json_object(request))
    if v["messages"] is not None:
        req = protocol.parse_chat({"messages": v["messages"]})
        text = engine.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True)
        ids = engine.tokenizer.encode(text)
    else:
        ids = engine.tokenizer.encode(v["prompt"], add_special_tokens=v["add_special_tokens"])
    return jsonify({"tokens": ids, "count": len(ids), "max_model_len": engine.context_length})


@bp.post("/detokenize")
@document("Text of token ids", body=DETOKENIZE, ok=json_ok("Text"), errors=POST)
def detokenize():
    engine = current_resources().require_engine()
    tokens = DETOKENIZE.read(read_json_object(request))["tokens"]
    vocab = engine.tokenizer.vocab_size
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise InvalidTokenIds(f"token ids must be in [0, {vocab}); got {bad[:5]}")
    return jsonify({"prompt": engine.tokenizer.decode(tokens, skip_special_tokens=False)})
