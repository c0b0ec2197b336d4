"""The OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions (plain or SSE), /v1/models,
and /v1/adapters (load / unload LoRA adapters at run time; who may: auth.MANAGE).

One request = one engine handle per choice (n per prompt). Non-streaming handlers wait on the handles in short
slices so a client that hangs up (waitress' client_disconnected) or the per-request timeout cancels the
generation; a stream checks the client between chunks too and cancels when waitress closes it (client gone)
and in its finally. The Ollama API (ollama.py) drives the same `start` / `Call`."""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Iterator


from flask import Blueprint, Response, g, jsonify, request

from ortllm.runtime.engine import CompletionOutput, Engine, RequestHandle

from ortllm.protocol import openai as protocol
from ortllm.protocol.bodies import ADAPTER, CHAT, COMPLETION
from ortllm.protocol.generation import (logprobs_of, prepare_all, resolve_adapter, response_body_n, response_id,
                                        token_text_of, usage_of)

from .auth import require_api_key
from .body import read_json_object
from .errors import APIError, ClientGone, bad_request, model_not_found, unavailable
from .metrics import current_metrics
from .tracing import current_tracing
from .openapi import GENERATE, READ, document, json_ok, streamed
from .resources import EngineResource, current_resources
from .server_paths import server_path

log = logging.getLogger("ortllm.service")
bp = Blueprint("openai", __name__, url_prefix="/v1")
bp.before_request(require_api_key)

_POLL_S = 0.25     # how often a waiting handler checks for a hung-up client and its timeout


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
    call = start(kind, req)
    if req.stream:
        return event_stream(call.sse(), call)
    return jsonify(call.body(wait_and_close(call)))


