"""One request's life in the service, from admission to its last byte, for every API that drives the engine.

    answer(kind, req, renderer)           the whole exchange: start, then respond
    start(kind, req) / start_embed(...)   checks, then submits every prompt (n each) or input: a Call
    Call.respond(renderer)                not streamed: wait, then the renderer's JSON body
                                          streamed: the renderer's bytes as the engine's deltas arrive
    while waiting                         one queue for the call: every handle delivers its deltas into it
                                          (RequestHandle.deliver_to); between them, and at least every _POLL_S,
                                          the request's timeout (504, or an error in the stream) and the client
                                          (ClientWatch): one that left has its requests cancelled
    Call.close()                          once, however the request ends: what still runs is cancelled, the model
                                          released, metrics, the log line and the spans written
    error_response(e)                     the one error handler: any exception as its status and the API's
                                          error envelope (before the status line is out; after, the renderer's
                                          stream_error)

An API is a Renderer (ortllm.protocol.rendering): the engine's events in, its wire format out, no Flask. The
routes (api.py, messages.py, responses.py, ollama.py, embeddings.py) parse the body and call answer().
"""
from __future__ import annotations

import logging
import queue
import select
import threading
import time
from typing import Callable, Iterator

from flask import Blueprint, Response, g, jsonify, request

from ortllm.protocol import openai as protocol
from ortllm.protocol.embeddings import EmbeddingRequest, prepare_inputs
from ortllm.protocol.generation import Submission, prepare, token_text_of
from ortllm.protocol.rendering import Generation, Renderer
from ortllm.runtime.engine import CompletionOutput, Engine, RequestHandle

from .errors import APIError, ClientGone, to_api_error, unavailable
from .metrics import current_metrics
from .resources import EngineResource, current_resources
from .tracing import current_tracing

log = logging.getLogger("ortllm.service")

_POLL_S = 0.1      # how often a waiting request checks its client and its timeout (a client that left: cancelled
                   # within this, plus the engine step in progress)
EMBEDDINGS = ("embeddings", "ollama_embed", "ollama_embeddings")      # the kinds that pool, not generate


# ---------------------------------------------------------------- the client

_HANGUP = getattr(select, "POLLRDHUP", 0) | getattr(select, "POLLHUP", 0) | getattr(select, "POLLERR", 0)


class ClientWatch:
    """Whether the HTTP client has left, known without waiting for other traffic: the server's own flag
    (waitress' environ["waitress.client_disconnected"]; the Ray proxy sets one too), and the connection's socket
    polled for a hang-up (POLLRDHUP: the client closed its side; POLLHUP / POLLERR: reset). waitress learns of a
    hang-up only when its event loop reads the socket; the poll sees it at once, whatever else the server does."""

    def __init__(self, environ: dict):
        self._flag: Callable[[], bool] | None = environ.get("waitress.client_disconnected")
        channel = getattr(self._flag, "__self__", None)          # waitress' HTTPChannel: its socket
        self._sock = getattr(channel, "socket", None) if hasattr(select, "poll") else None

    def gone(self) -> bool:
        if self._flag is not None and self._flag():
            return True
        if self._sock is None:
            return False
        try:
            fd = self._sock.fileno()          # -1 once waitress has closed it
            if fd < 0:
                return True
            p = select.poll()
            p.register(fd, _HANGUP)
            return bool(p.poll(0))
        except (OSError, ValueError):
            return True


# ---------------------------------------------------------------- admission

Route = tuple[EngineResource, "str | None"]      # the served model, and the name within it (ServedModels.route)


def start(kind: str, req: protocol.GenerationRequest, route: Route | None = None) -> "Call":
    """Submit one generation request (every prompt, n each); the Call that waits for or streams it. route: the
    model the route already chose for req.model (Ollama's, for a created model's defaults); None: chosen here."""
    res, model = route or current_resources().route(req.model)     # which model (and adapter) answers

    def submit(engine: Engine, handles: list[RequestHandle]) -> Submission:
        sub = prepare(engine, req, res.model_name, model, several=True)
        for p, ids in enumerate(sub.prompts):
            rid = g.request_id if p == 0 else f"{g.request_id}-p{p}"
            handles += engine.submit_n(ids, sub.params, req.n, request_id=rid)
        return sub

    engine, handles, sub = _admit(res, submit)

    def prompt_text(p: int) -> str:
        prompt = req.prompts[p] if req.prompts else req.prompt
        return prompt if isinstance(prompt, str) else engine.tokenizer.decode(prompt, skip_special_tokens=False)

    gen = Generation(req, g.request_id, sub.params.adapter or res.model_name, int(time.time()), handles,
                     sub.prompts, g.t_start, token_text_of(engine), prompt_text, engine.tokenizer.harmony)
    return Call(kind, res, gen, stream=req.stream)


