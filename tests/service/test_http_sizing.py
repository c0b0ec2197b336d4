"""`ortllm serve` sized by the user (--ctx-size, --parallel, --max-queued, --kv-cache-size) on the tiny engine: the
limits hold over HTTP (400 past the context size, naming it; past --parallel requests queue, and past the queue
429), nothing is lost when the KV pool runs out mid-generation (preempted and resumed), the limits are reported,
and a memory plan that cannot fit is refused saying what to lower."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import requests

from ortllm.service.config import ServiceConfig

from .conftest import start_live, stop_live


def _stream(url: str, prompt: str, max_tokens: int, out: list, i: int) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    text, finish, status = "", None, None
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=120) as r:
        status = r.status_code
        if status == 200:
            import json
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        text += c["text"]
                        finish = c["finish_reason"] or finish
    out[i] = (status, finish, text)


def _wait(cond, what: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def test_context_size_parallel_queue_and_limits_reported(tiny_engine):
    """ctx-size 96: a longer prompt gets 400 naming the limit; parallel 2 + queue 2: two run, two wait, the fifth
    gets 429; all four complete. /v1/models and /health report the limits."""
    live = start_live(tiny_engine, ServiceConfig(http_threads=16), max_num_seqs=2, max_queued=2, max_model_len=96,
                      num_blocks=64, spec_max_tokens=0, decode_steps=1)
    try:
        limits = live.get("/v1/models").json()["data"][0]["limits"]
        assert limits["max_model_len"] == 96 and limits["max_num_seqs"] == 2 and limits["max_queued"] == 2
        assert limits["kv_cache_tokens"] == 63 * 16
        assert live.get("/health").json()["limits"] == limits

        r = live.post("/v1/completions", json={"prompt": list(range(5, 105)), "max_tokens": 4})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and "95" in err["message"] and "max_model_len" in err["message"]

        real_execute = live.engine.runner.execute

        def slow_execute(*a, **k):      # a slower model: the running two hold their slots while the fifth asks
            time.sleep(0.03)
            return real_execute(*a, **k)
        live.engine.runner.execute = slow_execute
        out: list = [None] * 5
        threads = [threading.Thread(target=_stream, args=(live.url, f"queue {i}", 90, out, i)) for i in range(4)]
        for t in threads[:2]:
            t.start()
        _wait(lambda: live.engine.stats()["running"] == 2, "the first two never ran together")
        for t in threads[2:]:
            t.start()
        _wait(lambda: live.engine.stats()["waiting"] == 2, "the next two never queued")
        assert live.engine.stats()["running"] == 2             # --parallel holds: they wait, not run
        r = live.post("/v1/completions", json={"prompt": "one too many", "max_tokens": 2})
        assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded" and "Retry-After" in r.headers
        live.engine.runner.execute = real_execute
        for t in threads[:4]:
            t.join(120)
        assert [(s, f) for s, f, _ in out[:4]] == [(200, "length")] * 4
    finally:
        stop_live(live)


def test_kv_pool_running_out_preempts_and_resumes(tiny_engine):
    """8 blocks of 16 tokens for 4 running sequences of ~20 + 60 tokens (5 blocks each): they are preempted and
    resumed, and each completes with the text it gets alone."""
    prompts = [f"preempt number {i} " * 3 for i in range(4)]
    live = start_live(tiny_engine, ServiceConfig(http_threads=16), max_num_seqs=4, num_blocks=9, max_model_len=128,
                      spec_max_tokens=0)
    try:
        alone = [live.complete(p, max_tokens=60, ignore_eos=True)["choices"][0]["text"] for p in prompts]
        before = live.engine.stats()["preemptions"]
        out: list = [None] * 4
        threads = [threading.Thread(target=_stream, args=(live.url, p, 60, out, i)) for i, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert live.engine.stats()["preemptions"] > before
        assert [(s, f) for s, f, _ in out] == [(200, "length")] * 4
        assert [text for _, _, text in out] == alone
        assert live.wait_idle_kv(0) == 0
    finally:
        stop_live(live)


def _serve(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ortllm", "serve", *map(str, args), "--port", "0"],
                          capture_output=True, text=True, timeout=120)


def test_memory_plan_printed_and_refusals_say_what_to_lower(tiny_engine):
    p = _serve(tiny_engine, "--ctx-size", 100000)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "memory plan for llama-tiny-random" in p.stdout and "KV cache" in p.stdout and "headroom" in p.stdout
    assert "lower --ctx-size to at most 512" in p.stderr.strip().splitlines()[-1]

    p = _serve(tiny_engine, "--ctx-size", 256, "--kv-cache-size", 0.0001)
    assert p.returncode == 1 and "fewer than one sequence of --ctx-size 256; raise --kv-cache-size" in p.stderr

    p = _serve(tiny_engine, "--kv-cache-size", 1e6)
    assert p.returncode == 1 and "are available; lower --kv-cache-size" in p.stderr

    p = _serve(tiny_engine, "--parallel", 600)           # validated by the config tree, named by its flag
    assert p.returncode == 1 and "max_num_seqs (600) must be <= max_batch_tokens (512)" in p.stderr
    assert "lower max_num_seqs (--parallel) or raise max_batch_tokens (--max-batch-tokens)" in p.stderr


def test_each_model_of_a_multi_model_server_gets_its_own_plan(tiny_engine):
    """[models."NAME"] sizes: each served model is planned (and later loaded) with its own sizes on top of the
    shared ones; the plan pins each pool to the blocks it printed."""
    import io

    from ortllm.service.server import plan_models

    config = ServiceConfig(models=(("a", tiny_engine), ("b", tiny_engine)),
                           engine_overrides={"max_num_seqs": 4, "memory_budget_bytes": "auto"},
                           model_overrides={"b": {"max_model_len": 64, "max_num_seqs": 2}})
    out = io.StringIO()
    planned = plan_models(config, out)
    text = out.getvalue()
    assert "memory plan for a:" in text and "memory plan for b:" in text
    a, b = planned.overrides_for("a", tiny_engine), planned.overrides_for("b", tiny_engine)
    assert "memory_budget_bytes" not in a and "memory_budget_bytes" not in b
    assert a["num_blocks"] == 4 * (512 // 16) + 1             # auto: at most 4 sequences of the model's 512
    assert b["num_blocks"] == 2 * (64 // 16) + 1 and b["max_model_len"] == 64 and b["max_num_seqs"] == 2


def test_max_loras_and_max_lora_rank_size_the_adapter_slots(tiny_engine):
    """--max-loras N --max-lora-rank R: the slot stacks reserved at start shrink in the plan by (N x R) / (16 x 64)
    (at 8B the defaults reserve 2.7 GiB), an engine runs with them, and one step mixes at most N adapters (it
    cannot hold more); the flags show in --print-config."""
    from ortllm.cli.serve import engine_overrides
    from ortllm.runtime.artifact import load_artifact
    from ortllm.runtime.config import EngineConfig
    from ortllm.runtime.engine import Engine
    from ortllm.runtime.memory_plan import plan_memory
    from ortllm.runtime.sampling_params import SamplingParams

    small = engine_overrides({"max_loras": 2, "max_lora_rank": 8})
    assert small == {"max_slots": 2, "max_rank": 8, "max_adapters_per_batch": 2}
    art = load_artifact(tiny_engine, verify=False)
    full_plan = plan_memory(EngineConfig.from_overrides(tiny_engine), art)
    small_plan = plan_memory(EngineConfig.from_overrides(tiny_engine, **small), art)
    assert small_plan.adapters * (16 * 64) == full_plan.adapters * (2 * 8), (small_plan.adapters, full_plan.adapters)
    with Engine.from_artifact(tiny_engine, **small) as engine:
        assert engine.config.adapters.max_slots == 2 and engine.config.scheduler.max_adapters_per_batch == 2
        assert len(engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0].token_ids) == 2

    p = _serve(tiny_engine, "--max-loras", 2, "--max-lora-rank", 8, "--print-config")
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("max_loras") and " 2 " in line for line in p.stdout.splitlines()), p.stdout
