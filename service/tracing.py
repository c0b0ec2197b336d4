"""OpenTelemetry spans per generation, exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set; otherwise nothing of OpenTelemetry is imported and every hook is a
no-op (`ortllm[tracing]` installs the packages).

One span per engine request (a choice of an HTTP request), named after the endpoint, with its phases as
children, laid out from the times the engine records on the request's handle:

    ortllm.chat  (HTTP arrival -> finished; model, adapter, token counts, finish reason, request id)
      +-- queue       engine submit -> the first step that ran the request
      +-- prefill     that step -> the first generated token
      +-- decode      the first token -> the last
      +-- detokenize  the incremental detokenizer's calls, summed, laid end to end from the first token

A W3C `traceparent` (and `tracestate`) header on the HTTP request makes the spans part of the caller's trace.
The spans are made when the request finishes (times passed explicitly), so nothing runs per token. The
exporter batches them (BatchSpanProcessor) on its own thread; `OTEL_SERVICE_NAME` names the service (default
ortllm); the SDK reads its other OTEL_* variables itself."""
from __future__ import annotations

import logging
import os
import time

from flask import Flask, current_app

log = logging.getLogger("ortllm.service")

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class Tracing:
    """The app's tracer (app.extensions["ortllm_tracing"]); built only when an OTLP endpoint is configured."""

    def __init__(self):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "ortllm"})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("ortllm.service")
        self.propagator = TraceContextTextMapPropagator()

    def record(self, kind: str, model: str, handle, out, t_arrival: float, carrier: dict[str, str],
               adapter: str | None) -> None:
        """The spans of one finished engine request. t_arrival: time.perf_counter() of the HTTP arrival; the
        handle's times are time.monotonic(); carrier: the request's traceparent / tracestate headers."""
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        now_ns, mono, perf = time.time_ns(), time.monotonic(), time.perf_counter()
        at_mono = lambda t: now_ns - int((mono - t) * 1e9)      # noqa: E731 - monotonic -> epoch ns
        at_perf = lambda t: now_ns - int((perf - t) * 1e9)      # noqa: E731
        parent = self.propagator.extract(carrier) if carrier else None
        n_out = len(out.token_ids)
        attrs = {"gen_ai.operation.name": "chat" if kind == "chat" else "text_completion",
                 "gen_ai.system": "ortllm", "gen_ai.request.model": model, "ortllm.adapter": adapter or "",
                 "gen_ai.usage.input_tokens": out.prompt_tokens, "gen_ai.usage.output_tokens": n_out,
                 "ortllm.cached_tokens": out.cached_tokens, "gen_ai.response.finish_reasons": [out.finish_reason or ""],
                 "ortllm.request_id": handle.request_id}
        root = self.tracer.start_span(f"ortllm.{kind}", context=parent, start_time=at_perf(t_arrival),
                                      attributes=attrs)
        if out.finish_reason == "error":
            root.set_status(Status(StatusCode.ERROR, out.error or "model run failed"))
        ctx = set_span_in_context(root)
        end = now_ns
        sched, first = handle.scheduled_time, handle.first_token_time
        last = handle.token_times[-1] if handle.token_times else None
        phases = [("queue", handle.submitted, sched, {}),
                  ("prefill", sched, first, {"gen_ai.usage.input_tokens": out.prompt_tokens,
                                             "ortllm.cached_tokens": out.cached_tokens}),
                  ("decode", first, last, {"gen_ai.usage.output_tokens": n_out})]
        for name, t0, t1, extra in phases:
            if t0 is not None and t1 is not None:
                s = self.tracer.start_span(name, context=ctx, start_time=at_mono(t0),
                                           attributes={"gen_ai.request.model": model, **extra})
                s.end(end_time=max(at_mono(t1), at_mono(t0)))
        busy = getattr(handle, "detok_time_s", 0.0)
        if first is not None:
            s = self.tracer.start_span("detokenize", context=ctx, start_time=at_mono(first),
                                       attributes={"gen_ai.request.model": model, "ortllm.detokenize.busy_s": busy,
                                                   "gen_ai.usage.output_tokens": n_out})
            s.end(end_time=at_mono(first) + int(busy * 1e9))
        root.end(end_time=end)

    def flush(self, timeout_s: float = 10) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


def enabled() -> bool:
    return any(os.environ.get(v) for v in ENDPOINT_VARS)


def init_app(app: Flask) -> Tracing | None:
    """Tracing for this app when an OTLP endpoint is configured, else None (and no OpenTelemetry import)."""
    if not enabled():
        app.extensions["ortllm_tracing"] = None
        return None
    try:
        tracing = Tracing()
    except ImportError as e:
        raise RuntimeError(f"OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed ({e}): "
                           "pip install 'ortllm[tracing]', or unset the variable") from None
    app.extensions["ortllm_tracing"] = tracing
    log.info("tracing on", extra={"endpoint": next(os.environ[v] for v in ENDPOINT_VARS if os.environ.get(v))})
    return tracing


def current_tracing() -> Tracing | None:
    return current_app.extensions.get("ortllm_tracing")
