"""`ortllm serve --ray`: the single-process service as a Ray Serve application (docs/service-scale-out.md).

    HTTP --Serve proxy--> Ingress (1 replica, asyncio, no engine)
                            /health, /metrics: asks every engine replica, answers for all of them
                            anything else: route_hint(body) --AdapterAwareRouter--> one EngineReplica
                          EngineReplica x N (one Engine + the unchanged Flask app each)
                            the request runs through the Flask app's WSGI callable: the same parsing,
                            validation, errors, metrics and SSE bytes as `ortllm serve`

Each engine replica runs the whole request path of the single-process server, so there is no second
implementation of the API: the ingress only peeks at `model` and the prompt to pick a replica, copies bytes,
and retries a request once on another replica when its replica answered 429 (every replica is tried before
the client sees the 429) or died before any token was sent. Replicas report adapter residency and queue depth
through Serve's routing stats (`record_routing_stats`), read by the router in the ingress.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from ray import serve
from ray.exceptions import RayActorError, RayError
from ray.serve.exceptions import DeploymentUnavailableError
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .config import RayOptions, ServiceConfig
from .ray_artifacts import ArtifactRef, materialize, publish, unpublish
from .ray_routing import IMBALANCE, AffinityPolicy, ReplicaView, RouteHint, route_hint

log = logging.getLogger("ortllm.service")

APP, ENGINE, INGRESS = "ortllm", "EngineReplica", "Ingress"
STATS_PERIOD_S = 0.5            # replicas report residency and queue depth this often
FAN_OUT_TIMEOUT_S = 2.0         # /health and /metrics wait this long for each replica
HEAD_RESOURCE = "node:__internal_head__"     # Ray's resource of the head node
_END = object()


# ---------------------------------------------------------------- the engine replica

class EngineReplica:
    """One Engine behind the unchanged Flask app; requests arrive as (method, path, query, headers, body) and
    leave as a start item {status, headers, replica, pid} followed by the body's byte chunks."""

    def __init__(self, config: ServiceConfig, artifact: ArtifactRef | None = None):
        import ray

        from .app import create_app
        # this node's copy of the model: its own store, the same path, or fetched from the head by sha256
        # (ray_artifacts.py); a node that cannot get it raises here, and Serve never routes to this replica
        self.artifact_from = "path"
        if artifact is not None:
            path, self.artifact_from = materialize(artifact)
            config = replace(config, artifact=path)
        self.node = ray.get_runtime_context().get_node_id()
        self.app = create_app(replace(config, load_in_background=False))
        self.pool = self.app.extensions["ortllm"]
        self.id = serve.get_replica_context().replica_id.unique_id
        # one thread per request in flight (a stream holds one while it waits for its next token)
        self.executor = ThreadPoolExecutor(config.http_threads + 4, thread_name_prefix="ortllm-replica")
        self.locality = {"hits": 0, "requests": 0}   # adapter requests that found it resident here
        self.app.extensions["ortllm_metrics"].registry.register(_LocalityCollector(self))

    async def handle(self, hint: RouteHint, method: str, path: str, query: bytes, headers: list, body: bytes):
        from werkzeug.test import EnvironBuilder, run_wsgi_app

        self._count_locality(hint)
        gone = threading.Event()         # the ingress cancelled (client hung up): the app cancels the generation
        environ = EnvironBuilder(path=path, method=method, query_string=query, headers=headers, data=body,
                                 base_url="http://ray-serve/").get_environ()
        environ["waitress.client_disconnected"] = gone.is_set
        loop = asyncio.get_running_loop()
        app_iter = None
        try:
            app_iter, status, resp_headers = await loop.run_in_executor(self.executor, run_wsgi_app, self.app,
                                                                        environ, False)
            yield {"status": int(status.split(" ", 1)[0]), "headers": list(resp_headers.items()),
                   "replica": self.id, "pid": os.getpid(), "node": self.node, "artifact_from": self.artifact_from}
            it = iter(app_iter)
            while (chunk := await loop.run_in_executor(self.executor, next, it, _END)) is not _END:
                if chunk:
                    yield bytes(chunk)
        finally:
            gone.set()
            if app_iter is not None and hasattr(app_iter, "close"):
                self.executor.submit(app_iter.close)     # Call.close: cancels what is left, metrics, release

    def _count_locality(self, hint: RouteHint) -> None:
        engine = self.pool.engine
        if engine is None or hint.adapter is None or hint.target is not None:
            return
        if hint.adapter in engine.adapters.names():
            self.locality["requests"] += 1
            self.locality["hits"] += engine.adapters.is_resident(hint.adapter)

    def record_routing_stats(self) -> dict:
        """What the router reads (every STATS_PERIOD_S): queue depth, adapters resident, a full queue."""
        engine = self.pool.engine
        if engine is None:
            return {"queued": 0, "full": True}
        s = engine.stats()
        names = engine.adapters.names()
        return {"queued": s["running"] + s["waiting"], "full": s["waiting"] >= engine.config.scheduler.max_queued,
                "adapters": names, "resident": [a for a in names if engine.adapters.is_resident(a)],
                "model": self.pool.model_name, "pid": os.getpid()}

    def check_health(self) -> None:
        """Serve replaces a replica whose engine loop died (it would answer every request 503)."""
        engine = self.pool.engine
        if engine is None or engine.dead is not None:
            raise RuntimeError(f"engine not serving: {engine.dead if engine is not None else 'not loaded'}")

    def __del__(self):
        # Serve calls this after its graceful shutdown waited for the requests in flight (drain_timeout_s)
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.drain(0.0)
            pool.close()
            self.executor.shutdown(wait=False, cancel_futures=True)


