"""Embeddings over HTTP: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed and its older /api/embeddings
(bodies and answers: ortllm.protocol.embeddings).

Each input is one engine request (Engine.submit_embed): prefill-only rows in the same continuous batches as the
generations, its final hidden states pooled when its last chunk has run. The handler waits in short slices, so a
client that hangs up or the per-request timeout cancels what is still queued or running."""
from __future__ import annotations

import logging
import time

from flask import Blueprint, g, jsonify, request

from ortllm.runtime.engine import RequestHandle

from ortllm.protocol import embeddings as protocol
from ortllm.protocol.generation import resolve_adapter

from .auth import require_api_key
from .body import read_json_object
from .errors import APIError, ClientGone, unavailable
from .metrics import current_metrics
from .openapi import GENERATE, document, json_ok
from .resources import current_resources

log = logging.getLogger("ortllm.service")
bp = Blueprint("embeddings", __name__)
bp.before_request(require_api_key)

_POLL_S = 0.25     # how often a waiting handler checks for a hung-up client and its timeout


@bp.post("/v1/embeddings")
@document("Embed texts or token ids: pooled final hidden states of the served model", body=protocol.EMBEDDINGS,
          ok=json_ok("EmbeddingList"), errors=GENERATE)
def embeddings():
    req = protocol.parse_embeddings(read_json_object(request))
    vecs, model, tokens = _embed(req, "embeddings")
    return jsonify(protocol.openai_body(req, vecs, model, tokens))


@bp.post("/api/embed")
@document("Ollama: embed a string or a list of strings (L2-normalized)", body=protocol.OLLAMA_EMBED,
          ok=json_ok("OllamaEmbed"), errors=GENERATE)
def ollama_embed():
    req = protocol.parse_ollama_embed(read_json_object(request))
    vecs, model, tokens = _embed(req, "ollama_embed")
    total = int((time.perf_counter() - g.t_start) * 1e9)
    return jsonify(protocol.ollama_embed_body(vecs, model, tokens, total))


@bp.post("/api/embeddings")
@document("Ollama (older route): embed one prompt (not normalized)", body=protocol.OLLAMA_EMBEDDINGS,
          ok=json_ok("OllamaEmbedding"), errors=GENERATE)
def ollama_embeddings():
    req = protocol.parse_ollama_embeddings(read_json_object(request))
    vecs, _, _ = _embed(req, "ollama_embeddings")
    return jsonify(protocol.ollama_embeddings_body(vecs))


def _embed(req: protocol.EmbeddingRequest, kind: str):
    """Submit every input, wait for all; (vectors [N, d], the model that answered, prompt tokens)."""
    res, name = current_resources().route(req.model)
    res.begin()                       # holds the model (no unloading) until the answer is built
    handles: list[RequestHandle] = []
    try:
        engine = res.require_engine()
        adapter = resolve_adapter(engine, res.model_name, name)
        protocol.check_dimensions(req, engine.hidden_size)
        room, what = engine.limits.room, engine.limits.what      # runtime/limits.py
        several = len(req.inputs) > 1
        ids = []
        for i, x in enumerate(req.inputs):
            if isinstance(x, str) and len(x) > res.max_prompt_chars and not req.truncate:
                raise APIError(400, f"input{f'[{i}]' if several else ''} has {len(x)} characters, more than {room} "
                               "tokens can hold; shorten it", param="input", code="context_length_exceeded")
            ids.append(protocol.fit_input(engine.encode_prompt(x), i, room, what, req.truncate, several))
        for i, x in enumerate(ids):
            rid = g.request_id if i == 0 else f"{g.request_id}-e{i}"
            handles.append(engine.submit_embed(x, req.pooling, adapter, request_id=rid))
        outs = _wait(handles, res.config.request_timeout_s, request.environ.get("waitress.client_disconnected"))
    finally:
        for h in handles:
            if not h.done:
                h.cancel()
        res.end()
    tokens = sum(o.prompt_tokens for o in outs)
    model = adapter or res.model_name
    metrics = current_metrics()
    metrics.requests.labels(model, kind, "stop").inc()
    metrics.prompt_tokens.inc(tokens)
    log.info("embeddings finished", extra={"request_id": g.request_id, "endpoint": kind, "inputs": len(outs),
                                           "prompt_tokens": tokens,
                                           "duration_s": round(time.perf_counter() - g.t_start, 4)})
    return protocol.vectors(req, [o.embedding for o in outs]), model, tokens


def _wait(handles: list[RequestHandle], timeout_s: float, disconnected) -> list:
    deadline = g.t_start + timeout_s
    outs = []
    for h in handles:
        while True:
            try:
                out = h.result(timeout=_POLL_S)
                break
            except TimeoutError:
                if time.perf_counter() > deadline:
                    raise APIError(504, f"the embeddings did not finish within the server's request timeout "
                                   f"({timeout_s:g} s); send fewer inputs", type="timeout_error",
                                   code="request_timeout") from None
                if disconnected is not None and disconnected():
                    raise ClientGone() from None
        if out.embedding is None:
            reason = {"deadline": "the request waited too long in the queue; retry later"}.get(
                out.finish_reason, f"the model run for this request failed ({out.error}); retry")
            raise unavailable(reason, "model_run_failed" if out.finish_reason == "error" else "cancelled")
        outs.append(out)
    return outs
