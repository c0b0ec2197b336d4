"""The OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions (plain or SSE), /v1/models,
and /v1/adapters (load / unload LoRA adapters at run time; who may: auth.MANAGE).

One request = one engine handle per choice (n per prompt), submitted, waited for or streamed, timed out and
cancelled by lifecycle.py; the answer is rendered by protocol.generation.OpenAIRenderer."""
from __future__ import annotations

import logging

from flask import Blueprint, jsonify, request

from ortllm.runtime.engine import Engine

from ortllm.protocol import openai as protocol
from ortllm.protocol.bodies import ADAPTER, CHAT, COMPLETION
from ortllm.protocol.generation import OpenAIRenderer, resolve_adapter

from .body import read_json_object
from .errors import APIError, bad_request, model_not_found
from .lifecycle import answer
from .openapi import GENERATE, READ, document, json_ok, streamed
from .resources import EngineResource, current_resources, engine_limits
from .server_paths import server_path

log = logging.getLogger("ortllm.service")
bp = Blueprint("openai", __name__, url_prefix="/v1")


@bp.get("/models")
@document("List the served models and their adapters", ok=json_ok("ModelList"), errors=READ)
def list_models():
    return jsonify({"object": "list", "data": model_cards()})


def model_cards() -> list[dict]:
    """Every name `model` may take, as model cards: each served model, then its adapters."""
    pool = current_resources()
    if pool.lazy:       # several models: each with its adapters (as ADAPTER and MODEL:ADAPTER), loaded or not
        return [card for res in pool.models for card in _pool_cards(res)]
    res = pool.default
    engine = res.require_engine()
    return [_model_card(res, engine, a) for a in [None, *engine.adapters.names()]]


@bp.get("/models/<path:model>")
@document("One model or adapter", ok=json_ok("Model"), errors=(401, 404, 503), params={"model": "its id"})
def get_model(model: str):
    res, model = current_resources().route(model)
    if res.pool is not None:
        return jsonify(next(c for c in _pool_cards(res) if c["id"] in (model, f"{res.model_name}:{model}")))
    engine = res.require_engine()
    return jsonify(_model_card(res, engine, resolve_adapter(engine, res.model_name, model)))


def _model_card(res: EngineResource, engine: Engine, adapter: str | None) -> dict:
    limits = engine_limits(engine)
    card = {"id": adapter or res.model_name, "object": "model", "created": res.created, "owned_by": "ortllm",
            "root": res.model_name, "max_model_len": limits["max_model_len"], "limits": limits}
    if adapter is not None:
        card["parent"] = res.model_name
    return card


def _pool_cards(res: EngineResource) -> list[dict]:
    """A served model of a multi-model server, and its adapters, without loading it ("loaded" says if it is)."""
    base = {"object": "model", "created": res.created, "owned_by": "ortllm", "root": res.model_name,
            "loaded": res.engine is not None}
    if res.engine is not None:
        base["limits"] = engine_limits(res.engine)
    cards = [{**base, "id": res.model_name}]
    for a in res.adapter_names():
        cards += [{**base, "id": f"{res.model_name}:{a}", "parent": res.model_name},
                  {**base, "id": a, "parent": res.model_name}]
    return cards


@bp.post("/adapters")
@document("Load a LoRA adapter (PEFT directory on the server) and serve it as a model", body=ADAPTER,
          ok=json_ok("Model", "the adapter's model card"), status=201, errors=(400, 401, 403, 409, 413, 415, 503))
def load_adapter():
    """{"name": NAME, "path": PEFT_DIR on the server}: convert into the artifact and serve it as model NAME."""
    from ortllm.runtime.adapter_files import add_adapter
    from ortllm.runtime.errors import AdapterFileError

    res = current_resources()
    engine = res.require_engine()
    v = ADAPTER.read(read_json_object(request))
    name, path = v["name"], v["path"]
    if name == res.model_name or name in engine.adapters.names():
        raise APIError(409, f"a model named {name!r} is already served; DELETE /v1/adapters/{name} first",
                       param="name", code="adapter_exists")
    try:
        entry = add_adapter(engine.artifact.path, server_path(path, "path"), name, force=True)
    except AdapterFileError as e:
        raise bad_request(str(e), param="path") from None
    engine.add_adapter(name, entry)
    log.info("adapter loaded", extra={"adapter": name, "rank": entry["rank"]})
    return jsonify(_model_card(res, engine, name)), 201


@bp.delete("/adapters/<name>")
@document("Unload an adapter: refused for new requests at once, running ones finish", ok=json_ok("ModelDeleted"),
          errors=(401, 403, 404, 503), params={"name": "the adapter"})
def unload_adapter(name: str):
    """Refused for new requests at once; requests already running finish; the file leaves the artifact."""
    from ortllm.runtime.adapter_files import remove_adapter

    res = current_resources()
    engine = res.require_engine()
    if name not in engine.adapters.names():
        raise model_not_found(name, res.model_name, engine.adapters.names())
    engine.retire_adapter(name)
    remove_adapter(engine.artifact.path, name)
    log.info("adapter unloaded", extra={"adapter": name})
    return jsonify({"id": name, "object": "model", "deleted": True})


@bp.post("/completions")
@document("Complete a prompt (stream: server-sent events)", body=COMPLETION, errors=GENERATE,
          ok=streamed("Completion", "text/event-stream", "the completion"))
def completions():
    return _generate("completions", protocol.parse_completion(read_json_object(request)))


@bp.post("/chat/completions")
@document("Answer a conversation, call tools (stream: server-sent events)", body=CHAT, errors=GENERATE,
          ok=streamed("ChatCompletion", "text/event-stream", "the answer"))
def chat_completions():
    return _generate("chat", protocol.parse_chat(read_json_object(request)))


# ---------------------------------------------------------------- one generation

def _generate(kind: str, req: protocol.GenerationRequest):
    return answer(kind, req, lambda gen: OpenAIRenderer(gen, kind))
