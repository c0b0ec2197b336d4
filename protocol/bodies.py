"""The request bodies of every route, declared once (fields.py): the parsers validate with these and
/openapi.json publishes them.

    COMPLETION, CHAT           /v1/completions, /v1/chat/completions (openai.py: parse_completion, parse_chat)
    OLLAMA_GENERATE, _CHAT     /api/generate, /api/chat (service/ollama.py: translated into CHAT / COMPLETION)
    OLLAMA_SHOW                /api/show
    OLLAMA_PULL, _DELETE,      /api/pull, /api/delete, /api/copy, /api/create (service/ollama_models.py: the
    _COPY, _CREATE             local store)
    TOKENIZE, DETOKENIZE       /tokenize, /detokenize
    ADAPTER                    POST /v1/adapters

Ollama's `options` take the OpenAI sampling fields' schemas under Ollama's names (OLLAMA_OPTIONS), so a value
is checked by the same schema whichever API it came through.
"""
from __future__ import annotations

import itertools

from ortllm.runtime.sampling_params import (LOGIT_BIAS_RANGE, MAX_LOGPROBS, MAX_MIX, PENALTY_RANGE,
                                            REPETITION_PENALTY_RANGE)

from ortllm.runtime.store import _NAME as _STORE_NAME_RE, _TAG as _STORE_TAG_RE

from .fields import (BOUND, DECIMAL_BOUND, Body, Field, Rule, both, boolean, equals, integer, number, sent, sent_as,
                     string)

MAX_STOP = 4            # OpenAI's limit on stop strings
MAX_N = 8               # completions per prompt (n): one prefill, n continuations
MAX_PROMPTS = 32        # prompts in one /v1/completions request
MAX_PROMPTS_MANY_N = 8  # ... with n >= 3 (so prompts x n <= 64 completions in one request)
MAX_TOP_LOGPROBS = 5    # OpenAI's limit on completions' `logprobs` / chat's `top_logprobs`
MAX_TOOLS = 128
MAX_LOGIT_BIAS = 300
NAME_PATTERN = "^[A-Za-z0-9_-]{1,64}$"   # function and json_schema names (OpenAI's rule)
assert MAX_TOP_LOGPROBS <= MAX_LOGPROBS

_JSON_SCHEMA = {"type": "object", "description": "a JSON Schema (checked against the JSON Schema meta-schema)"}
# a token id: below 2**31 always (an int32 for the engine); the served model's last one where the document knows it
MAX_TOKEN_ID = 2**31 - 1
TOKEN_ID = {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID, BOUND: "token_id"}
_TOKEN_IDS = {"type": "array", "minItems": 1, "items": TOKEN_ID}
# NAME[:TAG] as runtime/store.py's ModelRef.parse reads it
STORE_NAME_PATTERN = (f"^{_STORE_NAME_RE.pattern.strip('^$')}(:({_STORE_TAG_RE.pattern.strip('^$')})?)?$")

# ---------------------------------------------------------------- sampling (completions and chat)

MODEL = string("model", description="the served model or adapter (GET /v1/models); default: the first served model")
TEMPERATURE = number("temperature", 1.0, 0, 2, description="0: greedy")
TOP_P = number("top_p", 1.0, 0, 1, lo_open=True)
TOP_K = integer("top_k", 0, 0, 2**31 - 1, description="0: off (extension)")
MIN_P = number("min_p", 0.0, 0, 1, description="extension")
REPETITION_PENALTY = number("repetition_penalty", 1.0, *REPETITION_PENALTY_RANGE, description="extension; 1: off")
FREQUENCY_PENALTY = number("frequency_penalty", 0.0, *PENALTY_RANGE)
PRESENCE_PENALTY = number("presence_penalty", 0.0, *PENALTY_RANGE)
SEED = integer("seed", None, 0, 2**63 - 1, description="the same seed gives the same text whatever the batch")
STOP = Field("stop", {"anyOf": [{"type": "string", "minLength": 1},
                                {"type": "array", "maxItems": MAX_STOP, "items": {"type": "string", "minLength": 1}}],
                      "description": f"a non-empty string or a list of at most {MAX_STOP} non-empty strings"},
             description="stop strings, left out of the text")
MAX_TOKENS = integer("max_tokens", None, 1, description="default: the server's --max-tokens, else the room the "
                     "context leaves; capped to both")
