"""Embeddings over HTTP: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed and its older /api/embeddings
(bodies and answers: ortllm.protocol.embeddings).

Each input is one engine request (Engine.submit_embed): prefill-only rows in the same continuous batches as the
generations, its final hidden states pooled when its last chunk has run. lifecycle.py waits for them as for a
generation: a client that leaves, or the per-request timeout, cancels what is still queued or running."""
from __future__ import annotations

import time

from flask import Blueprint, g, jsonify, request

from ortllm.runtime.engine import RequestHandle

from ortllm.protocol import embeddings as protocol
from ortllm.protocol.generation import resolve_adapter

from .auth import require_api_key
from .body import read_json_object
from .errors import APIError
from .lifecycle import start_embed
from .openapi import GENERATE, document, json_ok
from .resources import current_resources

bp = Blueprint("embeddings", __name__)
bp.before_request(require_api_key)


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
    """Submit every input, wait for all (lifecycle.py: timeout, client, metrics); (vectors [N, d], the model that
    answered, prompt tokens)."""
    res, name = current_resources().route(req.model)
    res.begin()                       # holds the model (no unloading) until the call closes
    try:
        engine = res.require_engine()
        adapter = resolve_adapter(engine, res.model_name, name)
        protocol.check_dimensions(req, engine.hidden_size)
        room, what = engine.context_length, "the model's context length"
        cfg = engine.config
        for limit, limit_name in ((cfg.scheduler.max_model_len, "max_model_len"),
                                  (engine.stats()["kv_blocks_total"] * cfg.cache.block_size, "the KV pool")):
            if limit is not None and limit < room:
                room, what = limit, limit_name
        several = len(req.inputs) > 1
        ids = []
        for i, x in enumerate(req.inputs):
            if isinstance(x, str) and len(x) > res.max_prompt_chars and not req.truncate:
                raise APIError(400, f"input{f'[{i}]' if several else ''} has {len(x)} characters, more than {room} "
                               "tokens can hold; shorten it", param="input", code="context_length_exceeded")
            ids.append(protocol.fit_input(engine.encode_prompt(x), i, room, what, req.truncate, several))
    except BaseException:
        res.end()
        raise

    def submit(request_id: str) -> list[RequestHandle]:
        handles: list[RequestHandle] = []
        try:
            for i, x in enumerate(ids):
                rid = request_id if i == 0 else f"{request_id}-e{i}"
                handles.append(engine.submit_embed(x, req.pooling, adapter, request_id=rid))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return handles

    model = adapter or res.model_name
    outs = start_embed(kind, res, model, submit).wait_and_close()
    tokens = sum(o.prompt_tokens for o in outs)
    return protocol.vectors(req, [o.embedding for o in outs]), model, tokens
