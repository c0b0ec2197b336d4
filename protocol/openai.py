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

from . import structured
from .errors import bad_request

MAX_STOP = 4            # OpenAI's limit on stop strings
MAX_N = 8               # completions per prompt (n): one prefill, n continuations
MAX_PROMPTS = 32        # prompts in one /v1/completions request
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
    prompt: str | list[int] | None        # completions: the (first) prompt
    messages: list[dict] | None           # chat
    params: SamplingParams
    max_tokens_given: bool                # False: fill the context (chat default)
    stream: bool
    include_usage: bool
    logprobs: int | None                  # top-n per token; None: none
    echo: bool = False                    # completions: the prompt (and its logprobs) before the completion
    n: int = 1                            # completions per prompt
    prompts: list | None = None           # completions: every prompt of the request (choice i*n + j)
    tools: structured.ToolSpec | None = None
    echo_only: bool = False               # echo with max_tokens 0: prompt logprobs, nothing generated


def _one_prompt(prompt, where: str = "prompt"):
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request(f"{where} is empty; send at least one character", param="prompt", code="empty_prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        pass
    else:
        raise bad_request(f"{where} must be a non-empty string or a non-empty list of integer token ids",
                          param="prompt")
    return prompt


def parse_completion(body: dict) -> GenerationRequest:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("prompt is required: a string, a list of token ids, or a list of those", param="prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, (str, list)) for t in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise bad_request(f"send at most {MAX_PROMPTS} prompts per request; got {len(prompt)}", param="prompt")
        prompts = [_one_prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    else:
        prompts = [_one_prompt(prompt)]
    logprobs = _int(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    echo = _bool(body, "echo", False)
    if _str(body, "suffix"):
        raise bad_request("suffix is not supported; leave it null", param="suffix")
    n = _int(body, "n", 1, lo=1, hi=MAX_N)
    if _int(body, "best_of", n, lo=1) != n:
        raise bad_request("best_of must equal n (ranking several candidates is not supported)", param="best_of")
    echo_only = echo and body.get("max_tokens") == 0     # lm-eval's loglikelihood: score the prompt only
    if echo_only:
        body = {**body, "max_tokens": 1}
    params, given = _sampling(body, default_max_tokens=16, logprobs=logprobs)
    params.guide = structured.guided_fields(body)
    stream, usage = _stream(body)
    if echo and stream:
        raise bad_request("echo cannot be combined with stream; send stream: false", param="echo")
    if echo and logprobs is not None:
        params.prompt_logprobs = True
    if len(prompts) * n > 64:
        raise bad_request(f"{len(prompts)} prompts x n={n} is more than 64 completions; send fewer", param="n")
    return GenerationRequest(_model(body), prompts[0], None, params, given, stream, usage, logprobs, echo, n,
                             prompts, echo_only=echo_only)


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
        msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": content}
        if m["role"] == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _message_tool_calls(m["tool_calls"], i)
        clean.append(msg)
    want_lp = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None and not want_lp:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    logprobs = (top or 0) if want_lp else None
    if "max_completion_tokens" in body and body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    guide = structured.response_format_guide(body.get("response_format"))
    extra = structured.guided_fields(body)
    if guide is not None and extra is not None:
        raise bad_request(f"send response_format or {extra.param}, not both", param=extra.param)
    guide = guide or extra
    tools = structured.parse_tools(body)
    if tools is not None and tools.choice != "auto":
        if guide is not None:
            raise bad_request(f"tool_choice {tools.choice!r} forces a function call; it cannot be combined with "
                              f"{guide.param}", param="tool_choice")
        guide = tools.guide()
    params, given = _sampling(body, default_max_tokens=None, logprobs=logprobs)
    params.guide = guide
    n = _int(body, "n", 1, lo=1, hi=MAX_N)
    stream, usage = _stream(body)
    return GenerationRequest(_model(body), None, clean, params, given, stream, usage, logprobs, n=n, tools=tools)


def _message_tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's tool_calls sent back: [{id, type, function: {name, arguments: JSON text}}]."""
    out = []
    if not isinstance(calls, list):
        raise bad_request(f"messages[{i}].tool_calls must be a list", param="messages")
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"messages[{i}].tool_calls[] must be {{id, type: function, function: {{name, "
                              "arguments}}}}", param="messages")
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            raise bad_request(f"messages[{i}].tool_calls[].function.arguments must be JSON text", param="messages")
        out.append({"name": fn["name"], "arguments": args})
    return out


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
        logit_bias=_logit_bias(body),
        speculative=_bool(body, "speculative", True),      # extension: false turns prompt-lookup drafts off
    )
    return params, max_tokens is not None or default_max_tokens is not None


def _logit_bias(body: dict) -> dict[int, float] | None:
    """{"token id": bias in [-100, 100]} (JSON keys are strings) -> {int: float}."""
    lb = body.get("logit_bias")
    if lb is None or lb == {}:
        return None
    if not isinstance(lb, dict) or len(lb) > 300:
        raise bad_request("logit_bias must be an object of at most 300 {\"token id\": bias}", param="logit_bias")
    out = {}
    for k, v in lb.items():
        try:
            t = int(k)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids; got {k!r}", param="logit_bias") from None
        if t < 0 or isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad_request(f"logit_bias[{k!r}] must be a number in [-100, 100] for a token id >= 0; got {v!r}",
                              param="logit_bias")
        out[t] = float(v)
    return out


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