ADAPTER_MIX = Field("adapters", {"type": "object", "minProperties": 1, "maxProperties": MAX_MIX,
                                 "propertyNames": {"minLength": 1}, "additionalProperties": {"type": "number"}},
                    description=f"extension: a weighted mix of up to {MAX_MIX} of the model's adapters for this "
                                "request, adapter name -> weight (any finite number); the delta is the sum of "
                                "weight * scale * B A over them (PEFT's add_weighted_adapter, combination_type cat). "
                                "`model` then names the base model; DoRA adapters are not mixed",
                    hint=f"an object of 1 to {MAX_MIX} \"adapter name\": weight")


def _sampling(max_tokens: Field) -> list[Field]:
    return [
        MODEL, max_tokens, TEMPERATURE, TOP_P, TOP_K, MIN_P, REPETITION_PENALTY, FREQUENCY_PENALTY, PRESENCE_PENALTY,
        SEED, STOP,
        Field("stop_token_ids", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}},
              description="extension: token ids that end the generation"),
        boolean("ignore_eos", False, "extension: go on past the end-of-sequence token"),
        integer("priority", 0, -1000, 1000, "extension: higher is scheduled first"),
        Field("logit_bias", {"type": "object", "maxProperties": MAX_LOGIT_BIAS,
                             "propertyNames": {"pattern": "^[0-9]+$", DECIMAL_BOUND: "token_id"},
                             "additionalProperties": {"type": "number", "minimum": LOGIT_BIAS_RANGE[0],
                                                      "maximum": LOGIT_BIAS_RANGE[1]}},
              description="token id (as a string) -> bias added to its logit before sampling",
              hint=f"an object of at most {MAX_LOGIT_BIAS} \"token id\": bias in [{LOGIT_BIAS_RANGE[0]:g}, "
                   f"{LOGIT_BIAS_RANGE[1]:g}]"),
        boolean("speculative", True, "extension: false turns drafts off for this request (prompt lookup, a "
                                     "grammar's forced tokens); the tokens are the same either way"),
        boolean("stream", False, "server-sent events: data: {chunk} ... data: [DONE]"),
        Field("stream_options", {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
              description="include_usage: one more chunk with the usage and no choices"),
        string("user", description="accepted, not used"),
        integer("n", 1, 1, MAX_N, f"completions per prompt (one prefill); at most {MAX_N}"),
        Field("guided_json", {"anyOf": [{"type": "object"}, {"type": "string"}],
                              "description": "a JSON Schema object or its JSON text"},
              description="vLLM's extension: the output follows this JSON Schema"),
        string("guided_regex", minLength=1, description="vLLM's extension: the output matches this regular expression"),
        Field("guided_choice", {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
              description="vLLM's extension: the output is one of these strings"),
        string("guided_grammar", minLength=1, description="vLLM's extension: the output follows this Lark grammar "
                                                          "(llguidance's dialect: special tokens as <|name|>)"),
        ADAPTER_MIX,
    ]


_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")

# ---------------------------------------------------------------- /v1/completions

PROMPT = Field("prompt", {"anyOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS,
                                    {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS,
                                     "items": {"anyOf": [{"type": "string", "minLength": 1}, _TOKEN_IDS]}}]},
               required=True, description=f"text, token ids, or a list of at most {MAX_PROMPTS} of either",
               hint=f"a non-empty string, a non-empty list of token ids, or a list of at most {MAX_PROMPTS} of those")

COMPLETION_MAX_TOKENS = 16     # OpenAI's default for /v1/completions, when the server sets none (--max-tokens)
COMPLETION = Body("CompletionRequest", [
    PROMPT, *_sampling(integer("max_tokens", None, 0, description=f"default {COMPLETION_MAX_TOKENS}, or the "
                               "server's --max-tokens; capped to the room the context leaves and to --max-tokens; 0 "
                               "only with echo (score the prompt)")),
    integer("logprobs", None, 0, MAX_TOP_LOGPROBS, "the chosen token's logprob and the top n"),
    boolean("echo", False, "the prompt before the completion (with logprobs: the prompt's too); not with stream"),
    Field("suffix", {"type": "string", "maxLength": 0}, description="not supported (null or empty)",
          hint="null or empty (suffix is not supported)"),
    Field("best_of", {"type": "integer", "minimum": 1, "maximum": 1}, description="1 only (ranking several "
          "candidates is not supported)", hint="1 (ranking several candidates is not supported)"),
], rules=[
    Rule(both(equals("max_tokens", 0), {"not": equals("echo", True)}),
         "max_tokens must be >= 1 (0 only with echo: true, to score the prompt); got 0", "max_tokens"),
    Rule(both(equals("echo", True), equals("stream", True)),
         "echo cannot be combined with stream; send stream: false", "echo"),
    Rule(both(sent_as("n", minimum=3), sent_as("prompt", type="array", minItems=MAX_PROMPTS_MANY_N + 1,
                                                contains={"type": ["string", "array"]})),
         f"with n >= 3, at most {MAX_PROMPTS_MANY_N} prompts (at most {MAX_N * MAX_PROMPTS_MANY_N} completions in one "
         "request); send fewer prompts or a smaller n", "n"),
    Rule({"anyOf": [sent(a, b) for a, b in itertools.combinations(_GUIDED, 2)]},
         "send one of " + ", ".join(_GUIDED), lambda given: [g for g in _GUIDED if g in given][1]),
])

