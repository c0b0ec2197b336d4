"""The engines as app resources. `ModelPool` (app.extensions["ortllm"], `current_resources()`) holds one
`EngineResource` per served model and routes a request's `model` to it; with one model everything is as it
was: loaded in init_app (in the background by default), health, draining, requests in flight.

With several models (`ortllm serve A B ...`) a model loads on its first request, through the pool's
SessionManager (one memory budget; least recently used models that no request holds are unloaded to make
room), and is unloaded after `keep_alive_s` without requests. A request holds its model from before it looks
up the engine until its response is closed (`begin()` ... `end()`), so a model never goes under a request."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from flask import Flask, current_app

from ortllm.runtime.artifact_editor import read_defaults
from ortllm.runtime.engine import Engine
from ortllm.runtime.errors import OrtllmError
from ortllm.runtime.session_manager import MemoryBudgetExceeded, SessionManager


from .config import ServiceConfig
from .errors import APIError, model_not_found, unavailable

log = logging.getLogger("ortllm.service")


class EngineResource:
    """One served model. `path`/`name` default to the config's single artifact; `pool` (several models) loads
    it on first use through the pool's SessionManager and lets the pool unload it when no request holds it."""

    def __init__(self, config: ServiceConfig, engine: Engine | None = None, path: Path | None = None,
                 name: str | None = None, pool: "ModelPool | None" = None):
        self.config = config
        self.path = path if path is not None else config.artifact
        self.pool = pool
        self.engine: Engine | None = engine
        self.load_error: BaseException | None = None
        self.model_name = name or config.model_name
        self.last_used = time.monotonic()
        self.loads = 0
        self.unloads: dict[str, int] = {"idle": 0, "memory": 0}
        self._load_lock = threading.Lock()
        self.created = int(time.time())
        self.draining = False
        self._owns_engine = engine is None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self.ready = threading.Event()
        # a model made by POST /api/create: its defaults (system, parameters, template, adapter), else {}
        self.modelfile = read_defaults(self.path if engine is None else engine.artifact.path)
        if engine is not None:
            self._on_loaded(engine)

    # ---------------------------------------------------------------- loading
    def load(self, background: bool) -> None:
        if self.engine is not None:
            return
        if self.path is None:
            raise ValueError("ServiceConfig.artifact is required unless an Engine is handed to create_app")
        if background:
            threading.Thread(target=self._load, name="ortllm-load", daemon=True).start()
        else:
            self._load()
            if self.load_error is not None:
                raise self.load_error

    def _load(self) -> None:
        try:
            self._load_engine()
        except BaseException as e:  # noqa: BLE001 - reported by /health and re-raised by a foreground load
            self.load_error = e
            log.error("engine failed to load", extra={"artifact": str(self.path), "error": str(e)})
            self.ready.set()

    def _load_engine(self) -> Engine:
        t0 = time.perf_counter()
        if self.pool is not None:
            engine = self.pool.manager.load(self.model_name, self.path, evict=self.pool.evict,
                                            **self.config.overrides_for(self.model_name, self.path))
        else:
            engine = Engine.from_artifact(self.path, **self.config.overrides_for(self.model_name, self.path))
        self.loads += 1
        self._on_loaded(engine)
        log.info("engine ready", extra={"artifact": str(self.path), "model": self.model_name,
                                        "load_s": round(time.perf_counter() - t0, 3)})
        if self.pool is not None:
            self.pool.changed()
        return engine

    def _load_on_demand(self) -> Engine:
        """First request to an unloaded model of a pool: load it now (once, whoever asks at the same time)."""
        with self._load_lock:
            if self.engine is not None:
                return self.engine
            try:
                return self._load_engine()
            except MemoryBudgetExceeded as e:
                raise unavailable(f"model {self.model_name} cannot be loaded now: {e}", "memory_budget",
                                  retry_after=5) from None
            except OrtllmError as e:
                raise unavailable(f"model {self.model_name} failed to load: {e}", "load_failed",
                                  retry_after=60) from None

    def detach_if_idle(self) -> Engine | None:
        """The engine, taken away, if no request holds it (the pool then unloads it); else None."""
        with self._lock:
            if self._in_flight or self.engine is None or self._owns_engine is False:
                return None
            engine, self.engine = self.engine, None
            return engine

    def adapter_names(self) -> list[str]:
        if self.engine is not None:
            return self.engine.adapters.names()
        from ortllm.runtime.artifact import read_manifest
        try:
            return sorted(read_manifest(self.path).adapters)
        except OrtllmError:
            return []

    def _on_loaded(self, engine: Engine) -> None:
        self.model_name = (self.model_name or engine.artifact.manifest.recipe
                           or engine.artifact.path.name)
        engine.input.max_prompt_chars          # computed now (a pass over the vocabulary), not on a first request
        self.engine = engine
        self.ready.set()

    def require_engine(self) -> Engine:
        """The engine, or a 503 APIError saying why there is none to use."""
        if self.draining:
            raise unavailable("the server is shutting down; retry on another instance", "draining", retry_after=5)
        if self.load_error is not None:
            raise unavailable(f"the model failed to load: {self.load_error}", "load_failed", retry_after=60)
        if self.engine is None:
            if self.pool is not None and self.pool.lazy:
                return self._load_on_demand()
            raise unavailable("the model is still loading; retry shortly", "loading", retry_after=2)
        return self.engine

    # ---------------------------------------------------------------- health
    def health(self) -> tuple[int, dict]:
        if self.load_error is not None:
            return 503, {"status": "failed", "error": str(self.load_error)}
        if self.engine is None:
            return 503, {"status": "loading"}
        if self.engine.dead is not None:
            return 503, {"status": "dead", "error": f"{type(self.engine.dead).__name__}: {self.engine.dead}"}
        if self.draining:
            return 503, {"status": "draining", "in_flight": self.in_flight}
        window = self.config.health_error_window_s
        stats = self.engine.stats()
        age = stats["last_step_error_age_s"]
        if age is not None and age <= window:    # a model run failed recently
            return 503, {"status": "degraded", "failed_steps": stats["failed_steps"],
                         "last_error": stats["last_step_error"], "window_s": window}
        return 200, {"status": "ok", "model": self.model_name, "limits": engine_limits(self.engine)}

    # ---------------------------------------------------------------- in flight / draining
    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.last_used = time.monotonic()
        if self.pool is not None:
            self.pool.manager.touch(self.model_name)

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self.last_used = time.monotonic()
            if self._in_flight == 0:
                self._idle.notify_all()
        if self.pool is not None:
            self.pool.manager.touch(self.model_name)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def drain(self, timeout: float) -> bool:
        """Refuse new work (503) and wait up to timeout for in-flight requests; True if they all finished."""
        self.draining = True
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._in_flight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        if self._owns_engine and self.engine is not None:
            self.engine.close()


