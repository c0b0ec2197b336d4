"""The server's default and cap of max_tokens (`ortllm serve --max-tokens N`, SchedulerConfig.max_tokens): a request
without max_tokens generates at most N, one above N is clamped to N (finish_reason length), over HTTP."""
import pytest

from ortllm.service.config import ServiceConfig

from .conftest import start_live, stop_live

CAP = 5


@pytest.fixture(scope="module")
def capped(tiny_engine):
    live = start_live(tiny_engine, ServiceConfig(health_error_window_s=1.0), num_blocks=64, max_tokens=CAP)
    yield live
    stop_live(live)


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}),
    ("/v1/completions", {"prompt": "hello"}),
    ("/v1/completions", {"prompt": "hello", "max_tokens": 50}),
])
def test_max_tokens_default_and_cap(capped, route, body):
    r = capped.post(route, json={"temperature": 0, "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] == CAP and out["choices"][0]["finish_reason"] == "length", out