# ---------------------------------------------------------------- /v1/chat/completions

_TEXT_PARTS = {"type": "array", "items": {"type": "object", "properties": {"type": {"const": "text"},
                                                                         "text": {"type": "string"}},
                                          "required": ["type", "text"]}}
_CALLS = {"type": "array", "items": {
    "type": "object", "required": ["function"],
    "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                   "function": {"type": "object", "required": ["name"], "properties": {
                       "name": {"type": "string"},
                       "arguments": {"anyOf": [{"type": "string"}, {"type": "object"}],
                                     "description": "JSON text (OpenAI) or an object (Ollama)"}}}}}}
_MESSAGE = {"role": {"enum": ["system", "user", "assistant", "developer", "tool"]},
            "content": {"anyOf": [{"type": "string"}, {**_TEXT_PARTS, "minItems": 1}, {"type": "null"}],
                        "description": "a string or a list of {type: text, text} parts"},
            "tool_calls": _CALLS, "tool_call_id": {"type": "string"}, "name": {"type": "string"}}


def _role(*roles: str) -> dict:
    return {"required": ["role"], "properties": {"role": {"enum": list(roles)}}}


_CONTENT = {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}
# OpenAI's message types: system, developer, user and tool messages have content; a tool message answers a call
# (tool_call_id); an assistant message has content or tool_calls
MESSAGES = Field("messages", {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role"], "properties": _MESSAGE,
    "allOf": [{"if": _role("system", "developer", "user", "tool"), "then": _CONTENT},
              {"if": _role("tool"), "then": {"required": ["tool_call_id"]}},
              {"if": _role("assistant"), "then": {"anyOf": [
                  _CONTENT, {"required": ["tool_calls"], "properties": {"tool_calls": {"minItems": 1}}}],
                  "description": "an assistant message with content or tool_calls"}}]}},
                 required=True, description="the conversation, rendered with the model's chat template "
                                            "(developer is treated as system)")
