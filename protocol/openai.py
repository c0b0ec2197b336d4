"""OpenAI request bodies -> (prompt, SamplingParams); CompletionOutput -> OpenAI response shapes.

Flask-free (tests/test_layering.py): the HTTP service and the batch job (`ortllm batch`) share it.

The bodies are declared in bodies.py: read() checks every field against its schema (a 400 naming it), and
what a schema cannot say (one field's meaning depending on another) is checked here: wire syntax only. Whether the
request can run (ranges, adapters, logit_bias, the context, grammars) the engine's input processor decides at
submit (runtime/request_input.py), once for every API, raising errors whose `param` the envelope names."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ortllm.runtime.sampling_params import SamplingParams

from . import structured
from .bodies import CHAT, COMPLETION, COMPLETION_MAX_TOKENS
from .fields import Body
from .errors import bad_request


def parse_json_object(raw: bytes) -> dict:
    """A request body (bytes) as a JSON object, or a 400 saying what is wrong with it."""
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object", code="empty_body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start}); send UTF-8 JSON",
                          code="invalid_utf8") from None
    try:
        body = json.loads(text, parse_constant=reject_constant, parse_float=finite_float)
    except (ValueError, RecursionError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object; got a JSON {json_type(body)}",
                          code="invalid_json")
    return body


def reject_constant(name: str):
    """json.loads(parse_constant=...): NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def finite_float(text: str) -> float:
    """json.loads(parse_float=...): a number too large for a double (1e999) is refused, not read as inf."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:30]} is out of range")
    return v


def json_type(v) -> str:
    """The JSON name of a parsed value's type, for messages."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number")


# ---------------------------------------------------------------- requests

@dataclass
class GenerationRequest:
    model: str | None
    prompt: str | list[int] | None        # completions: the (first) prompt
    messages: list[dict] | None           # chat
    params: SamplingParams
    api_max_tokens: int | None            # the API's max_tokens when the body has none and the server sets no
                                          # default (--max-tokens): completions 16 (OpenAI's); chat None: the room
    stream: bool
    include_usage: bool
    logprobs: int | None                  # top-n per token; None: none
    echo: bool = False                    # completions: the prompt (and its logprobs) before the completion
    n: int = 1                            # completions per prompt
    prompts: list | None = None           # completions: every prompt of the request (choice i*n + j)
    tools: structured.ToolSpec | None = None
    echo_only: bool = False               # echo with max_tokens 0: prompt logprobs, nothing generated
    prefill: str = ""                     # chat: the start of the reply, written after the generation prompt
    reasoning_effort: str | None = None   # chat: the template's reasoning_effort (harmony's Reasoning line)


def parse_completion(body: dict) -> GenerationRequest:
    prompt = body.get("prompt")
    for i, p in enumerate(prompt if isinstance(prompt, list) else [prompt]):
        if p == "":          # the schema refuses it too; this says so with OpenAI's code
            raise bad_request("prompt" + (f"[{i}]" if isinstance(prompt, list) else "") + " is empty; send at "
                              "least one character", param="prompt", code="empty_prompt")
    v = COMPLETION.read(body)
    several = isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt)
    prompts = list(prompt) if several else [prompt]
    echo, n, logprobs = v["echo"], v["n"], v["logprobs"]
    echo_only = echo and v["max_tokens"] == 0     # lm-eval's loglikelihood: score the prompt only
    params = _sampling(v, 1 if echo_only else v["max_tokens"], logprobs)
    params.guide = structured.guided_fields(v)
    if echo and logprobs is not None:
        params.prompt_logprobs = True
    return GenerationRequest(v["model"], prompts[0], None, params, COMPLETION_MAX_TOKENS, v["stream"],
                             _include_usage(v), logprobs, echo, n, prompts, echo_only=echo_only)


def parse_chat(body: dict, decl: Body = CHAT) -> GenerationRequest:
    """decl: CHAT, or CHAT_FROM_OLLAMA for /api/chat's conversation (Ollama's messages)."""
    v = decl.read(body)
    clean = []
    for i, m in enumerate(v["messages"]):
        content = m.get("content")
        if isinstance(content, list):     # [{"type": "text", "text": ...}, ...]
            content = "".join(p["text"] for p in content)
        msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": content or ""}
        if m["role"] == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _message_tool_calls(m["tool_calls"], i)
        clean.append(msg)
    top = v["top_logprobs"]
    logprobs = (top or 0) if v["logprobs"] else None
    max_tokens = v["max_completion_tokens"] if v["max_completion_tokens"] is not None else v["max_tokens"]
    # one of response_format and guided_*, and neither with a forced call (CHAT's rules)
    guide = structured.response_format_guide(v["response_format"]) or structured.guided_fields(v)
    tools = structured.parse_tools(v["tools"], v["tool_choice"])
    if tools is not None and tools.choice != "auto":
        guide = tools.guide()
    params = _sampling(v, max_tokens, logprobs)
    params.guide = guide
    return GenerationRequest(v["model"], None, clean, params, None, v["stream"], _include_usage(v), logprobs,
                             n=v["n"], tools=tools, reasoning_effort=v["reasoning_effort"])


def _message_tool_calls(calls: list[dict], i: int) -> list[dict]:
    """An assistant message's tool_calls sent back: {name, arguments} each, the arguments parsed."""
    out = []
    for c in calls:
        args = c["function"].get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass              # as OpenAI: the text as it came (a model's call may be cut short), rendered as is
        out.append({"name": c["function"]["name"], "arguments": args})
    return out


def _include_usage(v: dict) -> bool:
    return bool((v["stream_options"] or {}).get("include_usage"))


def _sampling(v: dict, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    """SamplingParams from read() values; max_tokens None when the body has none (the server's default then)."""
    stop = v["stop"]
    lb = v["logit_bias"]
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=float(v["temperature"]), top_p=float(v["top_p"]), top_k=v["top_k"], min_p=float(v["min_p"]),
        repetition_penalty=float(v["repetition_penalty"]), frequency_penalty=float(v["frequency_penalty"]),
        presence_penalty=float(v["presence_penalty"]), seed=v["seed"],
        stop=[stop] if isinstance(stop, str) else list(stop or []), stop_token_ids=list(v["stop_token_ids"] or []),
        ignore_eos=v["ignore_eos"], logprobs=logprobs, priority=v["priority"],
        logit_bias={int(k): float(b) for k, b in lb.items()} if lb else None,
        speculative=v["speculative"], adapters=v["adapters"],
    )
    return params


# ---------------------------------------------------------------- responses

def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
         "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return u


def completion_logprobs(entries, token_text, start_offset: int = 0) -> dict:
    """Completions' shape: tokens, token_logprobs, top_logprobs ([{token: logprob}]), text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    off = start_offset
    for e in entries:
        t = token_text(e.token_id)
        tokens.append(t)
        lps.append(float(e.logprob))
        tops.append({token_text(i): float(lp) for i, lp in zip(e.top_ids, e.top_logprobs)})
        offsets.append(off)
        off += len(t)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(entries, token_text) -> dict:
    """Chat's shape: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    def item(tid, lp):
        t = token_text(tid)
        return {"token": t, "logprob": float(lp), "bytes": list(t.encode("utf-8"))}
    return {"content": [{**item(e.token_id, e.logprob),
                         "top_logprobs": [item(i, lp) for i, lp in zip(e.top_ids, e.top_logprobs)]}
                        for e in entries]}
