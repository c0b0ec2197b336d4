"""Serving an app with waitress (threads; the engine runs in-process on its own thread).

`HTTPServer` runs waitress' event loop on a background thread so the caller can stop it: `ortllm serve` waits
for SIGTERM/SIGINT in the main thread, then drains (new requests 503, in-flight ones finish up to
drain_timeout_s), stops the server, closes the engine and exits 0. Tests use the same class on port 0."""
from __future__ import annotations

import logging
import signal
import sys
import threading

from dataclasses import replace

from flask import Flask
from waitress import create_server
from waitress import wasyncore

from .app import create_app
from .config import ServiceConfig
from .resources import default_memory_budget

log = logging.getLogger("ortllm.service")


class HTTPServer:
    def __init__(self, app: Flask, host: str = "127.0.0.1", port: int = 0, threads: int = 64):
        self.app = app
        # channel_request_lookahead > 0 lets waitress notice a client that hung up while its request runs
        # (environ["waitress.client_disconnected"]); a generation for a gone client is then cancelled.
        cfg = app.config["ORTLLM"]       # waitress' own body limit (default 1 GiB) must not undercut the app's
        self.server = create_server(app, host=host, port=port, threads=threads, channel_request_lookahead=4,
                                    max_request_body_size=max(cfg.max_body_bytes, cfg.max_upload_bytes),
                                    ident="ortllm", connection_limit=max(100, 4 * threads),
                                    cleanup_interval=10, asyncore_use_poll=True)
        self.host, self.port = host, self.server.effective_port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ortllm-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "HTTPServer":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            wasyncore.loop(timeout=0.2, map=self.server._map, use_poll=True, count=1)
        self.server.task_dispatcher.shutdown(timeout=5)
        wasyncore.close_all(self.server._map)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def plan_models(config: ServiceConfig, out=sys.stdout, names: dict[str, str] | None = None) -> ServiceConfig:
    """Print each served model's memory plan (runtime/memory_plan.py) and refuse one that does not fit, saying what
    to lower (names: config key -> the flag that sets it, for the messages). Returns config with each KV pool pinned
    to the planned number of blocks, so the engines allocate what was printed."""
    from ortllm.runtime.artifact import load_artifact
    from ortllm.runtime.engine import engine_config
    from ortllm.runtime.errors import ConfigError
    from ortllm.runtime.memory_plan import plan_memory

    models = config.models or ((config.model_name, config.artifact),)
    pinned: dict[str, dict] = {}
    for name, path in models:
        overrides = config.overrides_for(name, path)
        plan = plan_memory(engine_config(path, **overrides), load_artifact(path, verify=False))
        label = name or load_artifact(path, verify=False).manifest.recipe or path.name
        print(f"ortllm: memory plan for {label}:", file=out)
        for line in plan.lines(names):
            print(f"  {line}", file=out)
        out.flush()
        problems = plan.problems(names, context_given="max_model_len" in overrides)
        if config.models and plan.total > (config.memory_budget_bytes or default_memory_budget()):
            problems.append(f"it needs more than the models' memory budget ({plan.total / 2**30:.2f} GiB > "
                            f"{(config.memory_budget_bytes or default_memory_budget()) / 2**30:.2f} GiB); "
                            f"raise {(names or {}).get('memory_budget', 'memory_budget_bytes')} or size it smaller")
        if problems:
            raise ConfigError(f"the memory plan of {label} does not fit: " + "; and ".join(problems))
        own = {k: v for k, v in overrides.items() if k != "memory_budget_bytes"}
        pinned[str(name) if config.models else ""] = {**own, "num_blocks": plan.num_blocks}
    if config.models:
        return replace(config, model_overrides=pinned)
    return replace(config, engine_overrides=pinned[""])


def serve(config: ServiceConfig, out=sys.stdout, names: dict[str, str] | None = None) -> int:
    """Print the memory plan (refusing one that does not fit), then run until SIGTERM/SIGINT; 0 after a drain,
    1 if the model failed to load."""
    config = plan_models(config, out, names)
    app = create_app(config)
    res = app.extensions["ortllm"]
    server = HTTPServer(app, config.host, config.port, config.http_threads).start()
    stop = threading.Event()
    signals = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signals[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        while not res.ready.wait(0.2):
            if stop.is_set():
                break
        if res.load_error is not None:
            server.stop()
            raise res.load_error
        if not stop.is_set():
            from ortllm.runtime.artifact import quality_line
            for m in res.models:
                if line := quality_line(m.path):
                    print(f"ortllm: {m.model_name}: {line}", file=out, flush=True)
            res.register(server.url)
            print(f"ortllm: serving {res.model_name} at {server.url} (OpenAI API at {server.url}/v1, playground at "
                  f"{server.url}/); Ctrl-C to stop", file=out, flush=True)
        while not stop.wait(0.5):
            pass
        log.info("draining", extra={"in_flight": res.in_flight, "timeout_s": config.drain_timeout_s})
        drained = res.drain(config.drain_timeout_s)
        if not drained:
            log.warning("drain timed out; cancelling what is left", extra={"in_flight": res.in_flight})
        server.stop()
        res.close()
        log.info("stopped", extra={"drained": drained})
        print("ortllm: stopped", file=out, flush=True)
        return 0
    finally:
        for sig, old in signals.items():
            signal.signal(sig, old)
