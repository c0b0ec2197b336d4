"""LoRA scenarios: the cost of adapters in mixed batches (docs/architecture.md, Benchmarks).

lora-overhead: 16 concurrent sequences decoding, all base vs spread over 1, 2, 4 distinct adapters of rank
8, 16 or 32 (LoRA on q, k, v, o), measured two ways:
  - end to end: each configuration's batch of requests runs right after a base batch; decode tokens/s and the
    ratio to that neighbour. Runs last seconds, and on a shared VM throughput drifts by tens of percent
    over seconds, so a handful of pairs cannot resolve a few percent;
  - paired steps: the same decode step (16 sequences at context 128, in the engine's own session, pool and
    adapter slots) run with all tokens on the base and with the adapters, alternating step by step (order
    ABBA), so both halves of a pair see the same machine; step throughput ratio = base time / LoRA time.
lora-trace: requests arriving with gamma-distributed gaps, each for an adapter drawn Zipf (s = 1) over 4 or
16 adapters of ranks 8/16/32; metric throughput and time to first token.
Adapters are synthetic (seeded random A, B in PEFT's file format), written into a copy of the artifact.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.contract import ModelConfig
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.runtime.scheduler import ScheduledSeq

from .engine import PLAIN, decode_run
from .errors import BenchError
from .results import row

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_peft_lora(out: Path, model: ModelConfig, rank: int, seed: int, targets=ATTN) -> Path:
    """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors) with seeded random weights."""
    from safetensors.numpy import save_file

    from ortllm.runtime.adapter_files import target_shapes

    rng = np.random.default_rng(seed)
    shapes, tensors = target_shapes(model), {}
    for i in range(model.num_layers):
        for t in targets:
            n_in, n_out = shapes[t]
            kind = "self_attn" if t in ATTN else "mlp"
            key = f"base_model.model.model.layers.{i}.{kind}.{t}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (0.01 * rng.standard_normal((n_out, rank))).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                         "target_modules": list(targets), "bias": "none"}))
    return out


def _with_adapters(artifact: Path, work: Path, ranks: list[int]) -> tuple[Path, list[str]]:
    art = work / "artifact"
    shutil.copytree(artifact, art)
    model = read_manifest(art).model
    names = []
    for k, r in enumerate(ranks):
        add_adapter(art, write_peft_lora(work / f"peft{k}", model, r, seed=k), f"bench{k}")
        names.append(f"bench{k}")
    return art, names


def paired_steps(engine: Engine, adapters: list[str], batch: int = 16, context: int = 128, pairs: int = 100,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per decode step of `batch` sequences at `context` cached tokens, (all base, request i on
    adapters[i % n]), pair by pair. Runs on the engine's runner directly (ModelRunner.execute, the call the
    engine makes per step, with its Python input preparation): call only while the engine is idle, on an
    engine without the prefix cache (the sequences are written into blocks 1.. of the pool)."""
    runner = engine.runner
    context = min(context, engine.context_length - 2)      # tiny test models have short contexts
    per_seq = -(-(context + 1) // runner.block_size)
    if 1 + batch * per_seq > runner.num_blocks:
        raise BenchError(f"{batch} sequences at context {context} need {batch * per_seq} KV blocks; the pool has "
                         f"{runner.num_blocks - 1}: lower the batch or the context")
    rng = np.random.default_rng(seed)
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    runner.execute([ScheduledSeq(f"p{i}", rng.integers(3, runner.vocab_size, context).tolist(), 0, tables[i], True,
                                 None) for i in range(batch)])                # prefill: [batch x context] once
    slots, failed = engine.adapters.activate(list(adapters))
    if failed:
        raise BenchError("could not load adapters into slots: " + "; ".join(f"{n}: {e}" for n, e in failed.items()))
    last = rng.integers(3, runner.vocab_size, batch).tolist()

    def seqs(with_lora: bool) -> list[ScheduledSeq]:   # the decode step at position `context` (rewritten)
        return [ScheduledSeq(f"p{i}", [last[i]], context, tables[i], True,
                             adapters[i % len(adapters)] if with_lora else None) for i in range(batch)]

    def step(with_lora: bool) -> float:
        batch_seqs = seqs(with_lora)
        t0 = time.perf_counter()
        runner.execute(batch_seqs, adapter_slots=slots)
        return time.perf_counter() - t0

    if np.array_equal(runner.execute(seqs(False), slots).copy(), runner.execute(seqs(True), slots)):
        raise RuntimeError(f"adapters {adapters} left the logits unchanged: the LoRA step would time a no-op")
    for _ in range(3):                    # warm-up: both variants
        step(False), step(True)
    base, lora = np.empty(pairs), np.empty(pairs)
    for k in range(pairs):
        if k % 2 == 0:
            base[k], lora[k] = step(False), step(True)
        else:
            lora[k], base[k] = step(True), step(False)
    return base, lora


def run_overhead(artifact: Path, ranks=(8, 16, 32), counts=(1, 2, 4), batch: int = 16, repeats: int = 3,
                 threads: int | None = None, step_pairs: int = 100) -> list[dict]:
    """End to end: each configuration (rank r, n distinct adapters) runs right after a base run of the same
    batch, and its ratio is taken to that neighbour. Then `step_pairs` paired steps per configuration."""
    rng = np.random.default_rng(0)
    overrides = {"threads": threads} if threads else {}
    configs = [(r, n) for r in ranks for n in counts]
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-bench-") as tmp:
        art, names = _with_adapters(Path(artifact), Path(tmp), [r for r in ranks for _ in range(max(counts))])
        by_rank = {r: names[k * max(counts):(k + 1) * max(counts)] for k, r in enumerate(ranks)}
        with Engine.from_artifact(art, max_num_seqs=batch, max_adapters_per_batch=max(counts),
                                  enable_prefix_cache=False, **PLAIN, **overrides) as engine:
            decode_run(engine, batch, rng, new_tokens=8)                      # warm-up
            base: list[float] = []
            tps: dict[tuple, list[float]] = {c: [] for c in configs}
            ratio: dict[tuple, list[float]] = {c: [] for c in configs}
            for _ in range(repeats):                                         # base, (8, 1), base, (8, 2), ...
                for r, n in configs:
                    b = decode_run(engine, batch, rng, new_tokens=64)[0]
                    x = decode_run(engine, batch, rng, by_rank[r][:n], new_tokens=64)[0]
                    base.append(b)
                    tps[(r, n)].append(x)
                    ratio[(r, n)].append(x / b)
            steps = {c: paired_steps(engine, by_rank[c[0]][:c[1]], batch, pairs=step_pairs) for c in configs}
    rows = [row("lora-overhead", "ortllm", batch, "decode_tokens_per_s (base)", base, "tok/s")]
    for (r, n) in configs:
        name = f"{n} adapters rank {r}"
        b, x = steps[(r, n)]
        rows.append(row("lora-overhead", "ortllm", batch, f"decode_tokens_per_s ({name})", tps[(r, n)], "tok/s"))
        rows.append(row("lora-overhead", "ortllm", batch, f"throughput_vs_base ({name})", ratio[(r, n)], "ratio"))
        rows.append(row("lora-overhead", "ortllm", batch, f"step_ms (base, paired with {name})", (b * 1e3).tolist(),
                        "ms"))
        rows.append(row("lora-overhead", "ortllm", batch, f"step_ms ({name})", (x * 1e3).tolist(), "ms"))
        q25, q75 = np.percentile(b / x, [25, 75])
        rows.append(row("lora-overhead", "ortllm", batch, f"step_throughput_vs_base ({name})", (b / x).tolist(),
                        "ratio", p25=float(q25), p75=float(q75)))
    return rows


def run_trace(artifact: Path, n_adapters: int, requests: int = 64, rate: float = 4.0, threads: int | None = None,
              seed: int = 0) -> list[dict]:
    """Gamma arrivals (shape 2, mean gap 1/rate s), adapter ~ Zipf(s=1) over n_adapters, ranks 8/16/32."""
    rng = np.random.default_rng(seed)
    ranks = [(8, 16, 32)[k % 3] for k in range(n_adapters)]
    zipf = 1.0 / np.arange(1, n_adapters + 1)
    zipf /= zipf.sum()
    overrides = {"threads": threads} if threads else {}
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-trace-") as tmp:
        art, names = _with_adapters(Path(artifact), Path(tmp), ranks)
        with Engine.from_artifact(art, max_num_seqs=16, **PLAIN, **overrides) as engine:
            vocab = engine.runner.vocab_size
            gaps = rng.gamma(2.0, 1.0 / (2.0 * rate), requests)
            picks = rng.choice(n_adapters, requests, p=zipf)
            handles, t0 = [], time.monotonic()
            for gap, k in zip(gaps, picks):
                time.sleep(gap)
                handles.append(engine.submit(rng.integers(3, vocab, int(rng.integers(16, 128))).tolist(),
                                             SamplingParams(max_tokens=int(rng.integers(16, 96)), temperature=0.0,
                                                            ignore_eos=True, adapter=names[k])))
            outs = [h.result() for h in handles]
            wall = time.monotonic() - t0
    ttft = [h.first_token_time - h.submitted for h in handles]
    tokens = sum(len(o.token_ids) for o in outs)
    scen = f"lora-trace ({n_adapters} adapters)"
    return [row(scen, "ortllm", 16, "throughput", [tokens / wall], "tok/s"),
            row(scen, "ortllm", 16, "ttft_p50", [float(np.percentile(ttft, 50))], "s"),
            row(scen, "ortllm", 16, "ttft_p99", [float(np.percentile(ttft, 99))], "s")]
