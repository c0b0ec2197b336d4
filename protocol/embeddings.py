"""Embedding requests apart from HTTP: the bodies of OpenAI's /v1/embeddings and Ollama's /api/embed and
/api/embeddings, declared once (fields.py: validation and /openapi.json), the checks before submit
(prepare_inputs), and the answers (EmbeddingsRenderer).

    /v1/embeddings   input: a string, a list of strings, token ids, or a list of token-id lists;
                     encoding_format float | base64 (little-endian float32, what the openai client asks for by
                     default); dimensions: the first n entries, renormalized; usage.prompt_tokens
    /api/embed       input: a string or a list of strings; truncate (default true): an input past the context
                     is cut to it (false: 400); dimensions as above; L2-normalized, as Ollama's
    /api/embeddings  Ollama's older route: prompt, one vector, not normalized (as Ollama answers it)

Every vector is the pooled final hidden state of the served model (runtime/pooling.py): mean over the input's
tokens by default, or the last token's (`pooling`, an extension, as llama.cpp's --pooling mean|last).
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass

import numpy as np

from ortllm.runtime.engine import CompletionOutput, Engine
from ortllm.runtime.pooling import normalize
from ortllm.runtime.sampling_params import POOLINGS

from .bodies import MODEL, TOKEN_ID
from .errors import APIError, bad_request
from .fields import BOUND, Body, Field, boolean, string
from .generation import resolve_adapter
from .rendering import Generation, Renderer

MAX_INPUTS = 256        # inputs in one request (each is one engine request; the engine queues 256 by default)

_TEXT = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "minItems": 1, "items": TOKEN_ID}
_POOLING = string("pooling", "mean", enum=list(POOLINGS),
                  description="extension: mean over the input's tokens, or the last token's final hidden state")
_DIMENSIONS = Field("dimensions", {"type": "integer", "minimum": 1, BOUND: "embedding_width"},
                    description="keep the first n entries of each vector, renormalized; at most the model's hidden "
                                "size")

EMBEDDINGS = Body("EmbeddingRequest", [
    Field("input", {"anyOf": [_TEXT, _IDS, {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                                            "items": {"anyOf": [_TEXT, _IDS]}}]},
          required=True, description=f"text, token ids, or a list of at most {MAX_INPUTS} of either",
          hint=f"a non-empty string, a non-empty list of token ids, or a list of 1 to {MAX_INPUTS} of those"),
    MODEL,
    string("encoding_format", "float", enum=["float", "base64"],
           description="float: lists of numbers; base64: each vector's little-endian float32 bytes"),
    _DIMENSIONS, _POOLING, string("user", description="accepted, not used"),
])

_OLLAMA_MODEL = string("model", required=True, minLength=1, description="a served model or adapter (GET /api/tags)")
_OLLAMA_COMMON = [
    Field("options", {"type": "object"}, description="accepted; sampling options do not change embeddings"),
    Field("keep_alive", {"anyOf": [{"type": "number"}, {"type": "string"}]}, description="accepted; no effect here"),
]
OLLAMA_EMBED = Body("OllamaEmbedRequest", [
    _OLLAMA_MODEL,
    Field("input", {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": MAX_INPUTS, "items": _TEXT}]},
          required=True, description=f"a string or a list of at most {MAX_INPUTS} strings; empty: no vectors "
                                     "(Ollama's way to load a model)",
          hint=f"a string or a list of at most {MAX_INPUTS} non-empty strings"),
    boolean("truncate", True, "cut an input longer than the context to it; false: such an input is a 400"),
    _DIMENSIONS, _POOLING, *_OLLAMA_COMMON,
])
OLLAMA_EMBEDDINGS = Body("OllamaEmbeddingsRequest", [
    _OLLAMA_MODEL, string("prompt", required=True, description="the text; empty: no vector"), *_OLLAMA_COMMON,
])


@dataclass
class EmbeddingRequest:
    inputs: list[str | list[int]]     # each one engine request
    model: str | None
    pooling: str = "mean"
    dimensions: int | None = None
    encoding_format: str = "float"
    truncate: bool = False            # cut inputs past the context (Ollama's default) instead of a 400
    normalized: bool = True           # Ollama's /api/embeddings answers the raw pooled vector


def parse_embeddings(body: dict) -> EmbeddingRequest:
    v = EMBEDDINGS.read(body)
    x = v["input"]
    inputs = [x] if isinstance(x, str) or isinstance(x[0], int) else list(x)
    return EmbeddingRequest(inputs, v["model"], v["pooling"], v["dimensions"], v["encoding_format"])


def parse_ollama_embed(body: dict) -> EmbeddingRequest:
    v = OLLAMA_EMBED.read(body)
    x = v["input"]
    inputs = ([x] if x else []) if isinstance(x, str) else list(x)
    return EmbeddingRequest(inputs, v["model"], v["pooling"], v["dimensions"], truncate=v["truncate"])


def parse_ollama_embeddings(body: dict) -> EmbeddingRequest:
    v = OLLAMA_EMBEDDINGS.read(body)
    return EmbeddingRequest([v["prompt"]] if v["prompt"] else [], v["model"], truncate=True, normalized=False)


def prepare_inputs(engine: Engine, req: EmbeddingRequest, base_name: str) -> tuple[str | None, list[list[int]]]:
    """Everything checked before submit: the model (req.model: the base or an adapter), dimensions, each input
    within the room the context and the KV pool leave. (the adapter or None, each input's token ids)."""
    adapter = resolve_adapter(engine, base_name, req.model)
    check_dimensions(req, engine.hidden_size)
    room, what = engine.limits.room, engine.limits.what      # runtime/limits.py
    several = len(req.inputs) > 1
    ids = []
    for i, x in enumerate(req.inputs):
        ids.append(fit_input(engine.encode_prompt(x, "input", whole=not req.truncate), i, room, what, req.truncate,
                             several))
    return adapter, ids


def check_dimensions(req: EmbeddingRequest, hidden_size: int) -> None:
    if req.dimensions is not None and req.dimensions > hidden_size:
        raise bad_request(f"dimensions must be in [1, {hidden_size}] (this model's embeddings have {hidden_size}); "
                          f"got {req.dimensions}", param="dimensions")


def fit_input(ids: list[int], index: int, room: int, what: str, truncate: bool, several: bool) -> list[int]:
    """An input's token ids within `room` tokens: cut to it (truncate) or a 400 naming the input."""
    if len(ids) <= room:
        return ids
    if truncate:
        return ids[:room]
    where = f"input[{index}]" if several else "input"
    raise APIError(400, f"{where} has {len(ids)} tokens but at most {room} fit ({what}); shorten it or split it",
                   param="input", code="context_length_exceeded")


def vectors(req: EmbeddingRequest, pooled: list[np.ndarray]) -> np.ndarray:
    """The answer's vectors [N, d]: L2-normalized after keeping `dimensions` entries (or, for Ollama's older
    route, the raw pooled vectors)."""
    if not pooled:
        return np.zeros((0, 0), np.float32)
    v = np.stack(pooled)
    return normalize(v, req.dimensions) if req.normalized else v[:, :req.dimensions]


def _encode(v: np.ndarray, fmt: str):
    return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if fmt == "base64" else v.tolist()


def openai_body(req: EmbeddingRequest, vecs: np.ndarray, model: str, prompt_tokens: int) -> dict:
    return {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
                     for i, v in enumerate(vecs)],
            "model": model, "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def ollama_embed_body(vecs: np.ndarray, model: str, prompt_tokens: int, total_ns: int, load_ns: int = 0) -> dict:
    return {"model": model, "embeddings": vecs.tolist(), "total_duration": total_ns, "load_duration": load_ns,
            "prompt_eval_count": prompt_tokens}


def ollama_embeddings_body(vecs: np.ndarray) -> dict:
    return {"embedding": vecs[0].tolist() if len(vecs) else []}


class EmbeddingsRenderer(Renderer):
    """The answer of each embeddings route (kind: embeddings, ollama_embed, ollama_embeddings); never streamed."""

    def __init__(self, gen: Generation, kind: str):
        super().__init__(gen)
        self.kind = kind

    def body(self, outs: list[CompletionOutput]) -> dict:
        req, model = self.gen.req, self.gen.model
        vecs = vectors(req, [o.embedding for o in outs])
        tokens = sum(o.prompt_tokens for o in outs)
        if self.kind == "embeddings":
            return openai_body(req, vecs, model, tokens)
        if self.kind == "ollama_embed":
            return ollama_embed_body(vecs, model, tokens, int((time.perf_counter() - self.gen.t_arrival) * 1e9))
        return ollama_embeddings_body(vecs)
