"""Secure by default (service/auth.py, service/server_paths.py): one rule for the routes that change what the server
stores or serves, server paths only under allowed roots, size limits, CORS off unless named, a warning for an open
non-loopback bind; and, with a key set, a schemathesis run that finds no route but the public ones answering 2xx
without it. Flask's test client on the tiny engine (the `host` in the config is what the rule reads; nothing binds
it), real servers on 127.0.0.1 where the socket matters (waitress' own body limit)."""
from __future__ import annotations

import hashlib
import logging
import os

import pytest
import requests

from ortllm.service.app import create_app
from ortllm.service.auth import MANAGE, PUBLIC
from ortllm.service.config import ServiceConfig

KEY = "sec-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DIGEST = "sha256:" + "0" * 64
# one request per MANAGE endpoint: (method, path, JSON body)
MANAGE_CALLS = [("POST", "/api/pull", {"model": "no-such-model-x", "stream": False}),
                ("POST", "/api/create", {"model": "x", "from": "no-such-base", "stream": False}),
                ("DELETE", "/api/delete", {"model": "no-such-model-x"}),
                ("POST", "/api/copy", {"source": "no-such-model-x", "destination": "y"}),
                ("HEAD", f"/api/blobs/{DIGEST}", None),
                ("POST", f"/api/blobs/{DIGEST}", None),
                ("POST", "/v1/adapters", {"name": "x", "path": "/no/such/peft"}),
                ("DELETE", "/v1/adapters/no-such-adapter", None)]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _client(engine, **config):
    return create_app(ServiceConfig(**config), engine=engine).test_client()


def _call(client, method, path, body, **kw):
    return client.open(path, method=method, json=body, **kw)


def _past_the_guard(r) -> bool:
    """The request reached its handler: its own answer, not the access rule's 401 / 403."""
    return r.status_code != 401 and not (r.status_code == 403 and (r.get_json() or {}).get("error", {}).get("code")
                                         in ("api_key_required", "origin_not_allowed", "invalid_api_key"))


def test_the_rule_tables_name_real_routes(tiny_live):
    """A renamed view cannot drop out of the rule: every name in PUBLIC and MANAGE is an endpoint of the app, every
    route of the store blueprint is in MANAGE, and each MANAGE_CALLS request reaches one."""
    endpoints = {r.endpoint for r in tiny_live.app.url_map.iter_rules()}
    assert PUBLIC | MANAGE <= endpoints, (PUBLIC | MANAGE) - endpoints
    assert {e for e in endpoints if e.startswith("ollama_models.")} <= MANAGE
    adapter = tiny_live.app.url_map.bind("x")
    assert {adapter.match(p, method=m)[0] for m, p, _ in MANAGE_CALLS} == MANAGE


def test_without_a_key_managing_needs_a_loopback_bind(tiny_live, home):
    """No key: on 0.0.0.0 every MANAGE route is a 403 naming --api-key and generation stays open; on 127.0.0.1
    each passes the guard (its own answer: 404, 400, ...), unless asked by a non-loopback Host name (DNS
    rebinding)."""
    open_bind = _client(tiny_live.engine, host="0.0.0.0")
    for method, path, body in MANAGE_CALLS:
        r = _call(open_bind, method, path, body)
        assert r.status_code == 403, (method, path, r.status_code)
        if method != "HEAD":
            assert r.get_json()["error"]["code"] == "api_key_required" and "--api-key" in r.get_json()["error"][
                "message"]
    assert _call(open_bind, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}).status_code == 200

    loopback = _client(tiny_live.engine, host="127.0.0.1")
    for method, path, body in MANAGE_CALLS:
        r = _call(loopback, method, path, body)
        assert _past_the_guard(r), (method, path, r.status_code, r.data[:200])
        r = _call(loopback, method, path, body, headers={"Host": "rebound.example:8000"})
        assert r.status_code == 403, (method, path)
    assert _call(loopback, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2},
                 headers={"Host": "rebound.example:8000"}).status_code == 200


def test_with_a_key_every_route_but_the_public_ones_needs_it(tiny_live, home):
    client = _client(tiny_live.engine, host="0.0.0.0", api_key=KEY)
    for method, path, body in MANAGE_CALLS:
        assert _call(client, method, path, body).status_code == 401, (method, path)
        r = _call(client, method, path, body, headers=AUTH)
        assert _past_the_guard(r), (method, path, r.status_code)
    r = _call(client, "POST", "/v1/adapters", {"name": "x", "path": "/x"}, headers={"x-api-key": KEY})
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "path_not_allowed"   # past the key: the path
    for path in ("/health", "/metrics", "/openapi.json", "/"):
        assert client.get(path).status_code == 200, path
    assert client.get("/v1/models").status_code == 401


