"""OpenAI Batch lines: one input line -> a request ready for the engine, or the error line it earns; a finished
CompletionOutput -> the output line, its `body` in the very shape the HTTP service answers for that url.

    input   {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
    output  {"id": "batch_req_<line>", "custom_id": "a", "response": {"status_code": 200, "request_id": ..,
             "body": {...}}, "error": null}

Two kinds of failure, both a line of the output and never the end of the job:
- the line itself is wrong (not JSON, no or a repeated custom_id, method, url): `response` null, `error` set;
- the body is wrong (as the service would answer 400/404): `response` holds the service's status and error
  envelope, and `error` repeats its {code, message} so `error != null` finds every failed request.

Validation and bodies are the service's own, from the Flask-free protocol both share: its parsers
(ortllm.protocol.openai), its checks before submit and its response body (ortllm.protocol.generation), its
error mapping (ortllm.protocol.errors); tests/batch compare the lines with a live server's answers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable

from ortllm.runtime.engine import CompletionOutput, Engine
from ortllm.runtime.errors import RequestError
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.protocol import generation
from ortllm.protocol import openai as http
from ortllm.protocol.errors import APIError, bad_request, to_api_error, unavailable
from ortllm.protocol.openai import finite_float, json_type, reject_constant

CHAT, COMPLETIONS = "chat", "completions"
URLS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
PARSERS = {CHAT: http.parse_chat, COMPLETIONS: http.parse_completion}


@dataclass
class LineItem:
    """One input line that is well-formed as a batch line; its body is not checked yet."""
    line_no: int            # 1-based line of the input file: the output line's id is batch_req_<line_no>
    custom_id: str
    kind: str               # CHAT | COMPLETIONS
    body: dict


@dataclass
class Prepared:
    """A request the protocol made ready (the engine's input processor checks the rest when it is submitted)."""
    item: LineItem
    req: http.GenerationRequest
    params: SamplingParams   # the request's, with the adapter its model names
    prompt_ids: list[int]
    model: str               # what answers: the adapter's name or the base model's


def line_id(line_no: int) -> str:
    return f"batch_req_{line_no}"


def request_id(item: LineItem) -> str:
    return f"{line_id(item.line_no)}-{item.custom_id}"[:64]


# ---------------------------------------------------------------- input lines

def parse_line(line_no: int, text: str, seen: set[str]) -> LineItem | dict:
    """A LineItem, or the error line for a malformed batch line. Adds a good line's custom_id to `seen`."""
    try:
        obj = json.loads(text, parse_constant=reject_constant, parse_float=finite_float)
    except (ValueError, RecursionError) as e:
        return error_line(line_no, None, "invalid_json", f"line {line_no} is not valid JSON: {e}")
    if not isinstance(obj, dict):
        return error_line(line_no, None, "invalid_json", f"line {line_no} must be a JSON object")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return error_line(line_no, None, "missing_custom_id",
                          f"line {line_no} has no custom_id; give every line a unique non-empty string custom_id")
    if cid in seen:
        return error_line(line_no, cid, "duplicate_custom_id",
                          f"custom_id {cid!r} repeats an earlier line; line {line_no} was not run")
    seen.add(cid)
    if obj.get("method") != "POST":
        return error_line(line_no, cid, "invalid_method", f"method must be \"POST\"; got {obj.get('method')!r}")
    kind = URLS.get(obj.get("url"))
    if kind is None:
        return error_line(line_no, cid, "invalid_url",
                          f"url must be one of {', '.join(URLS)}; got {obj.get('url')!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        return api_error_line(line_no, cid, bad_request(f"the request body must be a JSON object; got a JSON "
                                                        f"{json_type(body)}", code="invalid_json"))
    return LineItem(line_no, cid, kind, body)


# ---------------------------------------------------------------- the service's checks, before submit

def prepare(engine: Engine, model_name: str, item: LineItem) -> Prepared:
    """Parse the body and make it ready exactly as the service does (protocol/generation.py prepare); raises
    APIError/RequestError. The engine's own checks (engine.input.check_params) run now, before the line waits."""
    req = PARSERS[item.kind](item.body)
    if req.stream:
        raise bad_request("stream is not supported in a batch; leave it false", param="stream")
    sub = generation.prepare(engine, req, model_name)
    params, ids = engine.input.check_params(sub.params), sub.prompts[0]
    # fitted now (the lines are sorted by length); submit fits it again to the same value
    params = replace(params, max_tokens=engine.limits.fit_max_tokens(len(ids), params.max_tokens))
    return Prepared(item, req, params, ids, params.adapter or model_name)


def as_api_error(e: Exception) -> APIError:
    """The service's HTTP answer for a request error (RequestError, Overloaded, APIError)."""
    err = to_api_error(e)
    if err is None:
        raise e
    return err


# ---------------------------------------------------------------- output lines

def error_line(line_no: int, custom_id: str | None, code: str, message: str) -> dict:
    return {"id": line_id(line_no), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def api_error_line(line_no: int, custom_id: str, err: APIError) -> dict:
    return {"id": line_id(line_no), "custom_id": custom_id,
            "response": {"status_code": err.status, "request_id": None, "body": err.body()},
            "error": {"code": err.code or err.type, "message": err.message}}


def finished_line(p: Prepared, out: CompletionOutput, created: int, token_text: Callable[[int], str],
                  harmony: bool = False) -> dict:
    """The output line of a finished request; a failed one gets the service's 503 envelope. harmony: the model
    replies in harmony (gpt-oss), a chat body's message split by channel as the service splits it."""
    item = p.item
    if out.finish_reason == "error":
        return api_error_line(item.line_no, item.custom_id,
                              unavailable(f"the model run for this request failed ({out.error}); retry",
                                          "model_run_failed"))
    if out.finish_reason in ("deadline", "cancelled"):
        return api_error_line(item.line_no, item.custom_id, unavailable("the request was cancelled", "cancelled"))
    rid = request_id(item)
    body = generation.response_body(item.kind, out, request_id=rid, model=p.model, created=created,
                         logprobs=p.req.logprobs, token_text=token_text, harmony=harmony)
    return {"id": line_id(item.line_no), "custom_id": item.custom_id,
            "response": {"status_code": 200, "request_id": rid, "body": body}, "error": None}


def model_name_of(engine: Engine, override: str | None = None) -> str:
    """The base model's name as the service derives it (service/resources.py)."""
    return override or engine.artifact.manifest.recipe or engine.artifact.path.name


def is_request_error(e: Exception) -> bool:
    return isinstance(e, (APIError, RequestError))
