"""The engine as an app resource: loaded in init_app (in the background by default), health, draining and the
count of requests in flight. Handlers reach it with `current_resources()`."""
from __future__ import annotations

import logging
import threading
import time

from flask import Flask, current_app

from ortllm.runtime.engine import Engine

from ortllm.protocol.generation import max_prompt_chars

from .config import ServiceConfig
from .errors import unavailable

log = logging.getLogger("ortllm.service")


class EngineResource:
    def __init__(self, config: ServiceConfig, engine: Engine | None = None):
        self.config = config
        self.engine: Engine | None = engine
        self.load_error: BaseException | None = None
        self.model_name = config.model_name
        self.max_prompt_chars = 0
        self.created = int(time.time())
        self.draining = False
        self._owns_engine = engine is None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)
        self.ready = threading.Event()
        if engine is not None:
            self._on_loaded(engine)

    # ---------------------------------------------------------------- loading
    def load(self, background: bool) -> None:
        if self.engine is not None:
            return
        if self.config.artifact is None:
            raise ValueError("ServiceConfig.artifact is required unless an Engine is handed to create_app")
        if background:
            threading.Thread(target=self._load, name="ortllm-load", daemon=True).start()
        else:
            self._load()
            if self.load_error is not None:
                raise self.load_error

    def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            engine = Engine.from_artifact(self.config.artifact, **self.config.engine_overrides)
        except BaseException as e:  # noqa: BLE001 - reported by /health and re-raised by a foreground load
            self.load_error = e
            log.error("engine failed to load", extra={"artifact": str(self.config.artifact), "error": str(e)})
            self.ready.set()
            return
        self._on_loaded(engine)
        log.info("engine ready", extra={"artifact": str(self.config.artifact), "model": self.model_name,
                                        "load_s": round(time.perf_counter() - t0, 3)})

    def _on_loaded(self, engine: Engine) -> None:
        self.model_name = self.config.model_name or engine.artifact.manifest.get("recipe") or engine.artifact.path.name
        self.max_prompt_chars = max_prompt_chars(engine)
        self.engine = engine
        self.ready.set()

    def require_engine(self) -> Engine:
        """The engine, or a 503 APIError saying why there is none to use."""
        if self.draining:
            raise unavailable("the server is shutting down; retry on another instance", "draining", retry_after=5)
        if self.load_error is not None:
            raise unavailable(f"the model failed to load: {self.load_error}", "load_failed", retry_after=60)
        if self.engine is None:
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
        return 200, {"status": "ok", "model": self.model_name}

    # ---------------------------------------------------------------- in flight / draining
    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.notify_all()

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


def init_app(app: Flask, config: ServiceConfig, engine: Engine | None = None) -> EngineResource:
    res = EngineResource(config, engine)
    app.extensions["ortllm"] = res
    res.load(background=config.load_in_background)
    return res


def current_resources() -> EngineResource:
    return current_app.extensions["ortllm"]