class _LocalityCollector:
    def __init__(self, replica: EngineReplica):
        self.replica = weakref.proxy(replica)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily
        for key, doc in (("requests", "adapter requests routed to this replica"),
                         ("hits", "adapter requests that found their adapter resident on this replica")):
            c = CounterMetricFamily(f"ortllm_adapter_locality_{key}", doc)
            c.add_metric([], float(self.replica.locality[key]))
            yield c


# ---------------------------------------------------------------- the router (runs in the ingress process)

# Shared by the router and the ingress in the ingress process. Serve ships the ingress class by value, so its
# module globals are a copy: both sides reach these through _shared(), the module as imported in the process.
_ROUTERS: "weakref.WeakSet[AdapterAwareRouter]" = weakref.WeakSet()
_REPLICAS_KNOWN = threading.Event()     # set once a router of this process has been given its replicas
_ROUTED: dict[str, str] = {}       # hint key -> replica id, until the ingress has its answer


def _shared():
    import importlib
    return importlib.import_module(__name__)


class AdapterAwareRouter(RequestRouter):
    """Ray Serve's request router for the engine replicas: AffinityPolicy over the replicas' reported stats
    and this router's own in-flight counts."""

    def initialize_state(self, imbalance: int = IMBALANCE, **kwargs) -> None:
        self.policy = AffinityPolicy(imbalance)
        self.in_flight: dict[str, int] = {}
        self.request_replica: dict[str, str] = {}      # internal request id -> replica id
        self.replica_ids: list[str] = []
        self.stats: dict[str, dict] = {}
        _shared()._ROUTERS.add(self)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.replica_ids = sorted(r.replica_id.unique_id for r in replicas)
        self.policy.forget(set(self.replica_ids))
        if self.replica_ids:
            _shared()._REPLICAS_KNOWN.set()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        hint = _hint_of(pending_request)
        if pending_request is not None:
            # every replica is in the ranking: when none of them takes the request (a dead one's probe fails,
            # the others are at max_ongoing_requests), back off before asking again instead of spinning the
            # router's event loop (then the probes that would free it never complete)
            pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        views = [self._view(r) for r in candidate_replicas]
        return [[by_id[i] for i in tier] for tier in self.policy.rank(views, hint) if tier]

    def _view(self, r: RunningReplica) -> ReplicaView:
        rid = r.replica_id.unique_id
        s = r.routing_stats or {}
        self.stats[rid] = s
        return ReplicaView(rid, in_flight=self.in_flight.get(rid, 0), queued=int(s.get("queued", 0)),
                           full=bool(s.get("full", False)), adapters=frozenset(s.get("adapters", ())),
                           resident=frozenset(s.get("resident", ())), model=s.get("model"))

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        rid = replica_id.unique_id
        hint = _hint_of(pending_request)
        self.policy.routed(hint, rid)
        if hint is not None:
            _shared()._ROUTED[hint.key] = rid
        self.in_flight[rid] = self.in_flight.get(rid, 0) + 1
        self.request_replica[pending_request.metadata.internal_request_id] = rid

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        rid = self.request_replica.pop(internal_request_id, None)
        if rid is not None:
            self.in_flight[rid] = max(0, self.in_flight.get(rid, 0) - 1)


def _hint_of(pending: PendingRequest | None) -> RouteHint | None:
    if pending is None or not pending.args or not isinstance(pending.args[0], RouteHint):
        return None
    return pending.args[0]


