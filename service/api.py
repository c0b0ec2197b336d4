"""The OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions (plain or SSE), /v1/models,
and /v1/adapters (load / unload LoRA adapters at run time; needs the server's API key).

One request = one engine handle. Non-streaming handlers wait on the handle in short slices so a client that
hangs up (waitress' client_disconnected) or the per-request timeout cancels the generation; a stream's
generator cancels it when waitress closes it (client gone) and in its finally."""
from __future__ import annotations

import json
import logging
import time
from typing import Callable, Iterator

from pathlib import Path

from flask import Blueprint, Response, current_app, g, jsonify, request

from ortllm.runtime.engine import CompletionOutput, Engine, RequestHandle

from . import protocol
from .auth import require_api_key
from .errors import APIError, ClientGone, bad_request, model_not_found, unavailable
from .generation import logprobs_of, prepare, resolve_adapter, response_body, response_id, token_text_of
from .metrics import current_metrics
from .resources import EngineResource, current_resources

log = logging.getLogger("ortllm.service")
bp = Blueprint("openai", __name__, url_prefix="/v1")
bp.before_request(require_api_key)

_POLL_S = 0.25     # how often a waiting handler checks for a hung-up client and its timeout


@bp.get("/models")
def list_models():
    pool = current_resources()
    if pool.lazy:       # several models: each with its adapters (as ADAPTER and MODEL:ADAPTER), loaded or not
        return jsonify({"object": "list", "data": [card for res in pool.models for card in _pool_cards(res)]})
    res = pool.default
    engine = res.require_engine()
    names = [None, *engine.adapters.names()]
    return jsonify({"object": "list", "data": [_model_card(res, engine, a) for a in names]})


@bp.get("/models/<path:model>")
def get_model(model: str):
    res, model = current_resources().route(model)
    if res.pool is not None:
        return jsonify(next(c for c in _pool_cards(res) if c["id"] in (model, f"{res.model_name}:{model}")))
    engine = res.require_engine()
    return jsonify(_model_card(res, engine, resolve_adapter(engine, res.model_name, model)))


def _model_card(res: EngineResource, engine: Engine, adapter: str | None) -> dict:
    card = {"id": adapter or res.model_name, "object": "model", "created": res.created, "owned_by": "ortllm",
            "root": res.model_name, "max_model_len": engine.context_length}
    if adapter is not None:
        card["parent"] = res.model_name
    return card


def _pool_cards(res: EngineResource) -> list[dict]:
    """A served model of a multi-model server, and its adapters, without loading it ("loaded" says if it is)."""
    base = {"object": "model", "created": res.created, "owned_by": "ortllm", "root": res.model_name,
            "loaded": res.engine is not None}
    cards = [{**base, "id": res.model_name}]
    for a in res.adapter_names():
        cards += [{**base, "id": f"{res.model_name}:{a}", "parent": res.model_name},
                  {**base, "id": a, "parent": res.model_name}]
    return cards


@bp.post("/adapters")
def load_adapter():
    """{"name": NAME, "path": PEFT_DIR on the server}: convert into the artifact and serve it as model NAME."""
    from ortllm.pipeline.adapters import add_adapter
    from ortllm.pipeline.errors import BuildError

    res = current_resources()
    engine = res.require_engine()
    _require_configured_key()
    body = protocol.read_json_object(request)
    name, path = body.get("name"), body.get("path")
    if not isinstance(name, str) or not isinstance(path, str):
        raise bad_request("send {\"name\": ADAPTER_NAME, \"path\": PEFT_DIRECTORY_ON_THE_SERVER}", param="name")
    if name == res.model_name or name in engine.adapters.names():
        raise APIError(409, f"a model named {name!r} is already served; DELETE /v1/adapters/{name} first",
                       param="name", code="adapter_exists")
    try:
        entry = add_adapter(engine.artifact.path, Path(path), name, force=True)
    except BuildError as e:
        raise bad_request(str(e), param="path") from None
    engine.add_adapter(name, entry)
    log.info("adapter loaded", extra={"adapter": name, "rank": entry["rank"]})
    return jsonify(_model_card(res, engine, name)), 201


