"""The application factory (docs/architecture.md, Conventions): `create_app(config)` attaches the engine and the
metrics in init_app, registers the blueprints, and maps every error to its API's envelope in one handler
(lifecycle.error_response)."""
from __future__ import annotations

import logging
import os
import time
import uuid

from flask import Flask, g, request

from ortllm.runtime.engine import Engine

from . import auth, lifecycle, metrics, resources, tracing
from .api import bp as api_bp
from .config import ServiceConfig
from .embeddings import bp as embeddings_bp
from .logs import RequestIdFilter
from .messages import bp as messages_bp
from .ollama import bp as ollama_bp
from .ollama_models import bp as ollama_models_bp
from .ops import bp as ops_bp
from .playground import bp as playground_bp
from .responses import bp as responses_bp

log = logging.getLogger("ortllm.service")
log.addFilter(RequestIdFilter())


def create_app(config: ServiceConfig | None = None, engine: Engine | None = None) -> Flask:
    """config: None reads the artifact from $ORTLLM_ARTIFACT. engine: serve this already-loaded engine
    (tests, benchmarks) instead of loading config.artifact; the app does not close it."""
    if config is None:
        config = ServiceConfig(artifact=os.environ.get("ORTLLM_ARTIFACT"))
    app = Flask(__name__)
    app.config["ORTLLM"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.sort_keys = False
    res = resources.init_app(app, config, engine)
    m = metrics.init_app(app, res)
    tracing.init_app(app)
    app.register_blueprint(api_bp)
    app.register_blueprint(ollama_bp)
    app.register_blueprint(ollama_models_bp)
    app.register_blueprint(ops_bp)
    app.register_blueprint(playground_bp)
    app.register_blueprint(responses_bp)
    app.register_blueprint(messages_bp)
    app.register_blueprint(embeddings_bp)

    @app.before_request
    def _start():
        g.request_id = uuid.uuid4().hex[:20]
        g.t_start = time.perf_counter()

    auth.init_app(app)     # after _start: its 401 / 403 carry the request id
    if config.api_key is None and not auth.is_loopback(config.host):
        log.warning(f"serving on {config.host} without an API key: anyone who can reach this address can run "
                    "generations (pulls, creates, deletes and adapter loads are refused until a key is set); "
                    "start with --api-key KEY, or bind to 127.0.0.1")

    @app.after_request
    def _finish(resp):
        resp.headers["X-Request-Id"] = getattr(g, "request_id", "")
        endpoint = request.url_rule.rule if request.url_rule else "unmatched"
        m.http.labels(endpoint, str(resp.status_code)).inc()
        log.info("http", extra={"method": request.method, "path": request.path, "status": resp.status_code,
                                "duration_s": round(time.perf_counter() - g.get("t_start", time.perf_counter()), 4)})
        return resp

    app.register_error_handler(Exception, lifecycle.error_response)    # every route's one error handler

    return app
