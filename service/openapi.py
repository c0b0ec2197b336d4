"""GET /openapi.json: the API described by hand (OpenAPI 3.0.3). The model name and the context length are
filled in from the loaded engine, so `model` is an enum of the one model and `max_tokens` is bounded."""
from __future__ import annotations


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _error(desc: str) -> dict:
    return {"description": desc, "content": _json(_ref("Error"))}


_GEN_ERRORS = {
    "400": _error("invalid request (a field's type or range, prompt too long for the context)"),
    "401": _error("missing or wrong API key"),
    "404": _error("unknown model"),
    "413": _error("request body too large"),
    "415": _error("body is not application/json"),
    "429": _error("overloaded: the request queue is full; retry after Retry-After seconds"),
    "503": _error("loading, draining, engine stopped or the model run failed"),
    "504": _error("the generation ran past the server's request timeout"),
}
_AUTH_ERRORS = {k: _GEN_ERRORS[k] for k in ("400", "401", "413", "415", "503")}


def build_spec(model: str, context_length: int, max_logprobs: int = 5) -> dict:
    nullable_num = {"type": "number", "nullable": True}
    sampling = {
        "model": {"type": "string", "enum": [model], "description": "the served model (GET /v1/models)"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": context_length, "nullable": True},
        "temperature": {**nullable_num, "minimum": 0, "maximum": 2},
        "top_p": {**nullable_num, "exclusiveMinimum": True, "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0, "nullable": True, "description": "0 = off (extension)"},
        "min_p": {**nullable_num, "minimum": 0, "maximum": 1},
        "repetition_penalty": {**nullable_num, "exclusiveMinimum": True, "minimum": 0},
        "frequency_penalty": {**nullable_num, "minimum": -2, "maximum": 2},
        "presence_penalty": {**nullable_num, "minimum": -2, "maximum": 2},
        "seed": {"type": "integer", "minimum": 0, "nullable": True},
        "stop": {"nullable": True, "oneOf": [{"type": "string", "minLength": 1},
                                             {"type": "array", "maxItems": 4,
                                              "items": {"type": "string", "minLength": 1}}]},
        "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "ignore_eos": {"type": "boolean"},
        "speculative": {"type": "boolean", "description": "ortllm extension: false turns prompt-lookup "
                        "speculative decoding off for this request (the tokens are the same either way)"},
        "n": {"type": "integer", "enum": [1], "description": "only 1 is supported"},
        "stream": {"type": "boolean", "nullable": True},
        "stream_options": {"type": "object", "nullable": True,
                           "properties": {"include_usage": {"type": "boolean"}}},
        "user": {"type": "string"},
    }
    usage = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
             "properties": {k: {"type": "integer", "minimum": 0}
                            for k in ("prompt_tokens", "completion_tokens", "total_tokens")}}
    finish = {"type": "string", "enum": ["stop", "length"]}
    response_common = {"id": {"type": "string"}, "created": {"type": "integer"}, "model": {"type": "string"},
                       "usage": _ref("Usage")}
    sse = {"text/event-stream": {"schema": {"type": "string",
                                            "description": "`data: {chunk}` events, then `data: [DONE]`"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "ortllm", "version": "1",
                 "description": "OpenAI-compatible completions and chat on an ortllm engine (CPU, ONNX Runtime)."},
        "paths": {
            "/v1/completions": {"post": {
                "summary": "Complete a prompt (stream=true: server-sent events)",
                "operationId": "createCompletion",
                "requestBody": {"required": True, "content": _json(_ref("CompletionRequest"))},
                "responses": {"200": {"description": "the completion",
                                      "content": {**_json(_ref("Completion")), **sse}}, **_GEN_ERRORS}}},
            "/v1/chat/completions": {"post": {
                "summary": "Answer a conversation (stream=true: server-sent events)",
                "operationId": "createChatCompletion",
                "requestBody": {"required": True, "content": _json(_ref("ChatCompletionRequest"))},
                "responses": {"200": {"description": "the answer",
                                      "content": {**_json(_ref("ChatCompletion")), **sse}}, **_GEN_ERRORS}}},
            "/v1/models": {"get": {
                "summary": "List the served models", "operationId": "listModels",
                "responses": {"200": {"description": "models", "content": _json(_ref("ModelList"))},
                              "401": _GEN_ERRORS["401"], "503": _GEN_ERRORS["503"]}}},
            "/v1/models/{model}": {"get": {
                "summary": "One model", "operationId": "getModel",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the model", "content": _json(_ref("Model"))},
                              "401": _GEN_ERRORS["401"], "404": _GEN_ERRORS["404"], "503": _GEN_ERRORS["503"]}}},
            "/tokenize": {"post": {
                "summary": "Token ids of a prompt or a conversation", "operationId": "tokenize",
                "requestBody": {"required": True, "content": _json(_ref("TokenizeRequest"))},
                "responses": {"200": {"description": "token ids", "content": _json({
                    "type": "object", "required": ["tokens", "count", "max_model_len"],
                    "properties": {"tokens": {"type": "array", "items": {"type": "integer"}},
                                   "count": {"type": "integer"}, "max_model_len": {"type": "integer"}}})},
                    **_AUTH_ERRORS}}},
            "/detokenize": {"post": {
                "summary": "Text of token ids", "operationId": "detokenize",
                "requestBody": {"required": True, "content": _json({
                    "type": "object", "required": ["tokens"],
                    "properties": {"tokens": {"type": "array", "items": {"type": "integer"}}}})},
                "responses": {"200": {"description": "text", "content": _json({
                    "type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}})},
                    **_AUTH_ERRORS}}},
            "/health": {"get": {
                "summary": "200 when serving; 503 while loading, draining, after a fatal engine error or while "
                           "recent model runs failed", "operationId": "health",
                "responses": {"200": {"description": "ok", "content": _json(_ref("Health"))},
                              "503": {"description": "not healthy", "content": _json(_ref("Health"))}}}},
            "/metrics": {"get": {
                "summary": "Prometheus metrics", "operationId": "metrics",
                "responses": {"200": {"description": "text exposition format",
                                      "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["message", "type", "param", "code"],
                "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                               "param": {"type": "string", "nullable": True},
                               "code": {"type": "string", "nullable": True}}}}},
            "Usage": usage,
            "CompletionRequest": {"type": "object", "required": ["prompt"], "properties": {
                "prompt": {"oneOf": [{"type": "string", "minLength": 1},
                                     {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}]},
                "logprobs": {"type": "integer", "minimum": 0, "maximum": max_logprobs, "nullable": True},
                "echo": {"type": "boolean", "enum": [False]},
                **sampling}},
            "ChatMessage": {"type": "object", "required": ["role", "content"], "properties": {
                "role": {"type": "string", "enum": ["system", "user", "assistant"]},
                "content": {"type": "string"}}},
            "ChatCompletionRequest": {"type": "object", "required": ["messages"], "properties": {
                "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
                "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": context_length,
                                          "nullable": True},
                "logprobs": {"type": "boolean", "nullable": True},
                "top_logprobs": {"type": "integer", "minimum": 0, "maximum": max_logprobs, "nullable": True},
                **sampling}},
            "Completion": {"type": "object", "required": ["id", "object", "choices", "usage"], "properties": {
                **response_common, "object": {"type": "string", "enum": ["text_completion"]},
                "choices": {"type": "array", "items": {"type": "object", "required": ["index", "text",
                                                                                       "finish_reason"],
                    "properties": {"index": {"type": "integer"}, "text": {"type": "string"},
                                   "finish_reason": finish,
                                   "logprobs": {"type": "object", "nullable": True}}}}}},
            "ChatCompletion": {"type": "object", "required": ["id", "object", "choices", "usage"], "properties": {
                **response_common, "object": {"type": "string", "enum": ["chat.completion"]},
                "choices": {"type": "array", "items": {"type": "object", "required": ["index", "message",
                                                                                       "finish_reason"],
                    "properties": {"index": {"type": "integer"}, "finish_reason": finish,
                                   "message": {"type": "object", "required": ["role", "content"], "properties": {
                                       "role": {"type": "string"}, "content": {"type": "string"}}},
                                   "logprobs": {"type": "object", "nullable": True}}}}}},
            "Model": {"type": "object", "required": ["id", "object", "owned_by"], "properties": {
                "id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
                "owned_by": {"type": "string"}, "max_model_len": {"type": "integer"}}},
            "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
                "object": {"type": "string"}, "data": {"type": "array", "items": _ref("Model")}}},
            "TokenizeRequest": {"type": "object", "properties": {
                "prompt": {"type": "string"}, "messages": {"type": "array", "items": _ref("ChatMessage")},
                "add_special_tokens": {"type": "boolean"}}},
            "Health": {"type": "object", "required": ["status"], "properties": {
                "status": {"type": "string", "enum": ["ok", "loading", "failed", "dead", "draining", "degraded"]}}},
        }},
        "security": [{"bearer": []}, {}],
        "x-security-note": "a key is needed only when the server was started with --api-key",
    }