@bp.delete("/adapters/<name>")
def unload_adapter(name: str):
    """Refused for new requests at once; requests already running finish; the file leaves the artifact."""
    from ortllm.pipeline.adapters import remove_adapter

    res = current_resources()
    engine = res.require_engine()
    _require_configured_key()
    if name not in engine.adapters.names():
        raise model_not_found(name, res.model_name, engine.adapters.names())
    engine.retire_adapter(name)
    remove_adapter(engine.artifact.path, name)
    log.info("adapter unloaded", extra={"adapter": name})
    return jsonify({"id": name, "object": "model", "deleted": True})


def _require_configured_key() -> None:
    if current_app.config["ORTLLM"].api_key is None:
        raise APIError(403, "managing adapters needs an API key: start the server with --api-key KEY",
                       type="permission_error", code="api_key_required")


@bp.post("/completions")
def completions():
    return _generate("completions", protocol.parse_completion(protocol.read_json_object(request)))


@bp.post("/chat/completions")
def chat_completions():
    return _generate("chat", protocol.parse_chat(protocol.read_json_object(request)))


# ---------------------------------------------------------------- one generation

def _generate(kind: str, req: protocol.GenerationRequest):
    res, req.model = current_resources().route(req.model)     # which model (and adapter) answers
    res.begin()              # holds the model (no unloading) until the call closes
    try:
        engine = res.require_engine()
        ids = prepare(engine, req, res.model_name, res.max_prompt_chars)
        handle = engine.submit(ids, req.params, request_id=g.request_id)
    except BaseException:
        res.end()
        raise
    timeout = res.config.request_timeout_s
    call = _Call(kind, req, res, engine, handle, g.request_id, g.t_start, g.t_start + timeout,
                 request.environ.get("waitress.client_disconnected"))
    if req.stream:
        resp = Response(call.sse(), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        resp.call_on_close(call.close)
        return resp
    try:
        out = call.wait()
    finally:
        call.close()
    return jsonify(call.body(out))


class _Call:
    """One engine request seen from HTTP: waiting or streaming, cleanup once, metrics and the log line."""

    def __init__(self, kind: str, req: protocol.GenerationRequest, res: EngineResource, engine: Engine,
                 handle: RequestHandle, request_id: str, t_arrival: float, deadline: float,
                 disconnected: Callable[[], bool] | None):
        self.kind, self.req, self.res, self.engine, self.handle = kind, req, res, engine, handle
        self.request_id, self.t_arrival, self.deadline = request_id, t_arrival, deadline
        self.disconnected = disconnected or (lambda: False)
        self.metrics = current_metrics()
        self.created = int(time.time())
        self.id = response_id(kind, request_id)
        self.token_text = token_text_of(engine)
        self.model = req.params.adapter or res.model_name     # what answered: an adapter or the base model
        self._closed = False
        self._finished: CompletionOutput | None = None
        self._lp_sent = 0
        self.metrics.in_flight.inc()

    # ------------------------------------------------ waiting (non-streaming)
    def wait(self) -> CompletionOutput:
        while True:
            try:
                return self._finish(self.handle.result(timeout=_POLL_S))
            except TimeoutError:
                self._check_alive()

    def _check_alive(self) -> None:
        if time.perf_counter() > self.deadline:
            self.handle.cancel()
            raise APIError(504, f"the generation did not finish within the server's request timeout "
                           f"({self.res.config.request_timeout_s:g} s); lower max_tokens", type="timeout_error",
                           code="request_timeout")
        if self.disconnected():
            self.handle.cancel()
            raise ClientGone()

    def _finish(self, out: CompletionOutput) -> CompletionOutput:
        """Record a finished output once; raise the APIError for one that failed."""
        if self._finished is None:
            self._finished = out
            t_end = time.perf_counter()
            first = self.handle.first_token_time
            # handle times are time.monotonic(); convert to the perf_counter clock of t_arrival
            shift = time.perf_counter() - time.monotonic()
            sched = self.handle.scheduled_time
            self.metrics.observe_finished(self.model, self.kind, out, self.t_arrival, t_end,
                                          None if first is None else first + shift, self.handle.submitted + shift,
                                          None if sched is None else sched + shift)
            log.info("generation finished", extra={
                "request_id": self.request_id, "endpoint": self.kind, "finish_reason": out.finish_reason,
                "prompt_tokens": out.prompt_tokens, "completion_tokens": len(out.token_ids),
                "stream": self.req.stream, "duration_s": round(t_end - self.t_arrival, 4),
                **({"error": out.error} if out.error else {})})
        if out.finish_reason == "error":
            raise unavailable(f"the model run for this request failed ({out.error}); retry", "model_run_failed")
        if out.finish_reason == "deadline":
            raise unavailable("the request waited too long in the queue; retry later", "queue_timeout")
        if out.finish_reason == "cancelled":
            raise unavailable("the request was cancelled by the server; retry", "cancelled")
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.handle.done:
            self.handle.cancel()
            self.metrics.requests.labels(self.model, self.kind, "cancelled").inc()
            log.info("generation cancelled", extra={"request_id": self.request_id, "endpoint": self.kind,
                                                    "after_s": round(time.perf_counter() - self.t_arrival, 4)})
        self.metrics.in_flight.dec()
        self.res.end()

    # ------------------------------------------------ bodies
    def _logprobs(self, entries):
        return logprobs_of(self.kind, entries, self.req.logprobs, self.token_text)

    def body(self, out: CompletionOutput) -> dict:
        return response_body(self.kind, out, request_id=self.request_id, model=self.model, created=self.created,
                             logprobs=self.req.logprobs, token_text=self.token_text)

    def _chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> dict:
        entries = []
        if self.req.logprobs is not None and self.handle.logprobs is not None:
            n = len(self.handle.logprobs)
            entries, self._lp_sent = self.handle.logprobs[self._lp_sent:n], n
        lp = self._logprobs(entries) if entries else None
        if self.kind == "chat":
            delta = {"role": "assistant", "content": text or ""} if first else (
                {"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": [choice]}

    # ------------------------------------------------ streaming
    def _deltas(self) -> Iterator[str]:
        """Text deltas as the engine produces them, checking the timeout and the client between them."""
        while True:
            try:
                delta, finish = self.handle.next_delta(timeout=_POLL_S)
            except TimeoutError:
                self._check_alive()
                continue
            if delta:
                yield delta
            if finish is not None:
                return

    def sse(self) -> Iterator[bytes]:
        try:
            if self.kind == "chat":
                yield _sse(self._chunk("", first=True))
            for delta in self._deltas():
                yield _sse(self._chunk(delta))
            out = self._finish(self.handle.result(timeout=5))
            final = self._chunk(None if self.kind == "chat" else "", finish=out.finish_reason)
            final["usage"] = protocol.usage(out.prompt_tokens, len(out.token_ids))
            yield _sse(final)
            if self.req.include_usage:
                yield _sse({"id": self.id, "object": final["object"], "created": self.created,
                            "model": self.model, "choices": [], "usage": final["usage"]})
        except ClientGone:
            return
        except APIError as e:
            yield _sse(e.body())
        except Exception as e:  # noqa: BLE001 - a bug; the status line has gone out, so say it in the stream
            log.exception("stream failed", extra={"request_id": self.request_id})
            yield _sse(APIError(500, f"internal error ({type(e).__name__}); request id {self.request_id}",
                                type="server_error", code="internal_error").body())
        finally:
            self.close()
        yield b"data: [DONE]\n\n"


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
