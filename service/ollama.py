"""Ollama's REST API over the same request path as the OpenAI one: /api/generate, /api/chat (NDJSON streaming,
the default), /api/tags, /api/show, /api/ps, /api/version. Adapters are listed as models. A model POST /api/create
made (service/ollama_models.py) has its system message and parameters applied here unless the request sends its
own.

An Ollama body (declared in protocol/bodies.py: its options take the OpenAI fields' schemas) is translated into
the OpenAI request it means by protocol/ollama.py (generate_request, chat_request: Flask-free) and goes through
lifecycle.answer with the model routed once: one validation and one generation path; the answer (NDJSON lines,
streamed or not) is rendered by protocol/ollama.py too.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version

from flask import Blueprint, jsonify, request

from ortllm.protocol.bodies import OLLAMA_CHAT, OLLAMA_GENERATE, OLLAMA_SHOW
from ortllm.protocol.generation import resolve_adapter
from ortllm.protocol.ollama import OllamaRenderer, chat_request, generate_request
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.errors import OrtllmError

from .body import read_json_object
from .errors import model_not_found
from .lifecycle import answer
from .openapi import GENERATE, POST, READ, document, json_ok, streamed
from .resources import current_resources

bp = Blueprint("ollama", __name__, url_prefix="/api")

@bp.post("/generate")
@document("Ollama: complete a prompt (stream, the default: NDJSON)", body=OLLAMA_GENERATE, errors=GENERATE,
          ok=streamed("OllamaGenerate", "application/x-ndjson", "the answer"))
def generate():
    v = OLLAMA_GENERATE.read(read_json_object(request))
    route = current_resources().route(v["model"])        # once: its created model's defaults, then the answer
    kind, req = generate_request(v, route[0].modelfile)
    return answer(kind, req, lambda gen: OllamaRenderer(gen, "response"), route)


@bp.post("/chat")
@document("Ollama: answer a conversation (stream, the default: NDJSON)", body=OLLAMA_CHAT, errors=GENERATE,
          ok=streamed("OllamaChat", "application/x-ndjson", "the answer"))
def chat():
    v = OLLAMA_CHAT.read(read_json_object(request))
    route = current_resources().route(v["model"])
    return answer("chat", chat_request(v, route[0].modelfile), lambda gen: OllamaRenderer(gen, "message"), route)


# ---------------------------------------------------------------- models

def _ortllm_version() -> str:
    try:
        return version("ortllm")
    except PackageNotFoundError:
        return "0"


def _models(loaded_only: bool = False) -> list[dict]:
    """Every served model (loaded or not: from its manifest), then its adapters, as Ollama lists models."""
    out = []
    for res in current_resources().models:
        if res.engine is None and (loaded_only or res.path is None):
            continue
        try:
            manifest = res.engine.artifact.manifest if res.engine is not None else read_manifest(res.path)
        except OrtllmError:
            continue
        model = manifest.model
        digest, size = manifest.source_sha256 or "", manifest.size_bytes
        modified = datetime.fromtimestamp(res.created, timezone.utc).isoformat().replace("+00:00", "Z")
        details = {"format": "onnx", "family": model.arch, "families": [model.arch],
                   "parameter_size": _parameter_size(model), "quantization_level": str(manifest.quant),
                   "parent_model": res.modelfile.get("from", "")}
        base = {"modified_at": modified, "size": size, "digest": digest, "context_length": manifest.context_length,
                "manifest": manifest, "resource": res}
        out.append({"name": res.model_name, "model": res.model_name, **base, "details": details})
        for a in sorted(manifest.adapters):
            out.append({"name": a, "model": a, **base, "details": {**details, "parent_model": res.model_name}})
    return out


def _parameter_size(m) -> str:
    """The parameter count from the architecture (embeddings once when tied), as Ollama writes it: 135M, 1.1B."""
    attn = m.hidden_size * m.head_dim * (2 * m.num_heads + 2 * m.num_kv_heads)
    n = m.num_layers * (attn + 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size)
    n += m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2) + m.hidden_size
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _listed(m: dict) -> dict:
    return {k: v for k, v in m.items() if k not in ("manifest", "resource", "context_length")}


@bp.get("/tags")
@document("Ollama: the served models, adapters included", ok=json_ok("OllamaTags"), errors=READ)
def tags():
    return jsonify({"models": [_listed(m) for m in _models()]})


@bp.get("/ps")
@document("Ollama: the loaded models", ok=json_ok("OllamaPs"), errors=READ)
def ps():
    current_resources().require_engine()
    return jsonify({"models": [{**_listed(m), "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0,
                                "context_length": m["context_length"]} for m in _models(loaded_only=True)]})


@bp.post("/show")
@document("Ollama: one model's details", body=OLLAMA_SHOW, ok=json_ok("OllamaShow"), errors=(*POST, 404))
def show():
    body = read_json_object(request)
    if body.get("model") is None and body.get("name") is not None:      # older clients' name for it
        body = {**body, "model": body["name"]}
    name = OLLAMA_SHOW.read(body)["model"]
    pool = current_resources()
    res, sub = pool.route(name)
    if res.engine is None and res.pool is not None:      # not loaded: checked against its manifest, not loaded
        if sub not in (res.model_name, *res.adapter_names()):
            raise model_not_found(name, res.model_name, res.adapter_names())
    else:
        resolve_adapter(res.require_engine(), res.model_name, sub)
    own = name == res.model_name or (pool.lazy and name in pool.by_name)     # the model itself, not an adapter
    m = next(m for m in _models() if m["resource"] is res and m["name"] == (res.model_name if own else name))
    model, mf = m["manifest"].model, res.modelfile
    engine = res.engine
    template = mf.get("template") or (engine.tokenizer.chat_template if engine is not None else None) or ""
    parameters = "\n".join(f"{k} {json.dumps(x) if isinstance(x, str) else x}"
                           for k, v in mf.get("parameters", {}).items() for x in (v if isinstance(v, list) else [v]))
    return jsonify({"modelfile": _modelfile_text(res.model_name, mf), "parameters": parameters,
                    "template": template, "system": mf.get("system") or "", "license": mf.get("license") or "",
                    "details": m["details"], "modified_at": m["modified_at"],
                    "model_info": {"general.architecture": model.arch, "general.parameter_count":
                                   _parameter_count(m["details"]["parameter_size"]),
                                   f"{model.arch}.context_length": m["context_length"],
                                   f"{model.arch}.embedding_length": model.hidden_size,
                                   f"{model.arch}.block_count": model.num_layers,
                                   f"{model.arch}.attention.head_count": model.num_heads,
                                   f"{model.arch}.attention.head_count_kv": model.num_kv_heads,
                                   "general.quantization": str(m["manifest"].quant),
                                   "ortllm.adapters": sorted(m["manifest"].adapters)},
                    # embeddings are the engine graph's hidden_states output (runtime/pooling.py)
                    "capabilities": ["completion", "tools"] + (["embedding"] if m["manifest"].graph == "engine"
                                                               else [])})


def _parameter_count(size: str) -> int:
    return int(float(size[:-1]) * (1e9 if size.endswith("B") else 1e6))


def _modelfile_text(name: str, mf: dict) -> str:
    """The model as an Ollama Modelfile (what `ollama show --modelfile` prints)."""
    lines = [f"# Modelfile of {name}", f"FROM {mf.get('from') or name}"]
    if mf.get("adapter"):
        lines.append(f"ADAPTER {mf['adapter']}")
    if mf.get("system") is not None:
        lines.append(f'SYSTEM """{mf["system"]}"""')
    if mf.get("template"):
        lines.append(f'TEMPLATE """{mf["template"]}"""')
    for k, v in mf.get("parameters", {}).items():
        for x in v if isinstance(v, list) else [v]:
            lines.append(f"PARAMETER {k} {json.dumps(x) if isinstance(x, str) else x}")
    return "\n".join(lines) + "\n"


@bp.get("/version")
@document("Ollama: the server's version", ok=json_ok("OllamaVersion"), errors=READ)
def api_version():
    return jsonify({"version": _ortllm_version()})
