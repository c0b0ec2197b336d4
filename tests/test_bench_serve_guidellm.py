"""`serve-guidellm`: GuideLLM's report parsed into the harness's rows (a recorded report: GuideLLM 0.8.1 against
`ortllm serve` on the tiny engine artifact, 2 streams, 256 in / 128 out; per-request details and the modality
sub-summaries dropped to keep it small; and a Poisson run GuideLLM sent as a burst), the one-line errors, and,
where GuideLLM is installed (.venv-guidellm, ci/install_peers.sh), a short live run on the tiny engine artifact."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortllm.bench import serve_guidellm as sg
from ortllm.bench.errors import BenchError

REPORT = Path(__file__).parent / "data" / "guidellm_report_c2.json"


def test_parse_report_on_a_recorded_report():
    doc = json.loads(REPORT.read_text())
    (r,) = sg.parse_report(doc)
    m = doc["benchmarks"][0]["metrics"]
    # output tok/s: the completed requests' tokens over GuideLLM's duration; the same as GuideLLM's own mean rate
    assert r["output_tokens_per_s"] == pytest.approx(16 * 128 / doc["benchmarks"][0]["duration"])
    assert r["output_tokens_per_s"] == pytest.approx(m["output_tokens_per_second"]["successful"]["mean"], rel=1e-3)
    assert r["output_tokens_mean"] == 128 and r["completed"] == 16 and r["errors"] == 0 and r["streams"] == 2
    ttft = m["time_to_first_token_ms"]["successful"]["percentiles"]
    assert (r["ttft_p50"], r["ttft_p99"]) == (ttft["p50"], ttft["p99"])
    assert 0 < r["itl_p50"] <= r["itl_p99"] < r["ttft_p99"]
    # goodput at the SLO (TTFT <= 1 s, ITL <= 100 ms): every request met it here; GuideLLM's own goodput agrees
    assert r["goodput_fraction"] == 1.0
    assert r["goodput"] == pytest.approx(m["request_goodput"]["successful"]["mean"], rel=1e-3)
    assert r["goodput"] == pytest.approx(r["request_throughput"])


def test_a_run_guidellm_sent_late_is_not_counted():
    """A recorded burst (GuideLLM 0.8.1 against `ortllm serve` on SmolLM2, Poisson at 0.25 req/s: the server's log
    had all 15 requests within 0.2 s) is refused by its own p95 root dispatch delay; the closed loop above is not."""
    (ok,) = sg.parse_report(json.loads(REPORT.read_text()))
    assert 0 < ok["dispatch_delay_p95_s"] < sg.DISPATCH_DELAY_LIMIT_S and sg.late_dispatch(ok) is None
    burst = json.loads((Path(__file__).parent / "data" / "guidellm_report_poisson_burst.json").read_text())
    (late,) = sg.parse_report(burst)
    assert late["rate"] == 0.25 and late["completed"] == 15 and late["dispatch_delay_p95_s"] > 1e9
    why = sg.late_dispatch(late)
    assert why.startswith("GuideLLM sent its requests late") and "not counted" in why
    assert sg.late_dispatch({**ok, "dispatch_delay_p95_s": 0.3}) is None, "a closed loop is judged by its streams"


def test_config_asks_for_the_shape_the_slo_and_the_bounds(tmp_path):
    cfg = sg.guidellm_config("http://127.0.0.1:1", "m", tmp_path / "tok", tmp_path / "r.json", concurrency=16,
                             max_seconds=30, max_requests=128)["spec"]
    assert cfg["profile"] == {"kind": "concurrent", "streams": [16]}
    assert cfg["data"] == [{"kind": "synthetic_text", "prompt_tokens": 256, "output_tokens": 128}]
    assert cfg["backend"]["request_format"] == "/v1/completions" and cfg["backend"]["stream"] is True
    assert {"kind": "max_duration", "seconds": 30.0} in cfg["constraints"]
    assert {"kind": "max_requests", "count": 128} in cfg["constraints"]
    assert cfg["metrics"]["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 100.0}
    poisson = sg.guidellm_config("http://127.0.0.1:1", "m", tmp_path, tmp_path / "r.json", rate=2.5)["spec"]
    assert poisson["profile"] == {"kind": "poisson", "rate": [2.5]}
    # the prompts' seed: one per (round, load), the same for every system, never reused (no prefix-cache hits
    # from an earlier run on the same server)
    assert sg.guidellm_config("http://127.0.0.1:1", "m", tmp_path, tmp_path / "r.json", concurrency=4,
                              seed=7)["spec"]["seed"] == {"kind": "static", "value": 7}
    seeds = [sg.run_seed(r, i, 5) for r in range(3) for i in range(5)]
    assert len(set(seeds)) == len(seeds)


def test_errors_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(BenchError, match="unknown --peers nope .* choose from llama-server"):
        sg.peer_gguf("nope", "smollm2-135m-instruct")
    monkeypatch.setenv("ORTLLM_LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(BenchError, match="PEERS_ONLY=llama-server make bench-peers"):
        sg.llama_server_bin()
    monkeypatch.setenv("ORTLLM_GUIDELLM", str(tmp_path / "missing"))
    with pytest.raises(BenchError, match="PEERS_ONLY=guidellm make bench-peers"):
        sg.guidellm_bin()


def test_live_run_on_the_tiny_engine(tiny_engine, tmp_path):
    """ortllm serve under a real GuideLLM, 2 streams, at most 4 requests: the plumbing end to end."""
    try:
        sg.guidellm_bin()
    except BenchError as e:
        pytest.skip(f"GuideLLM is not installed: {e}")
    rows = sg.run(tiny_engine, [], concurrency=[2], threads=1, max_seconds=60, max_requests=4,
                  log_dir=tmp_path)
    got = {r["metric"]: r for r in rows}
    assert {r["system"] for r in rows} == {"ortllm"} and {r["batch"] for r in rows} == {2}
    assert got["errors"]["median"] == 0 and got["output_tokens_mean"]["median"] == 128
    assert got["output_tokens_per_s"]["median"] > 0 and got["ttft_p99"]["unit"] == "ms"
    assert got["goodput_fraction"]["load_tool"].startswith("guidellm ")
    assert (tmp_path / "ortllm-serve.log").read_text().rstrip().endswith("ortllm: stopped")