def start_embed(kind: str, req: EmbeddingRequest) -> "Call":
    """Check and submit one embeddings request (each input one engine request); the Call that waits for it."""
    res, req.model = current_resources().route(req.model)

    def submit(engine: Engine, handles: list[RequestHandle]) -> str | None:
        adapter, ids = prepare_inputs(engine, req, res.model_name)
        for i, x in enumerate(ids):
            rid = g.request_id if i == 0 else f"{g.request_id}-e{i}"
            handles.append(engine.submit_embed(x, req.pooling, adapter, request_id=rid))
        return adapter

    _, handles, adapter = _admit(res, submit)
    gen = Generation(req, g.request_id, adapter or res.model_name, int(time.time()), handles, [], g.t_start,
                     str, str)
    return Call(kind, res, gen)


def _admit(res: EngineResource, submit: Callable[[Engine, list[RequestHandle]], object]):
    """(the engine, the handles submit(engine, handles) queued, what it returned); the model is held until the
    call closes. If submit fails, what it queued is cancelled and the model released."""
    res.begin()              # holds the model (no unloading) until the call closes
    handles: list[RequestHandle] = []
    try:
        engine = res.require_engine()
        out = submit(engine, handles)
    except BaseException:
        for h in handles:
            h.cancel()
        res.end()
        raise
    return engine, handles, out


def answer(kind: str, req, renderer: Callable[[Generation], Renderer], route: Route | None = None) -> Response:
    """Start one request (a generation, or embeddings for the EMBEDDINGS kinds) and answer it with
    renderer(its Generation): the whole HTTP exchange. route: a generation's model, if the caller chose it."""
    call = start_embed(kind, req) if kind in EMBEDDINGS else start(kind, req, route)
    try:
        r = renderer(call.gen)
    except BaseException:
        call.close()
        raise
    return call.respond(r)


# ---------------------------------------------------------------- one request

