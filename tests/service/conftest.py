"""Live servers for the service tests: waitress on a free 127.0.0.1 port, in a background thread, serving a real
engine (no mocks). `app` / `client` are the Flask-way fixtures (docs/architecture.md, Conventions) on the same
engine."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest
import requests

from ortllm.runtime.engine import Engine
from ortllm.service.app import create_app
from ortllm.service.config import ServiceConfig
from ortllm.service.server import HTTPServer


@dataclass
class Live:
    url: str
    engine: Engine
    app: object
    server: HTTPServer
    model: str

    def post(self, path: str, timeout: float = 60, **kw) -> requests.Response:
        return requests.post(self.url + path, timeout=timeout, **kw)

    def get(self, path: str, timeout: float = 30, **kw) -> requests.Response:
        return requests.get(self.url + path, timeout=timeout, **kw)

    def complete(self, prompt, **body) -> dict:
        r = self.post("/v1/completions", json={"prompt": prompt, "temperature": 0, **body})
        assert r.status_code == 200, r.text
        return r.json()

    def wait_idle_kv(self, baseline: int, timeout: float = 10) -> int:
        """Poll until the KV blocks in use are back at baseline; returns the last count seen."""
        end = time.monotonic() + timeout
        while True:
            s = self.engine.stats()
            used = s["kv_blocks_total"] - s["kv_blocks_free"]
            if used <= baseline or time.monotonic() > end:
                return used
            time.sleep(0.05)


def start_live(artifact, config: ServiceConfig | None = None, **engine_overrides) -> Live:
    engine = Engine.from_artifact(artifact, **engine_overrides)
    config = config or ServiceConfig(health_error_window_s=1.0)
    app = create_app(config, engine=engine)
    server = HTTPServer(app, "127.0.0.1", 0, threads=config.http_threads).start()
    return Live(server.url, engine, app, server, app.extensions["ortllm"].model_name)


def stop_live(live: Live) -> None:
    live.server.stop()
    live.engine.close()


@pytest.fixture(scope="session")
def tiny_live(tiny_engine):
    """The tiny engine behind a live server with room for 128 concurrent HTTP requests."""
    live = start_live(tiny_engine, ServiceConfig(health_error_window_s=1.0, http_threads=128), num_blocks=512)
    yield live
    stop_live(live)


@pytest.fixture(scope="session")
def smol_live(smollm2_engine):
    live = start_live(smollm2_engine, ServiceConfig(), num_blocks=256)
    yield live
    stop_live(live)


@pytest.fixture
def app(tiny_live):
    return tiny_live.app


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def make_live():
    """start_live for a test's own server (other engine settings); stopped at teardown."""
    started: list[Live] = []

    def make(artifact, config: ServiceConfig | None = None, **engine_overrides) -> Live:
        started.append(start_live(artifact, config, **engine_overrides))
        return started[-1]
    yield make
    for live in started:
        stop_live(live)


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
APT = "apt-get install -y chromium chromium-driver"


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"headless Chromium is not installed; run: {APT}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1200,800",
              f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def tiny_lora_artifact(tiny_engine, tmp_path_factory):
    """llama-tiny-random with the 4 adapters of tests/service/ray_fixtures.py ADAPTERS (the Ray tests)."""
    import shutil

    from ortllm.pipeline.sources import load_model
    from ortllm.runtime.adapter_files import add_adapter
    from tests.reference.peft_lora import make_peft_lora
    from tests.service.ray_fixtures import ADAPTERS
    weights = load_model("llama-tiny-random")[1]
    base = tmp_path_factory.mktemp("ray-art")
    art = base / "art"
    shutil.copytree(tiny_engine, art)
    for k, name in enumerate(ADAPTERS):
        make_peft_lora(weights, base / name, seed=40 + k, r=8, targets=["q_proj", "v_proj"])
        add_adapter(art, base / name, name)
    return art
