"""Embeddings over HTTP: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed and its older /api/embeddings
(bodies, checks and answers: ortllm.protocol.embeddings).

Each input is one engine request (Engine.submit_embed): prefill-only rows in the same continuous batches as the
generations, its final hidden states pooled when its last chunk has run. lifecycle.py waits for them as for a
generation: a client that leaves, or the per-request timeout, cancels what is still queued or running."""
from __future__ import annotations

from flask import Blueprint, request

from ortllm.protocol import embeddings as protocol

from .body import read_json_object
from .lifecycle import answer
from .openapi import GENERATE, document, json_ok

bp = Blueprint("embeddings", __name__)


def _answer(kind: str, req: protocol.EmbeddingRequest):
    return answer(kind, req, lambda gen: protocol.EmbeddingsRenderer(gen, kind))


@bp.post("/v1/embeddings")
@document("Embed texts or token ids: pooled final hidden states of the served model", body=protocol.EMBEDDINGS,
          ok=json_ok("EmbeddingList"), errors=GENERATE)
def embeddings():
    return _answer("embeddings", protocol.parse_embeddings(read_json_object(request)))


@bp.post("/api/embed")
@document("Ollama: embed a string or a list of strings (L2-normalized)", body=protocol.OLLAMA_EMBED,
          ok=json_ok("OllamaEmbed"), errors=GENERATE)
def ollama_embed():
    return _answer("ollama_embed", protocol.parse_ollama_embed(read_json_object(request)))


@bp.post("/api/embeddings")
@document("Ollama (older route): embed one prompt (not normalized)", body=protocol.OLLAMA_EMBEDDINGS,
          ok=json_ok("OllamaEmbedding"), errors=GENERATE)
def ollama_embeddings():
    return _answer("ollama_embeddings", protocol.parse_ollama_embeddings(read_json_object(request)))