def _own_request_context() -> None:
    """Give the next handle call its own internal request id. Calls made while serving an HTTP request inherit
    that request's id, and Ray Serve 2.60's router matches routing decisions to requests by it: two concurrent
    calls under one id (the /health fan-out, a retry) leave one never routed, its routing task spinning."""
    import dataclasses

    from ray.serve import context
    ctx = context._get_serve_request_context()
    context._serve_request_context.set(dataclasses.replace(ctx, _internal_request_id=uuid.uuid4().hex))


def _router() -> AdapterAwareRouter | None:
    return next(iter(_shared()._ROUTERS), None)


# ---------------------------------------------------------------- the ingress

class Ingress:
    """HTTP in, bytes out: routes each request to an engine replica, answers /health and /metrics for all."""

    def __init__(self, replicas, config: ServiceConfig, expected_replicas: int):
        self.replicas = replicas
        self.config = config
        self.expected = expected_replicas

    async def __call__(self, request):
        path, method = request.url.path, request.method
        if method == "GET" and path == "/health":
            return await self._health()
        if method == "GET" and path == "/metrics":
            return await self._metrics()
        if path.startswith("/v1/adapters"):
            return _error(501, "loading or unloading adapters at run time is not supported with --ray (each "
                          "replica would differ): add them to the artifact with `ortllm adapters add` and "
                          "redeploy", "not_supported_on_ray")
        body = await request.body()
        try:
            return await self._forward(method, path, request.url.query.encode(), list(request.headers.items()),
                                       body)
        except DeploymentUnavailableError:  # arrived while the application drains (SIGTERM) or redeploys
            return _error(503, "the server is stopping or redeploying and takes no new requests; retry",
                          "unavailable", retry_after=1)
        except Exception as e:      # noqa: BLE001 — the client gets the error envelope, the log the traceback
            log.exception("request failed in the ingress", extra={"path": path})
            return _error(500, f"the request failed in the ingress ({type(e).__name__}); retry, and report it if "
                          "it persists", "internal_error")

    # ------------------------------------------------ forwarding
    async def _forward(self, method, path, query, headers, body):
        from starlette.responses import Response, StreamingResponse

        key = uuid.uuid4().hex
        tried: list[str] = []
        died = 0
        while True:
            hint = route_hint(key, path, body, tuple(tried))
            _own_request_context()
            gen = self.replicas.options(stream=True).handle.remote(hint, method, path, query, headers, body)
            try:
                start, head = await asyncio.wait_for(self._start(gen), self.config.request_timeout_s + 30)
            except (RayActorError, RayError, asyncio.TimeoutError) as e:
                gen.cancel()
                rid = _shared()._ROUTED.pop(key, None)
                if died == 0 and not isinstance(e, asyncio.TimeoutError):
                    died += 1                      # nothing was sent yet: once more, on another replica
                    tried += [rid] if rid else []
                    log.warning("replica failed before answering; retrying once", extra={"replica": rid,
                                                                                         "error": repr(e)})
                    continue
                return _error(503, f"the engine replica serving this request stopped ({type(e).__name__}); "
                              "retry", "replica_failed", retry_after=1)
            _shared()._ROUTED.pop(key, None)
            if start["status"] == 429 and len(tried) + 1 < len(self._replica_ids()):
                tried.append(start["replica"])     # that replica is full: try another before answering 429
                gen.cancel()
                continue
            break
        resp_headers = {k: v for k, v in start["headers"] if k.lower() not in ("content-length", "transfer-encoding")}
        resp_headers["X-Ortllm-Replica"] = start["replica"]
        if died:
            resp_headers["X-Ortllm-Retried"] = "replica_failed"     # its first replica died before answering
        if not resp_headers.get("Content-Type", "").startswith("text/event-stream"):
            return Response(b"".join(head), status_code=start["status"], headers=resp_headers)
        return StreamingResponse(self._stream(gen, head), status_code=start["status"], headers=resp_headers)

    @staticmethod
    async def _start(gen) -> tuple[dict, list[bytes]]:
        """The replica's start item and then, for a stream, its chunks up to the first one past the chat role
        chunk; for any other response, its whole body. No byte has reached the client before this returns, so
        a replica that dies during it is retried (a replica killed between its start item and a non-streamed
        body used to surface as the proxy's bare 500)."""
        start = await gen.__anext__()
        head: list[bytes] = []
        if any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in start["headers"]):
            async for chunk in gen:
                head.append(chunk)
                if b'"delta":{"role":"assistant","content":""}' not in chunk:
                    break
        else:
            head = [c async for c in gen]
        return start, head

    async def _stream(self, gen, head: list[bytes]):
        for chunk in head:
            yield chunk
        try:
            async for chunk in gen:
                yield chunk
        except RayError as e:
            body = {"error": {"message": f"the engine replica serving this stream stopped ({type(e).__name__}); "
                              "the text above is incomplete, retry", "type": "server_error", "param": None,
                              "code": "replica_failed"}}
            yield b"data: " + json.dumps(body).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            gen.cancel()

    # ------------------------------------------------ every replica
    def _replica_ids(self) -> list[str]:
        r = _router()

        return list(r.replica_ids) if r is not None else []

    async def _ask(self, rid: str | None, path: str) -> tuple[dict, bytes] | None:
        """GET path on replica rid (None: any), through its Flask app."""
        _own_request_context()
        gen = self.replicas.options(stream=True).handle.remote(RouteHint(uuid.uuid4().hex, target=rid), "GET",
                                                                path, b"", [], b"")
        try:
            async def read():
                start = await gen.__anext__()
                return start, b"".join([c async for c in gen])
            return await asyncio.wait_for(read(), FAN_OUT_TIMEOUT_S)
        except (RayError, asyncio.TimeoutError, StopAsyncIteration):
            gen.cancel()
            return None

    async def _each(self, path: str) -> dict[str, tuple[dict, bytes] | None]:
        if not self._replica_ids():      # the router starts with the first call through the handle
            await self._ask(None, "/health")
            await asyncio.to_thread(_shared()._REPLICAS_KNOWN.wait, 2.0)     # its replicas, within 2 s
        ids = self._replica_ids()
        answers = await asyncio.gather(*(self._ask(rid, path) for rid in ids))
        return dict(zip(ids, answers))

    async def _health(self):
        from starlette.responses import JSONResponse
        answers = await self._each("/health")
        router = _router()
        replicas = []
        for rid, a in answers.items():
            reported = router.stats.get(rid, {}) if router is not None else {}
            seen = {k: reported[k] for k in ("queued", "resident") if k in reported}   # last routing stats
            if a is None:
                replicas.append({"replica": rid, "status": "unreachable", **seen})
            else:
                replicas.append({"replica": rid, "pid": a[0]["pid"], "node": a[0].get("node"),
                                 "artifact_from": a[0].get("artifact_from"), **json.loads(a[1] or b"{}"), **seen})
        message = ""
        try:
            states, message = await asyncio.wait_for(asyncio.to_thread(_replica_states), FAN_OUT_TIMEOUT_S)
        except (asyncio.TimeoutError, RayError, KeyError) as e:
            states = {"error": repr(e)}
        ok = [r for r in replicas if r.get("status") == "ok"]
        healthy = len(ok) >= self.expected and states.get("RUNNING", 0) == sum(
            v for k, v in states.items() if k != "error")
        status = "ok" if healthy and ok else "degraded" if ok else "unavailable"
        body = {"status": status, "replicas": replicas, "replica_states": states, "expected_replicas": self.expected}
        if status != "ok" and message:
            body["message"] = message          # Serve's own words: e.g. a replica that could not get the model
        return JSONResponse(body, status_code=200 if ok else 503)

    async def _metrics(self):
        from starlette.responses import Response
        answers = await self._each("/metrics")
        text = merge_metrics({rid: a[1].decode() for rid, a in answers.items() if a is not None})
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def _replica_states() -> tuple[dict, str]:
    """The engine deployment's replicas by state, and Serve's message about it (why a replica does not start)."""
    st = serve.status().applications[APP].deployments[ENGINE]
    return {str(getattr(k, "value", k)): v for k, v in st.replica_states.items()}, st.message or ""