class ModelPool:
    """Every served model by name, one memory budget, routing of `model`, idle unloading, `ortllm ps` state.

    Single-model servers (config.artifact, or an Engine handed in) keep the old behaviour: the model loads at
    start and stays. The properties below that name one model (engine, model_name, require_engine, ...) are
    the first model's: /tokenize, /openapi.json and the engine gauges of /metrics use them."""

    def __init__(self, config: ServiceConfig, engine: Engine | None = None):
        self.config = config
        self.created = int(time.time())
        self.lazy = len(config.models) > 1
        budget = config.memory_budget_bytes or default_memory_budget()
        self.manager = SessionManager(budget)
        if engine is not None or not config.models:
            self.models = [EngineResource(config, engine)]
        else:
            self.models = [EngineResource(config, path=Path(path), name=name, pool=self)
                           for name, path in config.models]
        self.by_name = {m.model_name: m for m in self.models if m.model_name}
        self._state_file = None
        self._loaded_on_demand = threading.Event()     # several models: ready at once, each loads when asked
        self._loaded_on_demand.set()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._changing = threading.Lock()             # add_model / remove_model

    # ---------------------------------------------------------------- one model's view (the first)
    @property
    def default(self) -> EngineResource:
        return self.models[0]

    engine = property(lambda self: self.default.engine)
    model_name = property(lambda self: self.default.model_name if not self.lazy else
                          ", ".join(m.model_name for m in self.models))
    load_error = property(lambda self: None if self.lazy else self.default.load_error)
    ready = property(lambda self: self._loaded_on_demand if self.lazy else self.default.ready)

    def require_engine(self) -> Engine:
        return self.default.require_engine()

    # ---------------------------------------------------------------- routing
    def route(self, model: str | None) -> tuple[EngineResource, str | None]:
        """`model` -> (the served model, the name within it: its own name or one of its adapters).

        Accepted: a served model's name; an adapter's name when one model has it; MODEL:ADAPTER. None: the
        first model. Anything else is a 404 naming what is served."""
        if not self.lazy or model is None:
            res = self.default
            if model in (None, res.model_name) and res.modelfile.get("adapter"):
                return res, res.modelfile["adapter"]         # a created model's requests: its adapter
            return res, model
        if model in self.by_name:
            res = self.by_name[model]
            return res, res.modelfile.get("adapter") or res.model_name
        base, _, adapter = model.rpartition(":")
        if base in self.by_name and adapter in self.by_name[base].adapter_names():
            return self.by_name[base], adapter
        owners = [m for m in self.models if model in m.adapter_names()]
        if len(owners) == 1:
            return owners[0], model
        if len(owners) > 1:
            names = ", ".join(m.model_name for m in owners)
            raise APIError(400, f"adapter {model!r} exists in several models ({names}); "
                           f"send model as MODEL:ADAPTER, e.g. {owners[0].model_name}:{model}", param="model",
                           code="ambiguous_model")
        served = [n for m in self.models for n in (m.model_name, *(f"{m.model_name}:{a}" for a in m.adapter_names()))]
        raise model_not_found(model, served[0], served[1:])

    # ---------------------------------------------------------------- models added and removed while serving
    def add_model(self, name: str, path: Path, aliases: tuple[str, ...] = ()) -> EngineResource:
        """Serve a store model from now on (POST /api/pull, /api/create): it loads on its first request, as
        the models of `ortllm serve A B ...` do; `aliases`: other names that route to it (NAME for NAME:latest).
        A model of that name already served is replaced when no request holds it (else 409)."""
        with self._changing:
            old = self.by_name.get(name)
            if old is not None:
                self._drop(old)
            res = EngineResource(self.config, path=Path(path), name=name, pool=self)
            self.models.append(res)
            for n in (name, *aliases):
                self.by_name.setdefault(n, res)
            if not self.lazy:           # one model so far: route by name from now on, unload idle models
                self.lazy = True
                self._reaper = threading.Thread(target=self._reap, name="ortllm-model-reaper", daemon=True)
                self._reaper.start()
        self.changed()
        return res

    def remove_model(self, name: str) -> None:
        """Stop serving a model added by add_model (DELETE /api/delete); 409 while a request holds it."""
        with self._changing:
            res = self.by_name.get(name)
            if res is not None:
                self._drop(res)
        self.changed()

    def _drop(self, res: EngineResource) -> None:
        if res is self.default or res.pool is None:
            raise APIError(409, f"{res.model_name} is the model this server was started with; stop the server "
                           "first", param="model", code="model_in_use")
        if res.engine is not None:
            if res.detach_if_idle() is None:
                raise APIError(409, f"{res.model_name} is answering requests; retry when they are done",
                               param="model", code="model_in_use")
            self.manager.unload(res.model_name)
        self.models.remove(res)
        for n in [n for n, r in self.by_name.items() if r is res]:
            del self.by_name[n]

    # ---------------------------------------------------------------- loading and unloading
    def load(self, background: bool) -> None:
        if not self.lazy:
            self.default.load(background)
        else:
            self._reaper = threading.Thread(target=self._reap, name="ortllm-model-reaper", daemon=True)
            self._reaper.start()

    def evict(self, name: str) -> bool:
        """SessionManager's question before it unloads `name` to make room: yes if no request holds it."""
        res = self.by_name.get(name)
        if res is None or res.detach_if_idle() is None:
            return False
        res.unloads["memory"] += 1
        log.info("model unloaded", extra={"model": name, "reason": "memory budget"})
        self.changed()
        return True

    def _reap(self) -> None:
        keep = self.config.keep_alive_s
        while not self._stop.wait(min(max(keep / 4, 0.05), 5.0)):
            for name in self.manager.idle(keep):
                res = self.by_name.get(name)
                if res is not None and res.detach_if_idle() is not None:
                    self.manager.unload(name)
                    res.unloads["idle"] += 1
                    log.info("model unloaded", extra={"model": name, "reason": f"idle {keep:g} s"})
                    self.changed()

    # ---------------------------------------------------------------- aggregate state
    def health(self) -> tuple[int, dict]:
        if not self.lazy:
            return self.default.health()
        if self.draining:
            return 503, {"status": "draining", "in_flight": self.in_flight}
        return 200, {"status": "ok", "models": {m.model_name: "loaded" if m.engine is not None else "not loaded"
                                                for m in self.models},
                     "limits": {m.model_name: engine_limits(m.engine) for m in self.models if m.engine is not None}}

    @property
    def draining(self) -> bool:
        return any(m.draining for m in self.models)

    @property
    def in_flight(self) -> int:
        return sum(m.in_flight for m in self.models)

    def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for m in self.models:
            m.draining = True
        return all(m.drain(max(0.0, deadline - time.monotonic())) for m in self.models)

    def close(self) -> None:
        self._stop.set()
        for m in self.models:
            if m.pool is None:
                m.close()
        self.manager.close()
        self.unregister()

    # ---------------------------------------------------------------- `ortllm ps`
    def state(self) -> dict:
        return {"url": getattr(self, "url", None), "started": self.created, "models": [
            {"name": m.model_name, "path": str(m.path), "loaded": m.engine is not None,
             "bytes": self.manager.bytes_of(m.model_name) if m.pool else 0, "in_flight": m.in_flight,
             "last_used": time.time() - (time.monotonic() - m.last_used)} for m in self.models]}

    def register(self, url: str) -> None:
        """Say in $ORTLLM_HOME/servers what this server holds (for `ortllm ps`, and `ortllm rm` refusals)."""
        from ortllm.runtime.store import Store
        self.url = url
        try:
            self._state_file = Store().register_server(self.state())
        except OSError as e:
            log.warning("cannot write server state for `ortllm ps`", extra={"error": str(e)})

    def changed(self) -> None:
        if self._state_file is not None:
            self.register(self.url)

    def unregister(self) -> None:
        if self._state_file is not None:
            from ortllm.runtime.store import Store
            Store().unregister_server()
            self._state_file = None


def engine_limits(engine: Engine) -> dict:
    """What one engine accepts: the longest sequence (prompt + generated), sequences running at once, tokens per
    step, requests waiting before 429, and its KV pool (/v1/models, /health; `ortllm serve` sizes them)."""
    s = engine.config.scheduler
    stats = engine.stats()
    return {"max_model_len": engine.limits.room,
            "max_num_seqs": s.max_num_seqs, "max_queued": s.max_queued, "max_batch_tokens": s.max_batch_tokens,
            "kv_cache_tokens": (stats["kv_blocks_total"]) * engine.config.cache.block_size,
            "kv_cache_bytes": stats["kv_pool_bytes"]}


def default_memory_budget() -> int:
    """80% of physical memory: the engines' weights and KV pools (SessionManager's estimate) share it."""
    try:
        return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 8 << 30


def init_app(app: Flask, config: ServiceConfig, engine: Engine | None = None) -> ModelPool:
    pool = ModelPool(config, engine)
    app.extensions["ortllm"] = pool
    pool.load(background=config.load_in_background)
    return pool


def current_resources() -> ModelPool:
    return current_app.extensions["ortllm"]
