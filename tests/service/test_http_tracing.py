"""OpenTelemetry spans per request, exported over OTLP/HTTP to a real receiver on 127.0.0.1 (an http.server
that decodes the protobuf with opentelemetry-proto's classes): the caller's traceparent continued, the queue,
prefill, decode and detokenize phases as children, the model, adapter and token counts as attributes. With no
endpoint configured, nothing of OpenTelemetry is imported."""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from ortllm.runtime.adapter_files import add_adapter
from ortllm.service.config import ServiceConfig
from tests.reference.peft_lora import make_peft_lora

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class _Receiver:
    """OTLP/HTTP traces endpoint: POST /v1/traces, application/x-protobuf ExportTraceServiceRequest."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                              ExportTraceServiceResponse)
        self.spans: list = []
        self.paths: list[str] = []
        self.resources: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    receiver.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
                    for ss in rs.scope_spans:
                        receiver.spans.extend(ss.spans)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


@pytest.fixture
def receiver():
    r = _Receiver()
    yield r
    r.close()


@pytest.fixture
def traced_live(tiny_engine, tmp_path, make_live, receiver, monkeypatch):
    from ortllm.pipeline.sources import load_model
    make_peft_lora(load_model("llama-tiny-random")[1], tmp_path / "lora", seed=3, r=8, targets=["q_proj", "v_proj"])
    art = tmp_path / "art"
    shutil.copytree(tiny_engine, art)
    add_adapter(art, tmp_path / "lora", "tuned")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ortllm-test")
    return make_live(art, ServiceConfig(http_threads=8), num_blocks=64)


def test_spans_continue_the_callers_trace(traced_live, receiver):
    live = traced_live
    tracing = live.app.extensions["ortllm_tracing"]
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    r = live.post("/v1/chat/completions", headers=headers, json={
        "model": "tuned", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 7, "temperature": 0,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    streamed = live.post("/v1/completions", json={"prompt": "once upon", "max_tokens": 5, "stream": True,
                                                  "ignore_eos": True})
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    dropped = "a" * 32
    with requests.post(live.url + "/v1/completions", stream=True, timeout=60,
                       headers={"traceparent": f"00-{dropped}-{PARENT_ID}-01"},
                       json={"prompt": "long", "max_tokens": 2000, "stream": True, "ignore_eos": True}) as r2:
        next(r2.iter_lines())                     # the first chunk, then the client leaves
    end = time.monotonic() + 10
    while dropped not in {s.trace_id.hex() for s in receiver.spans} and time.monotonic() < end:
        tracing.flush()
        time.sleep(0.1)
    assert tracing.flush()

    assert set(receiver.paths) == {"/v1/traces"} and receiver.resources[0]["service.name"] == "ortllm-test"
    by_trace = {}
    for s in receiver.spans:
        by_trace.setdefault(s.trace_id.hex(), []).append(s)
    ours = {s.name: s for s in by_trace[TRACE_ID]}
    assert set(ours) == {"ortllm.chat", "queue", "prefill", "decode", "detokenize"}, list(ours)
    root = ours["ortllm.chat"]
    assert root.parent_span_id.hex() == PARENT_ID                        # continues the caller's span
    a = _attrs(root)
    assert a["gen_ai.request.model"] == "tuned" and a["ortllm.adapter"] == "tuned"
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] and a["gen_ai.usage.output_tokens"] == 7
    assert a["gen_ai.response.finish_reasons"] == ["length"] and a["ortllm.request_id"] == r.headers["X-Request-Id"]
    for name in ("queue", "prefill", "decode", "detokenize"):
        child = ours[name]
        assert child.parent_span_id == root.span_id, name
        assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano, name
        assert child.end_time_unix_nano <= root.end_time_unix_nano, name
    q, p, d = ours["queue"], ours["prefill"], ours["decode"]
    assert q.end_time_unix_nano == p.start_time_unix_nano and p.end_time_unix_nano == d.start_time_unix_nano
    assert _attrs(d)["gen_ai.usage.output_tokens"] == 7
    assert _attrs(ours["detokenize"])["ortllm.detokenize.busy_s"] > 0

    # a request without traceparent starts its own trace
    other = [s for t, spans in by_trace.items() if t not in (TRACE_ID, dropped) for s in spans]
    roots = [s for s in other if s.name == "ortllm.completions"]
    assert len(roots) == 1 and not roots[0].parent_span_id
    assert _attrs(roots[0])["gen_ai.usage.output_tokens"] == 5 and _attrs(roots[0])["ortllm.adapter"] == ""
    gone = [s for s in by_trace[dropped] if s.name == "ortllm.completions"]       # a dropped stream's span
    assert len(gone) == 1 and _attrs(gone[0])["gen_ai.response.finish_reasons"] == ["cancelled"]
    assert _attrs(gone[0])["gen_ai.usage.output_tokens"] < 2000


def test_off_imports_nothing_of_opentelemetry(tiny_engine):
    code = ("import sys\n"
            "from ortllm.service.app import create_app\n"
            "from ortllm.service.config import ServiceConfig\n"
            f"app = create_app(ServiceConfig(artifact={str(tiny_engine)!r}, load_in_background=False))\n"
            "r = app.test_client().post('/v1/completions', json={'prompt': 'hi', 'max_tokens': 3})\n"
            "assert r.status_code == 200, r.data\n"
            "assert app.extensions['ortllm_tracing'] is None\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