def test_server_paths_only_under_allowed_roots(tiny_live, home, tmp_path):
    """pull and /v1/adapters read a server path only under --allowed-path (default the store), symlinks resolved:
    a path outside is a 403 whether it exists or not; one inside gets its own answer."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "peft").mkdir(parents=True)
    outside.mkdir()
    (allowed / "link").symlink_to(outside)
    default = _client(tiny_live.engine)
    for spec in ("/etc/passwd", "/no/such/file.gguf", str(allowed / "peft"), "../../etc"):
        r = _call(default, "POST", "/api/pull", {"model": spec, "stream": False})
        assert r.status_code == 403 and r.get_json()["error"]["code"] == "path_not_allowed", (spec, r.data)
        assert "--allowed-path" in r.get_json()["error"]["message"]
    client = _client(tiny_live.engine, allowed_paths=(allowed,))
    for path in ("/etc", str(outside), str(allowed / "link"), str(allowed / "peft" / ".." / ".." / "outside")):
        r = _call(client, "POST", "/v1/adapters", {"name": "x", "path": path})
        assert r.status_code == 403 and r.get_json()["error"]["param"] == "path", (path, r.data)
    r = _call(client, "POST", "/v1/adapters", {"name": "x", "path": str(allowed / "peft")})
    assert r.status_code == 400 and "adapter_config.json" in r.get_json()["error"]["message"]
    r = _call(client, "POST", "/api/pull", {"model": str(allowed / "peft" / "a.gguf"), "stream": False})
    assert r.status_code == 400 and "a.gguf" in r.get_json()["error"]["message"]          # the build's own error


def test_body_and_upload_limits(tiny_engine, make_live, home):
    """--max-request-size and --max-upload-size: a larger body is a 413 (also when sent chunked, with no length);
    a blob within the upload limit is stored; waitress' own limit follows the larger of the two."""
    live = make_live(tiny_engine, ServiceConfig(max_body_bytes=2048, max_upload_bytes=8192), num_blocks=64)
    r = live.post("/v1/completions", json={"prompt": "x" * 4096, "max_tokens": 1})
    assert r.status_code == 413 and "too large" in r.json()["error"]["message"]
    small = os.urandom(6000)
    url = f"{live.url}/api/blobs/sha256:{hashlib.sha256(small).hexdigest()}"
    assert requests.post(url, data=small, timeout=30).status_code == 201
    big = os.urandom(9000)
    url = f"{live.url}/api/blobs/sha256:{hashlib.sha256(big).hexdigest()}"
    assert requests.post(url, data=big, timeout=30).status_code == 413
    assert requests.post(url, data=iter([big[:4500], big[4500:]]), timeout=30).status_code == 413    # chunked
    assert live.server.server.adj.max_request_body_size == 8192
    assert not list((home / "uploads").glob(".tmp-*"))


def test_cors_off_unless_origins_are_named(tiny_live):
    """No --cors-origin: a page of another origin is refused (and gets no Access-Control-* header), the server's
    own page is not. Named: that origin gets the headers and its preflight; another origin still 403."""
    body = {"prompt": "a", "max_tokens": 2}
    off = _client(tiny_live.engine)
    r = off.post("/v1/completions", json=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "origin_not_allowed"
    assert "Access-Control-Allow-Origin" not in r.headers
    assert off.post("/v1/completions", json=body, headers={"Origin": "http://localhost"}).status_code == 200
    assert "Access-Control-Allow-Origin" not in off.get("/health", headers={"Origin": "http://evil.example"}).headers

    site = "http://localhost:3000"
    on = _client(tiny_live.engine, cors_origins=(site,), api_key=KEY)
    pre = on.options("/v1/chat/completions", headers={"Origin": site, "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["Access-Control-Allow-Origin"] == site
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
    r = on.post("/v1/completions", json=body, headers={"Origin": site, **AUTH})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == site and "Origin" in r.headers["Vary"]
    assert on.post("/v1/completions", json=body, headers={"Origin": "http://evil.example", **AUTH}).status_code == 403


def test_warning_for_a_non_loopback_bind_without_a_key(tiny_live, caplog):
    def warned(**config) -> bool:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ortllm.service"):
            create_app(ServiceConfig(**config), engine=tiny_live.engine)
        return any("without an API key" in r.getMessage() for r in caplog.records)

    assert warned(host="0.0.0.0") and warned(host="192.0.2.7")
    assert not warned(host="127.0.0.1") and not warned(host="::1") and not warned(host="0.0.0.0", api_key=KEY)


def test_config_and_flags_check_their_values():
    from ortllm.cli import make_parser
    from ortllm.runtime.errors import ConfigError
    with pytest.raises(ConfigError, match="CORS origin"):
        ServiceConfig(cors_origins=("localhost:3000",))
    with pytest.raises(ConfigError, match="max_upload_bytes"):
        ServiceConfig(max_upload_bytes=10)
    a = make_parser().parse_args(["serve", "x", "--allowed-path", "/a", "--allowed-path", "/b", "--cors-origin", "*",
                                  "--max-request-size", "2M", "--max-upload-size", "512K"])
    assert [str(p) for p in a.allowed_path] == ["/a", "/b"] and a.cors_origin == ["*"]
    assert (a.max_request_size, a.max_upload_size) == (2 << 20, 512 << 10)


PUBLIC_PATHS = {"/health", "/metrics", "/openapi.json", "/"}


def test_schemathesis_with_a_key_nothing_but_the_public_routes_answers_without_it(tiny_engine, make_live, home):
    """Every operation of /openapi.json, generated requests sent without the key: none but the public ones
    (PUBLIC: /health, /metrics, /openapi.json, the page) answers 2xx; the public ones do."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    live = make_live(tiny_engine, ServiceConfig(api_key=KEY), num_blocks=64)
    schema = schemathesis.openapi.from_url(live.url + "/openapi.json")
    seen = set()
    for result in schema.get_all_operations():
        op = result.ok()

        @settings(max_examples=3, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case):
            r = case.call(base_url=live.url, timeout=60)
            if case.path in PUBLIC_PATHS:
                assert r.status_code == 200, (case.method, case.path, r.status_code)
            else:
                assert r.status_code == 401, (case.method, case.path, r.status_code, r.text[:200])
        run()
        seen.add((op.method.upper(), op.path))
    assert len(seen) >= 28 and {("POST", "/api/pull"), ("POST", "/v1/adapters")} <= seen