def _error(status: int, message: str, code: str, retry_after: int | None = None):
    from starlette.responses import JSONResponse

    from ortllm.protocol.errors import APIError
    err = APIError(status, message, type="server_error" if status >= 500 else "invalid_request_error", code=code)
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return JSONResponse(err.body(), status_code=status, headers=headers)


def merge_metrics(texts: dict[str, str]) -> str:
    """Each replica's Prometheus text, every sample labelled replica="ID", one family per name."""
    from prometheus_client import Metric
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import CollectorRegistry

    merged: dict[str, Metric] = {}
    for rid, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            m = merged.get(fam.name)
            if m is None:
                m = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type)
            for s in fam.samples:
                m.add_sample(s.name, {**s.labels, "replica": rid}, s.value, s.timestamp, s.exemplar)

    class _Merged:
        def collect(self):
            return list(merged.values())
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Merged())
    return generate_latest(reg).decode()


# ---------------------------------------------------------------- building and running the application

def build_app(config: ServiceConfig, opts: RayOptions, artifact: ArtifactRef | None = None):
    """The Serve application: `opts` engine replicas (threads_per_replica each) behind one ingress on the head
    node (with the Serve controller: losing another node loses only its replicas). `artifact`: how replicas on
    other nodes get the model (ray_artifacts.publish); None: each loads config.artifact as it is."""
    from ray.serve.config import RequestRouterConfig

    config = replace(config, engine_overrides={**config.engine_overrides, "threads": opts.threads_per_replica})
    scale = ({"autoscaling_config": {"min_replicas": opts.min_replicas, "max_replicas": opts.max_replicas,
                                     "target_ongoing_requests": opts.target_ongoing}}
             if opts.autoscaling else {"num_replicas": opts.replicas})
    engines = serve.deployment(EngineReplica, name=ENGINE, **scale,
                               ray_actor_options={"num_cpus": opts.threads_per_replica},
                               max_ongoing_requests=config.http_threads,
                               graceful_shutdown_timeout_s=config.drain_timeout_s,
                               graceful_shutdown_wait_loop_s=0.5,
                               health_check_period_s=2.0, health_check_timeout_s=30.0,
                               request_router_config=RequestRouterConfig(
                                   request_router_class=f"{__name__}.AdapterAwareRouter",
                                   request_routing_stats_period_s=STATS_PERIOD_S,
                                   request_routing_stats_timeout_s=5.0)).bind(config, artifact)
    ingress = serve.deployment(Ingress, name=INGRESS, num_replicas=1,
                               ray_actor_options={"num_cpus": 0, "resources": {HEAD_RESOURCE: 0.001}},
                               max_ongoing_requests=opts.most_replicas * config.http_threads,
                               graceful_shutdown_timeout_s=config.drain_timeout_s + 5.0,
                               graceful_shutdown_wait_loop_s=0.5)
    return ingress.bind(engines, config, opts.min_replicas if opts.autoscaling else opts.replicas)


