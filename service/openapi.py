"""GET /openapi.json, generated (OpenAPI 3.1): every route the app has, each request body from the declaration
its parser validates with (ortllm.protocol.bodies), `model` an enum of the models and adapters served when the
document is asked for.

A view declares what it is with @document(summary, body=..., ok=..., errors=...); build_spec walks the app's
URL map, so a route without @document fails the document (and its test) instead of going missing. The
response shapes, which no parser reads, are declared here (RESPONSES)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from flask import Flask

from ortllm.protocol.fields import Body

_ERRORS = {
    400: "invalid request: `param` names the field (its type, range or combination with another); and what no "
         "schema can say: the prompt does not fit the context (context_length_exceeded), a JSON Schema that is not "
         "one (invalid_json_schema) or that the grammar engine cannot compile, nor a regular expression "
         "(invalid_grammar), text that must be JSON (invalid_json), two tools of one name (duplicate_tool_name), "
         "tool_choice naming a function that tools does not define (unknown_tool), a blob whose sha256 is not its "
         "digest (digest_mismatch)",
    401: "missing or wrong API key (servers started with --api-key)",
    403: "refused: managing the store or adapters needs --api-key on a server not bound to loopback, a path outside "
         "--allowed-path, or a page of an origin not in --cors-origin",
    404: "unknown model (`model_not_found`)",
    409: "a model or adapter of that name is already served",
    413: "request body too large",
    415: "body is not application/json",
    429: "overloaded: the request queue is full; retry after Retry-After seconds",
    503: "loading, draining, engine stopped or the model run failed; retry after Retry-After seconds",
    504: "the generation ran past the server's request timeout",
}
GENERATE = (400, 401, 404, 413, 415, 429, 503, 504)
READ = (401, 503)
POST = (400, 401, 413, 415, 503)


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def json_ok(name: str, description: str = "the answer") -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


_SSE_EVENT = {"type": "object", "description": "one server-sent event per delta: data is a JSON object (OpenAI's "
                                             "streams end with data: [DONE]); Anthropic's and the Responses API's "
                                             "name their events",
              "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"}}}


def streamed(name: str, stream_type: str, description: str) -> dict:
    """A JSON answer, or with stream true a stream of `stream_type` (text/event-stream: events; application/x-ndjson:
    JSON lines)."""
    stream = (_SSE_EVENT if stream_type == "text/event-stream"
              else {"type": "string", "description": "one JSON object per line, per delta"})
    return {"description": description, "content": {"application/json": {"schema": _ref(name)},
                                                     stream_type: {"schema": stream}}}


@dataclass
class Operation:
    summary: str
    body: Body | None
    ok: dict
    errors: tuple[int, ...]
    status: int = 200
    params: dict[str, str | dict] = field(default_factory=dict)  # path parameter -> description, or a dict of
    #                                                              it and schema keywords (pattern, ...)
    more: dict[int, dict] = field(default_factory=dict)      # other answers than errors in the envelope
    error_schema: str = "Error"                              # the errors' envelope (Anthropic's routes: theirs)


def document(summary: str, *, body: Body | None = None, ok: dict, errors: tuple[int, ...] = (), status: int = 200,
             params: dict[str, str | dict] | None = None, more: dict[int, dict] | None = None,
             error_schema: str = "Error") -> Callable:
    """Describe a view for /openapi.json (apply it under the route decorator)."""
    def deco(view):
        view.openapi = Operation(summary, body, ok, tuple(errors), status, params or {}, more or {}, error_schema)
        return view
    return deco


def build_spec(app: Flask, models: list[str], bounds: dict[str, int] | None = None, key: bool = False) -> dict:
    """The document for this app; models: the names `model` may take (base models and adapters); bounds: the
    served model's limits (fields.BOUND: token_id, embedding_width) where one model is served; key: the server
    has an API key (every operation but the public ones requires it)."""
    from .auth import PUBLIC
    paths: dict[str, dict] = {}
    schemas = dict(RESPONSES)
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if rule.endpoint == "static":
            continue
        op = getattr(app.view_functions[rule.endpoint], "openapi", None)
        if op is None:
            raise RuntimeError(f"route {rule.rule} ({rule.endpoint}) has no @document: describe it "
                               "(service/openapi.py) so /openapi.json lists it")
        path = re.sub(r"<(?:[a-z]+:)?([A-Za-z_]+)>", r"{\1}", rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            item = {"summary": op.summary, "operationId": f"{rule.endpoint.replace('.', '_')}_{method.lower()}",
                    "responses": {str(op.status): op.ok, **{str(s): _error(s, op.error_schema) for s in op.errors},
                                  **{str(s): r for s, r in op.more.items()}}}
            if op.body is not None:
                schemas[op.body.name] = op.body.schema({"model": {"enum": models}}, bounds)
                item["requestBody"] = {"required": True, "content": {"application/json": {"schema":
                                                                                          _ref(op.body.name)}}}
            if rule.arguments:
                item["parameters"] = [
                    {"name": a, "in": "path", "required": True, "description": _param_text(op.params.get(a, "")),
                     "schema": {"type": "string", **({"enum": models} if a == "model" else {}),
                                **_param_schema(op.params.get(a, ""))}}
                    for a in sorted(rule.arguments)]
            if rule.endpoint in PUBLIC:
                item["security"] = []            # never a key (service/auth.py)
            paths.setdefault(path, {})[method.lower()] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "ortllm", "version": "1",
                 "description": "OpenAI- and Ollama-compatible generation on an ortllm engine (CPU, ONNX Runtime)."},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                           "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
                       "schemas": schemas},
        # this server's: with --api-key every operation but /health, /metrics, /openapi.json and / needs the key
        "security": [{"bearer": []}, {"apiKey": []}] if key else [{}],
    }


def _param_text(p) -> str:
    return p if isinstance(p, str) else p.get("description", "")


def _param_schema(p) -> dict:
    """A path parameter declared as {description, pattern, ...}: its schema keywords."""
    return {} if isinstance(p, str) else {k: v for k, v in p.items() if k != "description"}


def _error(status: int, schema: str = "Error") -> dict:
    return {"description": _ERRORS[status], "content": {"application/json": {"schema": _ref(schema)}}}


# ---------------------------------------------------------------- response shapes

_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}


def _obj(required: list[str], **props) -> dict:
    return {"type": "object", "required": required, "properties": props}


_USAGE = _obj(["prompt_tokens", "completion_tokens", "total_tokens"], prompt_tokens=_INT, completion_tokens=_INT,
              total_tokens=_INT, prompt_tokens_details={"type": "object", "properties": {"cached_tokens": _INT}})
_FINISH = {"enum": ["stop", "length", "tool_calls"]}
# what one served model accepts (service/resources.py engine_limits; `ortllm serve --ctx-size --parallel ...`)
_LIMITS = _obj(["max_model_len", "max_num_seqs"], max_model_len=_INT, max_num_seqs=_INT, max_queued=_INT,
               max_batch_tokens=_INT, kv_cache_tokens=_INT, kv_cache_bytes=_INT)
_LOGPROBS = {"type": ["object", "null"]}
_TOOL_CALL = _obj(["id", "type", "function"], id=_STR, type={"const": "function"},
                  function=_obj(["name", "arguments"], name=_STR, arguments={**_STR, "description": "JSON text"}))
_COMMON = {"id": _STR, "created": {"type": "integer"}, "model": _STR, "system_fingerprint": {"type": "null"},
           "usage": _ref("Usage")}
_OLLAMA_MODEL = _obj(["name", "model"], name=_STR, model=_STR, modified_at=_STR, size=_INT, digest=_STR,
                     details={"type": "object"})
_OLLAMA_ANSWER = {"model": _STR, "created_at": _STR, "done": {"type": "boolean"}, "done_reason": _STR,
                  "total_duration": _INT, "prompt_eval_count": _INT, "eval_count": _INT,
                  "prompt_eval_duration": _INT, "eval_duration": _INT}

# /v1/responses (OpenAI's Responses API) and /v1/messages (Anthropic's Messages API)
_NULLABLE_OBJ = {"type": ["object", "null"]}
_RESPONSES_API = {"Response": _obj(
    ["id", "object", "created_at", "status", "model", "output"], id=_STR, object={"const": "response"},
    created_at={"type": "integer"}, status={"enum": ["in_progress", "completed", "incomplete"]}, model=_STR,
    incomplete_details=_NULLABLE_OBJ, usage=_NULLABLE_OBJ, store={"const": False},
    output={"type": "array", "items": {"anyOf": [
        _obj(["id", "type", "role", "content", "status"], id=_STR, type={"const": "message"},
             role={"const": "assistant"}, status=_STR,
             content={"type": "array", "items": _obj(["type", "text"], type={"const": "output_text"}, text=_STR)}),
        _obj(["type", "call_id", "name", "arguments"], id=_STR, type={"const": "function_call"}, call_id=_STR,
             name=_STR, arguments={**_STR, "description": "JSON text"}, status=_STR)]}})}
_MESSAGES_API = {
    "AnthropicMessage": _obj(
        ["id", "type", "role", "model", "content", "stop_reason", "usage"], id=_STR, type={"const": "message"},
        role={"const": "assistant"}, model=_STR,
        stop_reason={"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
        stop_sequence={"type": ["string", "null"]},
        usage=_obj(["input_tokens", "output_tokens"], input_tokens=_INT, output_tokens=_INT,
                   cache_read_input_tokens=_INT, cache_creation_input_tokens=_INT),
        content={"type": "array", "items": {"anyOf": [
            _obj(["type", "text"], type={"const": "text"}, text=_STR),
            _obj(["type", "id", "name", "input"], type={"const": "tool_use"}, id=_STR, name=_STR,
                 input={"type": "object"})]}}),
    "AnthropicTokenCount": _obj(["input_tokens"], input_tokens=_INT),
    "AnthropicError": _obj(["type", "error"], type={"const": "error"}, request_id={"type": ["string", "null"]},
                           error=_obj(["type", "message"], type=_STR, message=_STR)),
}
# /v1/embeddings, /api/embed, /api/embeddings
_VECTOR = {"type": "array", "items": {"type": "number"}}
_EMBEDDINGS_API = {
    "EmbeddingList": _obj(
        ["object", "data", "model", "usage"], object={"const": "list"}, model=_STR,
        data={"type": "array", "items": _obj(
            ["object", "index", "embedding"], object={"const": "embedding"}, index=_INT,
            embedding={"anyOf": [_VECTOR, {**_STR, "description": "base64 of little-endian float32"}]})},
        usage=_obj(["prompt_tokens", "total_tokens"], prompt_tokens=_INT, total_tokens=_INT)),
    "OllamaEmbed": _obj(["model", "embeddings"], model=_STR, embeddings={"type": "array", "items": _VECTOR},
                        total_duration=_INT, load_duration=_INT, prompt_eval_count=_INT),
    "OllamaEmbedding": _obj(["embedding"], embedding=_VECTOR),
}

RESPONSES = {
    "Error": _obj(["error"], error=_obj(["message", "type", "param", "code"], message=_STR, type=_STR,
                                        param={"type": ["string", "null"]}, code={"type": ["string", "null"]})),
    "Usage": _USAGE,
    "Completion": _obj(["id", "object", "choices", "usage"], **_COMMON, object={"const": "text_completion"},
                       choices={"type": "array", "items": _obj(["index", "text", "finish_reason"], index=_INT,
                                                               text=_STR, finish_reason=_FINISH, logprobs=_LOGPROBS)}),
    "ChatCompletion": _obj(["id", "object", "choices", "usage"], **_COMMON, object={"const": "chat.completion"},
                           choices={"type": "array", "items": _obj(
                               ["index", "message", "finish_reason"], index=_INT, finish_reason=_FINISH,
                               logprobs=_LOGPROBS,
                               message=_obj(["role", "content"], role={"const": "assistant"},
                                            content={"type": ["string", "null"]},
                                            tool_calls={"type": "array", "items": _TOOL_CALL}))}),
    "Model": _obj(["id", "object", "owned_by"], id=_STR, object={"const": "model"}, created={"type": "integer"},
                  owned_by=_STR, root=_STR, parent=_STR, max_model_len=_INT, loaded={"type": "boolean"},
                  limits=_LIMITS),
    "ModelList": _obj(["object", "data"], object={"const": "list"}, data={"type": "array", "items": _ref("Model")}),
    "ModelDeleted": _obj(["id", "object", "deleted"], id=_STR, object={"const": "model"}, deleted={"const": True}),
    "Tokens": _obj(["tokens", "count", "max_model_len"], tokens={"type": "array", "items": {"type": "integer"}},
                   count=_INT, max_model_len=_INT),
    "Text": _obj(["prompt"], prompt=_STR),
    "Health": _obj(["status"], status={"enum": ["ok", "loading", "failed", "dead", "draining", "degraded"]},
                   limits={"type": "object", "description": "the served model's Limits (several models: by name)"}),
    "OllamaGenerate": _obj(["model", "created_at", "response", "done"], **_OLLAMA_ANSWER, response=_STR),
    "OllamaChat": _obj(["model", "created_at", "message", "done"], **_OLLAMA_ANSWER, message=_obj(
        ["role", "content"], role={"const": "assistant"}, content=_STR,
        tool_calls={"type": "array", "items": _obj(["function"], function=_obj(
            ["name", "arguments"], name=_STR, arguments={"type": "object"}))})),
    "OllamaTags": _obj(["models"], models={"type": "array", "items": _OLLAMA_MODEL}),
    "OllamaPs": _obj(["models"], models={"type": "array", "items": {**_OLLAMA_MODEL, "properties": {
        **_OLLAMA_MODEL["properties"], "expires_at": _STR, "size_vram": _INT, "context_length": _INT}}}),
    "OllamaShow": _obj(["details", "model_info"], modelfile=_STR, parameters=_STR, template=_STR,
                       details={"type": "object"}, modified_at=_STR, model_info={"type": "object"},
                       capabilities={"type": "array", "items": _STR}),
    "OllamaVersion": _obj(["version"], version=_STR),
    "OpenAPI": _obj(["openapi", "paths"], openapi=_STR, paths={"type": "object"}),
    **_RESPONSES_API, **_MESSAGES_API, **_EMBEDDINGS_API,
}