def event_stream(events: Iterator[bytes], call: "Call") -> Response:
    """A server-sent-events response of `events` (every API that streams: chat, completions, Responses,
    Messages); the call is closed, its request cancelled if still running, when the client's connection closes."""
    resp = Response(events, mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    resp.call_on_close(call.close)
    return resp


def wait_and_close(call: "Call") -> list[CompletionOutput]:
    """A non-streamed call's outputs; the call is closed whether it finished or failed."""
    try:
        return call.wait()
    finally:
        call.close()


def start(kind: str, req: protocol.GenerationRequest) -> "Call":
    """Check and submit one request (every prompt, n each); the Call that waits for or streams it."""
    res, req.model = current_resources().route(req.model)     # which model (and adapter) answers
    res.begin()              # holds the model (no unloading) until the call closes
    handles: list[RequestHandle] = []
    try:
        engine = res.require_engine()
        prompts = prepare_all(engine, req, res.model_name, res.max_prompt_chars)
        for p, ids in enumerate(prompts):
            rid = g.request_id if p == 0 else f"{g.request_id}-p{p}"
            handles += engine.submit_n(ids, req.params, req.n, request_id=rid)
    except BaseException:
        for h in handles:
            h.cancel()
        res.end()
        raise
    return Call(kind, req, res, engine, handles, prompts, g.request_id, g.t_start,
                g.t_start + res.config.request_timeout_s, request.environ.get("waitress.client_disconnected"))


class Call:
    """One HTTP request's engine handles (choice i = handles[i]): waiting or streaming, cleanup once, metrics
    and the log line."""

    def __init__(self, kind: str, req: protocol.GenerationRequest, res: EngineResource, engine: Engine,
                 handles: list[RequestHandle], prompts: list[list[int]], request_id: str, t_arrival: float,
                 deadline: float, disconnected: Callable[[], bool] | None):
        self.kind, self.req, self.res, self.engine, self.handles = kind, req, res, engine, handles
        self.prompts = prompts
        self.request_id, self.t_arrival, self.deadline = request_id, t_arrival, deadline
        self.disconnected = disconnected or (lambda: False)
        self.metrics = current_metrics()
        self.tracing = current_tracing()               # None unless an OTLP endpoint is configured
        self.trace_carrier = {k: v for k in ("traceparent", "tracestate") if (v := request.headers.get(k))}
        self.created = int(time.time())
        self.id = response_id(kind, request_id)
        self.token_text = token_text_of(engine)
        self.model = req.params.adapter or res.model_name     # what answered: an adapter or the base model
        self._closed = False
        self._recorded: set[int] = set()
        self._lp_sent = [0] * len(handles)
        self.metrics.in_flight.inc()

    # ------------------------------------------------ waiting (non-streaming)
    def wait(self) -> list[CompletionOutput]:
        outs = []
        for i, h in enumerate(self.handles):
            while True:
                try:
                    outs.append(self._finish(i, h.result(timeout=_POLL_S)))
                    break
                except TimeoutError:
                    self.check_alive()
        return outs

    def check_alive(self) -> None:
        if time.perf_counter() > self.deadline:
            self.cancel_all()
            raise APIError(504, f"the generation did not finish within the server's request timeout "
                           f"({self.res.config.request_timeout_s:g} s); lower max_tokens", type="timeout_error",
                           code="request_timeout")
        if self.disconnected():
            self.cancel_all()
            raise ClientGone()

    def cancel_all(self) -> None:
        for h in self.handles:
            if not h.done:
                h.cancel()

    def _finish(self, i: int, out: CompletionOutput) -> CompletionOutput:
        """Record a finished output once; raise the APIError for one that failed."""
        if i not in self._recorded:
            self._recorded.add(i)
            h = self.handles[i]
            t_end = time.perf_counter()
            # handle times are time.monotonic(); convert to the perf_counter clock of t_arrival
            shift = time.perf_counter() - time.monotonic()
            first, sched = h.first_token_time, h.scheduled_time
            self.metrics.observe_finished(self.model, self.kind, out, self.t_arrival, t_end,
                                          None if first is None else first + shift, h.submitted + shift,
                                          None if sched is None else sched + shift)
            if self.tracing is not None:
                self._trace(h, out)
            log.info("generation finished", extra={
                "request_id": h.request_id, "endpoint": self.kind, "finish_reason": out.finish_reason,
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

    def _trace(self, h: RequestHandle, out: CompletionOutput) -> None:
        try:
            self.tracing.record(self.kind, self.model, h, out, self.t_arrival, self.trace_carrier,
                                self.req.params.adapter)
        except Exception as e:  # noqa: BLE001 - tracing never fails a request
            log.warning("tracing failed", extra={"request_id": h.request_id, "error": f"{type(e).__name__}: {e}"})

    def _trace_when_done(self, handles: list[RequestHandle]) -> None:
        for h in handles:
            try:
                self._trace(h, h.result(timeout=30))
            except TimeoutError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not all(h.done for h in self.handles):
            self.cancel_all()
            self.metrics.requests.labels(self.model, self.kind, "cancelled").inc()
            log.info("generation cancelled", extra={"request_id": self.request_id, "endpoint": self.kind,
                                                    "after_s": round(time.perf_counter() - self.t_arrival, 4)})
        if self.tracing is not None:
            left = [h for i, h in enumerate(self.handles) if i not in self._recorded]
            if left:      # their spans once the engine has ended them (finish_reason cancelled), off this thread
                threading.Thread(target=self._trace_when_done, args=(left,), name="ortllm-trace",
                                 daemon=True).start()
        self.metrics.in_flight.dec()
        self.res.end()

    def prompt_text(self, p: int) -> str:
        prompt = self.req.prompts[p] if self.req.prompts else self.req.prompt
        return prompt if isinstance(prompt, str) else self.engine.tokenizer.decode(prompt, skip_special_tokens=False)

    # ------------------------------------------------ bodies
    def body(self, outs: list[CompletionOutput]) -> dict:
        prompts = [(lambda p=p: self.prompt_text(p), ids) for p, ids in enumerate(self.prompts)]
        return response_body_n(self.kind, outs, self.req, request_id=self.request_id, model=self.model,
                               created=self.created, token_text=self.token_text, prompts=prompts)

    def _new_logprobs(self, i: int):
        h = self.handles[i]
        if self.req.logprobs is None or h.logprobs is None:
            return None
        n = len(h.logprobs)
        entries, self._lp_sent[i] = h.logprobs[self._lp_sent[i]:n], n
        return logprobs_of(self.kind, entries, self.req.logprobs, self.token_text) if entries else None

    def _chunk(self, i: int, delta: dict | str | None, finish: str | None = None, lp=None) -> dict:
        if self.kind == "chat":
            choice = {"index": i, "delta": delta or {}, "logprobs": lp, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": i, "text": delta or "", "logprobs": lp, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": [choice]}

    # ------------------------------------------------ streaming
    def events(self) -> Iterator[tuple[int, str, str | None]]:
        """(choice, text delta, finish_reason or None) as the engine produces them, across every choice,
        checking the timeout and the client between them."""
        open_ = list(range(len(self.handles)))
        while open_:
            got = False
            for i in list(open_):
                wait = _POLL_S if len(open_) == 1 else 0
                try:
                    delta, finish = self.handles[i].next_delta(timeout=wait)
                except TimeoutError:
                    continue
                got = True
                if finish is not None:
                    open_.remove(i)
                yield i, delta, finish
            self.check_alive()
            if not got and len(open_) > 1:
                time.sleep(0.01)

    def sse(self) -> Iterator[bytes]:
        try:
            yield from self._sse_events()
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

    def _sse_events(self) -> Iterator[bytes]:
        chat, tools = self.kind == "chat", self.req.tools
        # with tools, each reply goes through the parser the non-streamed answer uses (tool_calls.py)
        readers = [tools.reader(f"{self.request_id}_{i}") if tools else None for i in range(len(self.handles))]
        outs: list[CompletionOutput | None] = [None] * len(self.handles)
        if chat:
            for i in range(len(self.handles)):
                yield _sse(self._chunk(i, {"role": "assistant", "content": ""}))
        for i, delta, finish in self.events():
            if readers[i] is None:
                deltas = [{"content": delta} if chat else delta] if delta else []
            else:
                deltas = readers[i].feed(delta) + (readers[i].finish() if finish is not None else [])
            for d in deltas:          # a delta's logprobs go with its first chunk (held text: with the next)
                yield _sse(self._chunk(i, d, lp=self._new_logprobs(i)))
            if finish is None:
                continue
            out = outs[i] = self._finish(i, self.handles[i].result(timeout=5))
            reason = out.finish_reason if readers[i] is None else readers[i].finish_reason(out.finish_reason)
            final = self._chunk(i, None if chat else "", finish=reason, lp=self._new_logprobs(i))   # any left
            if all(o is not None for o in outs):               # the last choice to finish carries the usage
                final["usage"] = usage_of(outs, self.req.n)
            yield _sse(final)
        if self.req.include_usage:
            yield _sse({"id": self.id, "object": self._chunk(0, None)["object"], "created": self.created,
                        "model": self.model, "choices": [], "usage": usage_of(outs, self.req.n)})


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