def start(config: ServiceConfig, opts: RayOptions) -> tuple[str, bool]:
    """Deploy on Ray (joining opts.address, or a local instance started here); returns (url, started_ray).
    Returns once every replica has loaded its engine."""
    import ray

    started = not ray.is_initialized()
    if started:
        if opts.address:
            ray.init(address=opts.address, log_to_driver=False)
        else:
            cpus = max(os.cpu_count() or 1, opts.most_replicas * opts.threads_per_replica)
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": config.host, "port": config.port}, proxy_location=opts.proxy_location)
    artifact = publish(config.artifact) if config.artifact is not None else None
    serve.run(build_app(config, opts, artifact), name=APP, route_prefix="/", blocking=False)
    return f"http://{config.host}:{config.port}", started


def serve_forever(config: ServiceConfig, opts: RayOptions, out=None) -> int:
    """`ortllm serve --ray`: deploy, print the URL, wait for SIGTERM/SIGINT, drain every replica, exit 0."""
    import signal
    import sys

    from ortllm.runtime.artifact import read_manifest
    out = out or sys.stdout
    stop_event = threading.Event()
    old: dict = {}
    started = False
    try:
        url, started = start(config, opts)
        # after ray.init, which installs its own SIGTERM handler (it exits without draining)
        old = {sig: signal.signal(sig, lambda *_: stop_event.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        name = config.model_name or read_manifest(config.artifact).get("recipe") or config.artifact.name
        shape = (f"{opts.min_replicas}..{opts.max_replicas}" if opts.autoscaling else str(opts.replicas))
        print(f"ortllm: serving {name} at {url} (OpenAI API at {url}/v1) on Ray Serve: {shape} replicas x "
              f"{opts.threads_per_replica} threads; Ctrl-C to stop", file=out, flush=True)
        while not stop_event.wait(0.5):
            pass
        print("ortllm: draining", file=out, flush=True)
        return 0
    finally:
        stop(started)
        for sig, h in old.items():
            signal.signal(sig, h)
        print("ortllm: stopped", file=out, flush=True)


def stop(started_ray: bool) -> None:
    """Drain: delete the application (each replica finishes its requests, up to drain_timeout_s), then Serve."""
    import ray
    try:
        serve.delete(APP, _blocking=True)
    finally:
        unpublish()
        serve.shutdown()
        if started_ray:
            ray.shutdown()
