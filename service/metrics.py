"""Prometheus metrics: request histograms observed by the handlers, engine gauges read at scrape time.

Each app has its own CollectorRegistry (several apps in one test process do not collide)."""
from __future__ import annotations

from flask import Flask, current_app
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class _EngineCollector:
    """Gauges from engine.stats(), read when /metrics is scraped."""

    def __init__(self, resources):
        self.resources = resources

    def collect(self):
        yield from self._models()
        engine = self.resources.engine
        if engine is None:
            return
        s = engine.stats()
        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value))
            return g
        yield gauge("ortllm_requests_running", "sequences in the running batch", s["running"])
        yield gauge("ortllm_requests_waiting", "requests queued for admission", s["waiting"])
        yield gauge("ortllm_kv_blocks_total", "usable KV cache blocks", s["kv_blocks_total"])
        yield gauge("ortllm_kv_blocks_in_use", "KV cache blocks held by requests",
                    s["kv_blocks_total"] - s["kv_blocks_free"])
        yield gauge("ortllm_kv_usage_ratio", "share of KV blocks in use", s["kv_usage"])
        yield gauge("ortllm_prefix_cache_hit_rate", "prompt tokens found in the prefix cache / looked up",
                    s["prefix_cache_hit_rate"])
        yield gauge("ortllm_batch_size_mean", "tokens generated per engine step since start (mean decode batch)",
                    s["tokens_generated"] / s["steps"] if s["steps"] else 0.0)
        steps = CounterMetricFamily("ortllm_engine_steps", "engine steps run")
        steps.add_metric([], float(s["steps"]))
        yield steps
        preempted = CounterMetricFamily("ortllm_preemptions", "sequences preempted when the KV pool ran out (their "
                                        "KV recomputed when they resume)")
        preempted.add_metric([], float(s["preemptions"]))
        yield preempted
        yield gauge("ortllm_engine_python_overhead_ratio", "share of step time outside session.run",
                    s["python_overhead"])
        for key, name, doc in (("spec_drafted", "ortllm_spec_draft_tokens", "speculative draft tokens verified"),
                               ("spec_accepted", "ortllm_spec_accepted_tokens", "speculative draft tokens accepted"),
                               ("forced_drafted", "ortllm_forced_draft_tokens",
                                "tokens a grammar forced, verified as drafts (structured output)"),
                               ("forced_accepted", "ortllm_forced_accepted_tokens", "forced draft tokens accepted")):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(s[key]))
            yield c
        yield gauge("ortllm_spec_acceptance_ratio", "accepted / verified draft tokens since start",
                    s["spec_acceptance_rate"])

    def _models(self):
        """Per served model: loaded or not, its reserved bytes, loads and unloads (idle / memory budget)."""
        pool = self.resources
        loaded = GaugeMetricFamily("ortllm_model_loaded", "1 if the served model is loaded", labels=["model"])
        mem = GaugeMetricFamily("ortllm_model_memory_bytes", "weights + KV pool reserved by a loaded model",
                                labels=["model"])
        loads = CounterMetricFamily("ortllm_model_loads", "times a served model was loaded", labels=["model"])
        unloads = CounterMetricFamily("ortllm_model_unloads", "times a served model was unloaded, by reason",
                                      labels=["model", "reason"])
        for m in pool.models:
            loaded.add_metric([m.model_name or "model"], 1.0 if m.engine is not None else 0.0)
            mem.add_metric([m.model_name or "model"], float(pool.manager.bytes_of(m.model_name)))
            loads.add_metric([m.model_name or "model"], float(m.loads))
            for reason, n in m.unloads.items():
                unloads.add_metric([m.model_name or "model", reason], float(n))
        yield from (loaded, mem, loads, unloads)


class Metrics:
    def __init__(self, resources):
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram("ortllm_time_to_first_token_seconds", "HTTP arrival to first generated token",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("ortllm_inter_token_latency_seconds", "time between generated tokens",
                             buckets=_ITL, registry=r)
        self.e2e = Histogram("ortllm_e2e_request_latency_seconds", "HTTP arrival to the last token",
                             buckets=_LATENCY, registry=r)
        self.queue = Histogram("ortllm_request_queue_time_seconds",
                               "engine submit to the first step that ran the request", buckets=_LATENCY,
                               registry=r)
        self.prompt_tokens = Counter("ortllm_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("ortllm_generation_tokens", "tokens generated", registry=r)
        self.requests = Counter("ortllm_requests", "generation requests by model, endpoint and outcome",
                                ["model", "endpoint", "finish_reason"], registry=r)
        self.http = Counter("ortllm_http_requests", "HTTP responses by endpoint and status",
                            ["endpoint", "status"], registry=r)
        self.in_flight = Gauge("ortllm_http_generations_in_flight", "generation requests being served",
                               registry=r)
        r.register(_EngineCollector(resources))

    def observe_finished(self, model: str, endpoint: str, out, t_arrival: float, t_end: float,
                         first_token: float | None, submitted: float, scheduled: float | None = None) -> None:
        self.requests.labels(model, endpoint, out.finish_reason or "none").inc()
        self.prompt_tokens.inc(out.prompt_tokens)
        n = len(out.token_ids)
        self.generation_tokens.inc(n)
        self.e2e.observe(t_end - t_arrival)
        if scheduled is not None:
            self.queue.observe(max(0.0, scheduled - submitted))
        if first_token is not None:
            self.ttft.observe(first_token - t_arrival)
            if n > 1:
                gap = (t_end - first_token) / (n - 1)
                for _ in range(min(n - 1, 256)):
                    self.itl.observe(gap)


def init_app(app: Flask, resources) -> Metrics:
    m = Metrics(resources)
    app.extensions["ortllm_metrics"] = m
    return m


def current_metrics() -> Metrics:
    return current_app.extensions["ortllm_metrics"]
