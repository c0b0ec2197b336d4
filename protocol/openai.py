"""OpenAI request bodies -> (prompt, SamplingParams); CompletionOutput -> OpenAI response shapes.

Flask-free (tests/test_layering.py): the HTTP service and the batch job (`ortllm batch`) share it.

Every type and range problem is raised here as a 400 naming the field (`param`), before the engine sees it;
the engine's own validation (SamplingParams.validate, token ids, context) is the second line and maps to the
same envelope."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ortllm.runtime.sampling_params import MAX_LOGPROBS, SamplingParams

from .errors import bad_request

MAX_STOP = 4            # OpenAI's limit on stop strings
MAX_TOP_LOGPROBS = 5    # OpenAI's limit on completions' `logprobs` / chat's `top_logprobs`
assert MAX_TOP_LOGPROBS <= MAX_LOGPROBS


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
        body = json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object; got a JSON {json_type(body)}",
                          code="invalid_json")
    return body


def reject_constant(name: str):
    """json.loads(parse_constant=...): NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def json_type(v) -> str:
    """The JSON name of a parsed value's type, for messages."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number")


# ---------------------------------------------------------------- typed field access

def _int(body: dict, name: str, default=None, lo: int | None = None, hi: int | None = None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise bad_request(f"{name} must be an integer; got {json.dumps(v)[:60]}", param=name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise bad_request(f"{name} must be {rng}; got {v}", param=name)
    return v


def _num(body: dict, name: str, default, ok=None, allowed: str = ""):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(f"{name} must be a number; got {json.dumps(v)[:60]}", param=name)
    if ok is not None and not ok(v):
        raise bad_request(f"{name} must be {allowed}; got {v}", param=name)
    return float(v)


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"{name} must be true or false; got {json.dumps(v)[:60]}", param=name)
    return v


def _str(body: dict, name: str, default=None):
    v = body.get(name, default)
    if v is not None and not isinstance(v, str):
        raise bad_request(f"{name} must be a string; got {json.dumps(v)[:60]}", param=name)
    return v


# ---------------------------------------------------------------- requests

@dataclass
class GenerationRequest:
    model: str | None
    prompt: str | list[int] | None        # completions
    messages: list[dict] | None           # chat
    params: SamplingParams
    max_tokens_given: bool                # False: fill the context (chat default)
    stream: bool
    include_usage: bool
    logprobs: int | None                  # top-n per token; None: none
    echo: bool = False


def parse_completion(body: dict) -> GenerationRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                               # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt is empty; send at least one character", param="prompt", code="empty_prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        pass
    elif isinstance(prompt, list) and prompt and all(isinstance(t, (str, list)) for t in prompt):
        raise bad_request("send one prompt per request (a batch of several prompts is not supported)",
                          param="prompt")
    elif prompt is None:
        raise bad_request("prompt is required: a string or a list of token ids", param="prompt")
    else:
        raise bad_request("prompt must be a non-empty string or a non-empty list of integer token ids",
                          param="prompt")
    logprobs = _int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    echo = _bool(body, "echo", False)
    if echo:
        raise bad_request("echo is not supported; leave it false", param="echo")
    if _str(body, "suffix"):
        raise bad_request("suffix is not supported; leave it null", param="suffix")
    if _int(body, "best_of", 1, lo=1) != 1:
        raise bad_request("best_of must be 1 (only n=1 is supported)", param="best_of")
    params, given = _sampling(body, default_max_tokens=16, logprobs=logprobs)
    stream, usage = _stream(body)
    return GenerationRequest(_model(body), prompt, None, params, given, stream, usage, logprobs)


def parse_chat(body: dict) -> GenerationRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects", param="messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string role", param="messages")
        if m["role"] not in ("system", "user", "assistant", "developer", "tool"):
            raise bad_request(f"messages[{i}].role must be system, user, assistant, developer or tool; "
                              f"got {m['role']!r}", param="messages")
        content = m.get("content")
        if isinstance(content, list):     # [{"type": "text", "text": ...}, ...]
            parts = []
            for p in content:
                if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                    raise bad_request(f"messages[{i}].content parts must be {{type: text, text: str}}; only text "
                                      "is supported", param="messages")
                parts.append(p["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string or a list of text parts", param="messages")
        clean.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    want_lp = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None and not want_lp:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    logprobs = (top or 0) if want_lp else None
    if "max_completion_tokens" in body and body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise bad_request("response_format other than {type: text} is not supported", param="response_format")
    if body.get("tools"):
        raise bad_request("tools are not supported", param="tools")
    params, given = _sampling(body, default_max_tokens=None, logprobs=logprobs)
    stream, usage = _stream(body)
    return GenerationRequest(_model(body), None, clean, params, given, stream, usage, logprobs)


def _model(body: dict) -> str | None:
    return _str(body, "model")


def _stream(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad_request("stream_options must be an object", param="stream_options")
    usage = _bool(opts or {}, "include_usage", False)
    return stream, usage


def _sampling(body: dict, default_max_tokens: int | None, logprobs: int | None) -> tuple[SamplingParams, bool]:
    if _int(body, "n", 1, lo=1) != 1:
        raise bad_request("n must be 1; send several requests for several completions", param="n")
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported", param="logit_bias")
    max_tokens = _int(body, "max_tokens", None, lo=1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("stop must be a non-empty string or a list of non-empty strings", param="stop")
    if len(stop) > MAX_STOP:
        raise bad_request(f"stop takes at most {MAX_STOP} strings; got {len(stop)}", param="stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                 for t in stop_ids):
        raise bad_request("stop_token_ids must be a list of non-negative integers", param="stop_token_ids")
    params = SamplingParams(
        max_tokens=max_tokens or default_max_tokens or 1,
        temperature=_num(body, "temperature", 1.0, lambda v: 0 <= v <= 2, "in [0, 2]"),
        top_p=_num(body, "top_p", 1.0, lambda v: 0 < v <= 1, "in (0, 1]"),
        top_k=_int(body, "top_k", 0, lo=0),
        min_p=_num(body, "min_p", 0.0, lambda v: 0 <= v <= 1, "in [0, 1]"),
        repetition_penalty=_num(body, "repetition_penalty", 1.0, lambda v: v > 0, "> 0"),
        frequency_penalty=_num(body, "frequency_penalty", 0.0, lambda v: -2 <= v <= 2, "in [-2, 2]"),
        presence_penalty=_num(body, "presence_penalty", 0.0, lambda v: -2 <= v <= 2, "in [-2, 2]"),
        seed=_int(body, "seed", None, lo=0, hi=2**63 - 1),
        stop=stop, stop_token_ids=stop_ids, ignore_eos=_bool(body, "ignore_eos", False),
        logprobs=logprobs, priority=_int(body, "priority", 0, lo=-1000, hi=1000),
    )
    return params, max_tokens is not None or default_max_tokens is not None


# ---------------------------------------------------------------- responses

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


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