# Ollama's messages: content may be left out (""), a tool message names no call
OLLAMA_MESSAGES = Field("messages", {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role"], "properties": {**_MESSAGE, "tool_name": {"type": "string"}}}},
                        required=True, description="the conversation, rendered with the model's chat template")
TOOLS = Field("tools", {"type": "array", "maxItems": MAX_TOOLS, "items": {
    "type": "object", "required": ["function"],
    "properties": {"type": {"const": "function"},
                   "function": {"type": "object", "required": ["name"], "properties": {
                       "name": {"type": "string", "pattern": NAME_PATTERN},
                       "description": {"type": "string"},
                       "parameters": {**_JSON_SCHEMA, "required": ["type"],
                                      "properties": {"type": {"const": "object"}}},
                       "strict": {"type": ["boolean", "null"]}}}}}},
              description="functions the model may call: their parameters are a JSON Schema of type object")
TOOL_CHOICE = Field("tool_choice", {"anyOf": [
    {"enum": ["none", "auto", "required"]},
    {"type": "object", "required": ["type", "function"],
     "properties": {"type": {"const": "function"},
                    "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}],
    "description": '"none", "auto", "required" or {type: function, function: {name}}'},
    description="auto (default with tools): the model may call; required or a named function: it must")
RESPONSE_FORMAT = Field("response_format", {
    "type": "object", "required": ["type"],
    "properties": {"type": {"enum": ["text", "json_object", "json_schema"]},
                   "json_schema": {"type": "object", "required": ["schema"], "properties": {
                       "name": {"type": "string", "pattern": NAME_PATTERN}, "description": {"type": "string"},
                       "schema": _JSON_SCHEMA, "strict": {"type": ["boolean", "null"]}}}},
    "if": {"properties": {"type": {"const": "json_schema"}}}, "then": {"required": ["json_schema"]}},
    description="json_object: any JSON object; json_schema: one that validates against json_schema.schema")

_GUIDING_FORMAT = sent_as("response_format", properties={"type": {"enum": ["json_object", "json_schema"]}})
_STRUCTURED = {"anyOf": [_GUIDING_FORMAT, *[sent(g) for g in _GUIDED]]}
_FORCED_CALL = {"allOf": [sent("tool_choice"), {"properties": {"tool_choice": {"not": {"enum": ["none", "auto"]}}}}]}
CHAT = Body("ChatCompletionRequest", [
    MESSAGES, *_sampling(MAX_TOKENS),
    integer("max_completion_tokens", None, 1, description="the same as max_tokens (OpenAI's newer name)"),
    boolean("logprobs", False, "each chosen token's logprob"),
    integer("top_logprobs", None, 0, MAX_TOP_LOGPROBS, "with logprobs: the top n too"),
    RESPONSE_FORMAT, TOOLS, TOOL_CHOICE,
    Field("reasoning_effort", {"enum": ["low", "medium", "high"]},
          description="how much a reasoning model thinks before answering: the chat template's reasoning_effort "
                      "(gpt-oss: harmony's Reasoning line, default medium); templates without it ignore it"),
], rules=[
    COMPLETION.rules[-1],                           # one guided_* field at most
    Rule(both(sent("top_logprobs"), {"not": equals("logprobs", True)}), "top_logprobs needs logprobs: true",
         "top_logprobs"),
    Rule(both(_GUIDING_FORMAT, {"anyOf": [sent(g) for g in _GUIDED]}),
         "send response_format (json_object or json_schema) or guided_*, not both", "response_format"),
    Rule(both(_FORCED_CALL, {"not": sent_as("tools", minItems=1)}),
         "tool_choice needs tools: send the functions in tools", "tool_choice"),
    Rule(both(_FORCED_CALL, _STRUCTURED),
         "a forced function call (tool_choice required or a named function) cannot be combined with "
         "response_format or guided_*", "tool_choice"),
])

# /api/chat's conversation read as a chat body: Ollama's messages (not published: the route publishes OLLAMA_CHAT)
CHAT_FROM_OLLAMA = Body("ChatFromOllama", [OLLAMA_MESSAGES if f.name == "messages" else f
                                           for f in CHAT.fields.values()], rules=CHAT.rules)

# ---------------------------------------------------------------- Ollama: /api/generate, /api/chat, /api/show

# Ollama's option name -> the OpenAI field it sets (checked with that field's schema)
OLLAMA_OPTIONS = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "min_p": MIN_P, "seed": SEED,
                  "stop": STOP, "repeat_penalty": REPETITION_PENALTY, "presence_penalty": PRESENCE_PENALTY,
                  "frequency_penalty": FREQUENCY_PENALTY,
                  "num_predict": Field("max_tokens", {"type": "integer", "not": {"const": 0}},
                                       description="a negative value: until the context is full (Ollama's -1 and -2); "
                                                   "not 0", hint="a non-zero integer")}
# options Ollama defines that do not change sampling here (memory and threading are the server's)
OLLAMA_IGNORED = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "numa",
                  "num_keep", "low_vram", "vocab_only", "repeat_last_n", "typical_p", "penalize_newline", "mirostat",
                  "mirostat_tau", "mirostat_eta", "tfs_z")
_OPTIONS = Field("options", {
    "type": "object", "additionalProperties": False,
    "properties": {**{k: f.published() for k, f in OLLAMA_OPTIONS.items()},
                   **{k: {"description": "accepted; no effect here"} for k in OLLAMA_IGNORED}}},
    description="sampling: num_predict -> max_tokens, repeat_penalty -> repetition_penalty, the rest by name")
OLLAMA_MODEL = string("model", required=True, minLength=1, description="a served model or adapter (GET /api/tags)")
_FORMAT = Field("format", {"anyOf": [{"enum": ["json", ""]}, {"type": "object"}],
                           "description": '"json" or a JSON Schema object'},
                description='"json": any JSON object; a JSON Schema: an object that validates against it')
_OLLAMA_STREAM = boolean("stream", True, "NDJSON lines, one per delta, the last with done: true")
_THINK = Field("think", {"anyOf": [{"type": "boolean"}, {"enum": ["low", "medium", "high"]}]},
               description="a level: the chat's reasoning_effort (gpt-oss: harmony's Reasoning line); true / false: "
                           "accepted (a harmony model always reasons; its reasoning is the `thinking` field)",
               hint='true, false, "low", "medium" or "high"')

OLLAMA_GENERATE = Body("OllamaGenerateRequest", [
    OLLAMA_MODEL, string("prompt", required=True, minLength=1),
    string("system", description="a system message (not with raw)"),
    boolean("raw", False, "true: the prompt as is, no chat template"), _OLLAMA_STREAM, _FORMAT, _OPTIONS, ADAPTER_MIX,
    _THINK,
])
OLLAMA_CHAT = Body("OllamaChatRequest", [OLLAMA_MODEL, OLLAMA_MESSAGES, TOOLS, _OLLAMA_STREAM, _FORMAT, _OPTIONS,
                                          ADAPTER_MIX, _THINK])
OLLAMA_SHOW = Body("OllamaShowRequest", [OLLAMA_MODEL, string("name", deprecated=True,
                                                               description="older clients' name for model")])

# ---------------------------------------------------------------- Ollama's model management (the local store)

_STORE_NAME = string("model", required=True, minLength=1, description="a store name, NAME[:TAG] (TAG default latest)")
OLLAMA_PULL = Body("OllamaPullRequest", [
    string("model", required=True, minLength=1, description="a store name already pulled, a recipe (models/), a GGUF "
                                                            "file or HF directory on the server, or an artifact "
                                                            "directory; stored as NAME:latest unless it says a tag"),
    boolean("insecure", False, "accepted; no effect here"), _OLLAMA_STREAM,
], served_model=False)
OLLAMA_DELETE = Body("OllamaDeleteRequest", [_STORE_NAME], served_model=False)
OLLAMA_COPY = Body("OllamaCopyRequest", [string("source", required=True, minLength=1, description="a store name"),
                                         string("destination", required=True, pattern=STORE_NAME_PATTERN,
                                                description="the new store name (replaced if it exists)")])
OLLAMA_PARAMETERS = Field("parameters", _OPTIONS.schema,
                          description="default options of the new model's requests (a request's own win)")
OLLAMA_CREATE = Body("OllamaCreateRequest", [
    string("model", required=True, pattern=STORE_NAME_PATTERN, description="the new store name, NAME[:TAG]"),
    string("from", required=True, minLength=1, description="the base: a store name or a served model"),
    Field("adapters", {"type": "object", "minProperties": 1,
                       "additionalProperties": {"type": "string", "pattern": "^sha256[:-][0-9a-f]{64}$"}},
          description="one PEFT LoRA adapter: file name -> digest of a blob sent to POST /api/blobs/{digest} "
                      "(adapter_config.json and adapter_model.safetensors)"),
    string("system", description="the system message of requests that send none"),
    string("template", minLength=1, description="a Jinja chat template (as in tokenizer_config.json)"),
    OLLAMA_PARAMETERS,
    Field("license", {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
          description="kept with the model"),
    Field("files", {"type": "object", "maxProperties": 0}, description="not supported (null or empty): pull a GGUF "
                                                                       "path instead"),
    string("quantize", maxLength=0, description="not supported (null or empty): pull with the quantization wanted"),
    Field("messages", {"type": "array", "maxItems": 0}, description="not supported (null or empty)"),
    _OLLAMA_STREAM,
], served_model=False)

# ---------------------------------------------------------------- tokenizer and adapters

TOKENIZE = Body("TokenizeRequest", [
    string("prompt", description="text, encoded as a completion prompt is"),
    Field("messages", MESSAGES.schema, description="a conversation, rendered as chat renders it"),
    boolean("add_special_tokens", True, "for prompt: add the tokenizer's special tokens (BOS)"),
], alternatives=[["prompt"], ["messages"]])
DETOKENIZE = Body("DetokenizeRequest", [Field("tokens", {"type": "array", "items": {
    "type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID, BOUND: "tokenizer_token_id"}},
                                              required=True, description="token ids")])
ADAPTER = Body("AdapterLoadRequest", [
    string("name", required=True, minLength=1, description="the model name it is served as: 1-64 letters, "
                                                            "digits, '.', '_' or '-' (checked when it is built)"),
    string("path", required=True, minLength=1, description="a PEFT LoRA directory on the server"),
])

ALL = [COMPLETION, CHAT, OLLAMA_GENERATE, OLLAMA_CHAT, OLLAMA_SHOW, OLLAMA_PULL, OLLAMA_DELETE, OLLAMA_COPY,
       OLLAMA_CREATE, TOKENIZE, DETOKENIZE, ADAPTER]
