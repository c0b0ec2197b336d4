"""Who may call what: one rule per kind of route, applied by one hook (`check_access`, which create_app runs before
every request), so no handler carries its own check.

    PUBLIC   GET /health, /metrics, /openapi.json and / (the playground page): never a key. Probes and scrapers
             send none, the document describes the API to a client before it has a key, and the page is what asks
             for the key; none of them reads or changes anything a request could not see anyway.
    MANAGE   pull, create, delete, copy, blobs, adapters load / unload: they change what the server stores or
             serves, and pull / adapters read paths on the server. Allowed with a configured key (and that key
             sent), or, with no key, on a server bound to a loopback address and asked through a loopback host
             name (a page of another site that got its name to resolve to 127.0.0.1 asks through its own name).
             With no key on another address: 403, saying to set one.
    the rest with a key configured: the key. Without one: open (the default bind is 127.0.0.1).

The key is sent as `Authorization: Bearer KEY` or, as Anthropic's clients send it, `x-api-key: KEY`.

A browser request from another origin (an `Origin` header that is neither this server nor one of --cors-origin)
is refused on every route but PUBLIC: with CORS off a page cannot read the answers, and this keeps it from
sending requests whose effects (a pull, a copy, minutes of generation) need no answer."""
from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from flask import Flask, current_app, request

from .errors import APIError

# Endpoint names (blueprint.view); tests/service/test_http_security.py checks each is a route of the app.
PUBLIC = frozenset({"ops.health", "ops.metrics", "ops.openapi", "playground.page", "static"})
MANAGE = frozenset({"ollama_models.pull", "ollama_models.create", "ollama_models.delete", "ollama_models.copy",
                    "ollama_models.blob_exists", "ollama_models.blob_upload",
                    "openai.load_adapter", "openai.unload_adapter"})


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (a bind address or a Host header's name)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_access() -> None:
    """The before_request hook: raises the 401 / 403 of the rules above."""
    endpoint = request.endpoint
    if endpoint is None or endpoint in PUBLIC or request.method == "OPTIONS":   # 404/405, CORS preflight
        return
    config = current_app.config["ORTLLM"]
    _same_origin_or_allowed(config.cors_origins)
    if config.api_key is not None:
        require_api_key()
    elif endpoint in MANAGE:
        _loopback_only(config.host)


def require_api_key() -> None:
    """401 unless the request carries the configured key (no key configured, or a CORS preflight, which browsers
    send without credentials: nothing to check)."""
    key = current_app.config["ORTLLM"].api_key
    if key is None or request.method == "OPTIONS":
        return
    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    got = request.headers.get("x-api-key") or (bearer.strip() if scheme.lower() == "bearer" else "")
    if not hmac.compare_digest(got.encode(), key.encode()):
        raise APIError(401, "invalid or missing API key; send `Authorization: Bearer KEY` (or `x-api-key: KEY`)",
                       type="authentication_error", code="invalid_api_key")


def _loopback_only(bind_host: str) -> None:
    if not is_loopback(bind_host):
        raise APIError(403, f"{request.method} {request.path} changes what this server stores or serves: on a server "
                       f"bound to {bind_host} (not a loopback address) it needs an API key; restart it with "
                       "--api-key KEY (or bind it to 127.0.0.1)", type="permission_error", code="api_key_required")
    host = urlsplit("//" + request.host).hostname or ""
    if not is_loopback(host):
        raise APIError(403, f"{request.method} {request.path} without an API key is answered only when asked as "
                       f"localhost or 127.0.0.1, not as {host!r}; start the server with --api-key KEY to manage it "
                       "by another name", type="permission_error", code="api_key_required")


def _same_origin_or_allowed(cors_origins: tuple[str, ...]) -> None:
    origin = request.headers.get("Origin")
    if origin is None or origin in cors_origins or "*" in cors_origins:
        return
    if urlsplit(origin).netloc == request.host:          # this server's own page (the playground)
        return
    raise APIError(403, f"requests from the page at {origin} are refused: start the server with --cors-origin "
                   f"{origin} to let it call this API", type="permission_error", code="origin_not_allowed")


# ---------------------------------------------------------------- CORS (off unless --cors-origin names origins)

_ALLOW_HEADERS = "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, OpenAI-Organization"
_EXPOSE_HEADERS = "X-Request-Id, Retry-After"


def add_cors_headers(resp):
    """after_request: an allowed Origin gets Access-Control-* headers (preflights too); any other gets none, so the
    browser keeps the answer from the page."""
    origins = current_app.config["ORTLLM"].cors_origins
    origin = request.headers.get("Origin")
    if not origins or origin is None or not (origin in origins or "*" in origins):
        return resp
    resp.headers["Access-Control-Allow-Origin"] = "*" if "*" in origins else origin
    resp.vary.add("Origin")
    resp.headers["Access-Control-Expose-Headers"] = _EXPOSE_HEADERS
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        resp.headers["Access-Control-Allow-Methods"] = resp.headers.get("Allow", "GET, POST, DELETE, HEAD")
        resp.headers["Access-Control-Allow-Headers"] = _ALLOW_HEADERS
        resp.headers["Access-Control-Max-Age"] = "600"
    return resp


def init_app(app: Flask) -> None:
    app.before_request(check_access)
    app.after_request(add_cors_headers)
