"""The service's config (docs/architecture.md, Conventions): one frozen dataclass built once by `ortllm serve` or
a test, handed to `create_app`. Engine settings ride along as `engine_overrides` (EngineConfig keys; per served
model on top: `model_overrides`) and are validated by the engine itself when it loads. `RayOptions`: the Ray Serve
deployment of `ortllm serve --ray` (service/ray_serve.py)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ortllm.runtime.config import SchedulerConfig
from ortllm.runtime.errors import ConfigError


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


@dataclass(frozen=True)
class ServiceConfig:
    artifact: Path | None = None             # engine-graph artifact; None only when an Engine is handed in
    host: str = "127.0.0.1"
    port: int = 8000                         # 0: any free port (tests)
    api_key: str | None = None               # set: every route but /health, /metrics, /openapi.json, / needs it
    model_name: str | None = None            # the name clients send as `model`; None: the artifact's recipe
    # waitress worker threads = concurrent HTTP requests (streams included); None: room for every running and
    # queued sequence (max_num_seqs + max_queued) and a few more for /health and /metrics, at least 64
    http_threads: int | None = None
    max_body_bytes: int = 1 << 20            # larger request bodies get 413
    max_upload_bytes: int = 1 << 30          # POST /api/blobs (an adapter's files): larger get 413
    # Server directories whose files requests may name (pull, /v1/adapters); (): the store ($ORTLLM_HOME)
    allowed_paths: tuple = ()
    cors_origins: tuple = ()                 # origins whose pages may call the API ("*": any); (): CORS off
    request_timeout_s: float = 600.0         # a generation running longer is cancelled (504 / error chunk)
    drain_timeout_s: float = 30.0            # SIGTERM/SIGINT: in-flight requests get this long to finish
    health_error_window_s: float = 10.0      # /health says "degraded" this long after a failed model run
    load_in_background: bool = True          # create_app returns at once; /health is 503 "loading" until ready
    engine_overrides: dict = field(default_factory=dict)   # EngineConfig keys: max_queued, threads, num_blocks...
    # Several models behind one server: ((served name, artifact dir), ...); each loads on its first request.
    models: tuple = ()
    # per served model (its name or its path as given), EngineConfig keys applied over engine_overrides
    model_overrides: dict = field(default_factory=dict)
    memory_budget_bytes: int | None = None   # weights + KV pools of the loaded models; None: 80% of RAM
    keep_alive_s: float = 300.0              # with several models: unload one after this long without requests

    def __post_init__(self) -> None:
        if self.artifact is not None:
            object.__setattr__(self, "artifact", Path(self.artifact))
        object.__setattr__(self, "engine_overrides", dict(self.engine_overrides))
        object.__setattr__(self, "models", tuple((str(n), Path(p)) for n, p in self.models))
        object.__setattr__(self, "model_overrides", {str(k): dict(v) for k, v in self.model_overrides.items()})
        if self.http_threads is None:
            object.__setattr__(self, "http_threads", default_http_threads(self.engine_overrides))
        object.__setattr__(self, "allowed_paths", tuple(Path(p) for p in self.allowed_paths))
        object.__setattr__(self, "cors_origins", tuple(str(o).rstrip("/") for o in self.cors_origins))
        names = [n for n, _ in self.models]
        _check(len(set(names)) == len(names), f"served model names must differ; got {', '.join(names)}: "
               "give them store names (ortllm cp) or serve fewer")
        _check(self.memory_budget_bytes is None or (isinstance(self.memory_budget_bytes, int)
                                                    and self.memory_budget_bytes > 0),
               f"memory_budget_bytes must be a positive integer or None; got {self.memory_budget_bytes!r}")
        _check(isinstance(self.keep_alive_s, (int, float)) and self.keep_alive_s > 0,
               f"keep_alive_s must be > 0 seconds; got {self.keep_alive_s!r}")
        _check(isinstance(self.port, int) and 0 <= self.port <= 65535, f"port must be in [0, 65535]; got {self.port!r}")
        _check(isinstance(self.http_threads, int) and self.http_threads >= 1,
               f"http_threads must be a positive integer (concurrent HTTP requests); got {self.http_threads!r}")
        _check(isinstance(self.max_body_bytes, int) and self.max_body_bytes >= 1024,
               f"max_body_bytes must be an integer >= 1024; got {self.max_body_bytes!r}")
        _check(isinstance(self.max_upload_bytes, int) and self.max_upload_bytes >= 1024,
               f"max_upload_bytes must be an integer >= 1024; got {self.max_upload_bytes!r}")
        for o in self.cors_origins:
            _check(o == "*" or re.fullmatch(r"https?://[^/\s]+", o) is not None,
                   f"a CORS origin is a scheme and host as a browser sends it (http://localhost:3000) or *; got {o!r}")
        for name in ("request_timeout_s", "drain_timeout_s", "health_error_window_s"):
            v = getattr(self, name)
            _check(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0,
                   f"{name} must be a number of seconds >= 0; got {v!r}")
        _check(self.request_timeout_s > 0, "request_timeout_s must be > 0")
        _check(self.api_key is None or (isinstance(self.api_key, str) and self.api_key.strip() != ""),
               "api_key must be a non-empty string or None (no key)")
        _check(self.model_name is None or (isinstance(self.model_name, str) and self.model_name != ""),
               "model_name must be a non-empty string or None (the artifact's recipe name)")

    def overrides_for(self, name: str | None, path: Path | None) -> dict:
        """EngineConfig overrides of one served model: engine_overrides, then its own (by name or path)."""
        own = self.model_overrides.get(name or "", None)
        if own is None and path is not None:
            own = self.model_overrides.get(str(path), {})
        merged = {**self.engine_overrides, **(own or {})}
        if own and "num_blocks" in own:          # a pool pinned by the memory plan replaces a byte budget
            merged.pop("memory_budget_bytes", None)
        return merged


def default_http_threads(engine_overrides: dict) -> int:
    """Threads enough that every running and queued request holds one (so past max_queued a client gets 429, not
    a wait in the socket backlog), plus 8 for /health, /metrics and the rest; at least 64."""
    s = SchedulerConfig()
    return max(64, int(engine_overrides.get("max_num_seqs", s.max_num_seqs))
               + int(engine_overrides.get("max_queued", s.max_queued)) + 8)


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None          # an existing cluster (e.g. auto, ray://HEAD:10001); None: a local one
    replicas: int = 2                   # fixed number of engine replicas (when min/max are None)
    min_replicas: int | None = None     # autoscaling between these two
    max_replicas: int | None = None
    threads_per_replica: int = 1        # each engine's intra-op threads = the CPUs Ray reserves for it
    target_ongoing: int = 8             # autoscaling: in-flight requests per replica it aims at
    # where Serve's HTTP proxy runs: EveryNode (a load balancer in front), HeadOnly (one entry point; several
    # nodes on one machine, whose proxies would share the port)
    proxy_location: str = "EveryNode"

    def __post_init__(self) -> None:
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("give both --min-replicas and --max-replicas (autoscaling), or --replicas N")
        lo, hi = (self.min_replicas, self.max_replicas) if self.autoscaling else (self.replicas, self.replicas)
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ConfigError(f"replicas must be integers with 1 <= min <= max; got {lo}..{hi}")
        if self.proxy_location not in ("EveryNode", "HeadOnly"):
            raise ConfigError(f"proxy_location must be EveryNode or HeadOnly; got {self.proxy_location!r}")
        if not (isinstance(self.threads_per_replica, int) and self.threads_per_replica >= 1):
            raise ConfigError(f"threads_per_replica must be >= 1; got {self.threads_per_replica!r}")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None

    @property
    def most_replicas(self) -> int:
        return self.max_replicas if self.autoscaling else self.replicas