class Call:
    """One HTTP request's engine handles (choice or input i = handles[i]): waiting or streaming them, cleanup
    once, metrics, the log line and the spans."""

    def __init__(self, kind: str, res: EngineResource, gen: Generation, stream: bool = False):
        self.kind, self.res, self.gen, self.stream = kind, res, gen, stream
        self.handles, self.request_id, self.model = gen.handles, gen.request_id, gen.model
        self.t_arrival = gen.t_arrival
        self.deadline = gen.t_arrival + res.config.request_timeout_s
        self.client = ClientWatch(request.environ)
        self.metrics = current_metrics()
        self.tracing = current_tracing() if kind not in EMBEDDINGS else None   # None: no OTLP endpoint
        self.trace_carrier = {k: v for k in ("traceparent", "tracestate") if (v := request.headers.get(k))}
        self._closed = False
        self._recorded: set[int] = set()
        self._generates = kind not in EMBEDDINGS
        if self._generates:
            self.metrics.in_flight.inc()
        self._deltas: queue.Queue = queue.Queue()       # (choice i, Delta) from every handle of the call
        for i, h in enumerate(self.handles):
            h.deliver_to(self._deltas, i)
        self._checked = time.perf_counter()             # the last check_alive

    # ------------------------------------------------ answering
    def respond(self, renderer: Renderer) -> Response:
        """The HTTP response: the renderer's stream (the call closes when the connection does), or its body."""
        if self.stream:
            resp = Response(self.render_stream(renderer), mimetype=renderer.media_type,
                            headers=renderer.stream_headers)
            resp.call_on_close(self.close)
            return resp
        return jsonify(renderer.body(self.wait_and_close()))

    def wait_and_close(self) -> list[CompletionOutput]:
        """Every output, in order; the call is closed whether they finished or failed."""
        try:
            return self.wait()
        finally:
            self.close()

    def wait(self) -> list[CompletionOutput]:
        outs: list = [None] * len(self.handles)
        for i, _, finish in self.events():      # the text is in the outputs: the deltas only say when each ends
            if finish is not None:
                outs[i] = self._outcome(i, self.handles[i].result(timeout=5))
        if not self._generates:
            self._record_embeddings(outs)
        return outs

    def render_stream(self, r: Renderer) -> Iterator[bytes]:
        """The renderer's bytes, the engine's deltas as they come; an error once the status line is out is said in
        the stream; a client that left gets nothing more."""
        try:
            yield from r.opening()
            outs: list[CompletionOutput | None] = [None] * len(self.handles)
            for i, delta, finish in self.events():
                yield from r.delta(i, delta, finish is not None)
                if finish is not None:
                    outs[i] = self._outcome(i, self.handles[i].result(timeout=5))
                    yield from r.finished(i, outs[i], outs)
            yield from r.closing(outs)
        except ClientGone:
            return
        except APIError as e:
            yield r.stream_error(e)
        except Exception as e:  # noqa: BLE001 - a bug; the status line has gone out, so say it in the stream
            log.exception("stream failed", extra={"request_id": self.request_id})
            yield r.stream_error(internal_error(e, self.request_id))
        finally:
            self.close()
        yield from r.trailer()

    def events(self) -> Iterator[tuple[int, str, str | None]]:
        """(choice, text delta, finish_reason or None) as the engine produces them, across every choice, from the
        call's one queue; the timeout and the client are checked at least every _POLL_S, deltas or none."""
        left = len(self.handles)
        while left:
            try:
                i, d = self._deltas.get(timeout=_POLL_S)
            except queue.Empty:
                self.check_alive()
                continue
            left -= d.finish_reason is not None
            yield i, d.text, d.finish_reason
            if time.perf_counter() - self._checked >= _POLL_S:
                self.check_alive()

    # ------------------------------------------------ ending
    def check_alive(self) -> None:
        self._checked = time.perf_counter()
        if self._checked > self.deadline:
            self.cancel_all()
            what, lower = (("the generation", "lower max_tokens") if self._generates
                           else ("the embeddings", "send fewer inputs"))
            raise APIError(504, f"{what} did not finish within the server's request timeout "
                           f"({self.res.config.request_timeout_s:g} s); {lower}", type="timeout_error",
                           code="request_timeout")
        if self.client.gone():
            self.cancel_all()
            raise ClientGone()

    def cancel_all(self) -> None:
        for h in self.handles:
            if not h.done:
                h.cancel()

    def _outcome(self, i: int, out: CompletionOutput) -> CompletionOutput:
        """Record a finished output once; raise the APIError for one that failed."""
        if i not in self._recorded and self._generates:
            self._recorded.add(i)
            self._record(self.handles[i], out)
        if out.finish_reason == "error":
            raise unavailable(f"the model run for this request failed ({out.error}); retry", "model_run_failed")
        if out.finish_reason == "deadline":
            raise unavailable("the request waited too long in the queue; retry later", "queue_timeout")
        if out.finish_reason == "cancelled":
            raise unavailable("the request was cancelled by the server; retry", "cancelled")
        if not self._generates and out.embedding is None:
            raise unavailable(f"the model run for this request failed ({out.error}); retry", "model_run_failed")
        return out

    def _record(self, h: RequestHandle, out: CompletionOutput) -> None:
        """A finished generation's metrics, spans and log line."""
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
            "stream": self.stream, "duration_s": round(t_end - self.t_arrival, 4),
            **({"error": out.error} if out.error else {})})

    def _record_embeddings(self, outs: list[CompletionOutput]) -> None:
        tokens = sum(o.prompt_tokens for o in outs)
        self.metrics.requests.labels(self.model, self.kind, "stop").inc()
        self.metrics.prompt_tokens.inc(tokens)
        log.info("embeddings finished", extra={"request_id": self.request_id, "endpoint": self.kind,
                                               "inputs": len(outs), "prompt_tokens": tokens,
                                               "duration_s": round(time.perf_counter() - self.t_arrival, 4)})

    def _trace(self, h: RequestHandle, out: CompletionOutput) -> None:
        try:
            self.tracing.record(self.kind, self.model, h, out, self.t_arrival, self.trace_carrier,
                                h.params.adapter)
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
        if self._generates:
            self.metrics.in_flight.dec()
        self.res.end()


# ---------------------------------------------------------------- errors

_ENVELOPES: dict[str, Callable[[APIError, str | None], dict]] = {}     # blueprint -> its API's error envelope


def speaks(bp: Blueprint, renderer: type[Renderer]) -> None:
    """The routes of bp answer errors in renderer's envelope (default: OpenAI's)."""
    _ENVELOPES[bp.name] = renderer.error_body


def internal_error(e: BaseException, request_id: str | None) -> APIError:
    return APIError(500, f"internal error ({type(e).__name__}); report request id {request_id}",
                    type="server_error", code="internal_error")


def error_response(e: Exception) -> Response:
    """The service's one error handler: e as its status and the route's API's error envelope (an unexpected
    exception is a bug: a logged 500)."""
    err = to_api_error(e)
    if err is None:
        log.exception("unhandled error", extra={"path": request.path})
        err = internal_error(e, g.get("request_id"))
    elif err.status >= 500:
        log.warning("request failed", extra={"status": err.status, "code": err.code, "error": err.message})
    envelope = _ENVELOPES.get(request.blueprint or "", Renderer.error_body)
    resp = jsonify(envelope(err, g.get("request_id")))
    resp.status_code = err.status
    resp.headers.update(err.headers)
    return resp
