"""Paired decode steps, base against adapters (lora-overhead and lora-mix; bench/probes/lora_steps.py): the same
decode step of a batch, in the engine's own session, pool and adapter slots, run with every row on the base model
and with the adapters, alternating step by step (order ABBA), so both halves of a pair see the same machine."""
from __future__ import annotations

import time

import numpy as np

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import adapter_names
from ortllm.runtime.scheduler_messages import ScheduledSeq

from .errors import BenchError


def paired_steps(engine: Engine, adapters: list, batch: int = 16, context: int = 128, pairs: int = 100,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per decode step of `batch` sequences at `context` cached tokens, (all base, request i on
    adapters[i % n]: an adapter's name or a mix, an AdapterSpec of runtime/sampling_params.py), pair by pair. Runs
    the engine's model step directly (Engine.execute, the call the engine makes per step, with its Python input
    preparation): call only while the engine is idle, on an engine without the prefix cache (the sequences are
    written into blocks 1.. of the pool)."""
    pool = engine.kv_pool
    context = min(context, engine.context_length - 2)      # tiny test models have short contexts
    per_seq = -(-(context + 1) // pool.block_size)
    if 1 + batch * per_seq > pool.num_blocks:
        raise BenchError(f"{batch} sequences at context {context} need {batch * per_seq} KV blocks; the pool has "
                         f"{pool.num_blocks - 1}: lower the batch or the context")
    rng = np.random.default_rng(seed)
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    engine.execute([ScheduledSeq(f"p{i}", rng.integers(3, engine.vocab_size, context).tolist(), 0, tables[i], True,
                                 None) for i in range(batch)])                # prefill: [batch x context] once
    slots, failed = engine.adapters.activate(sorted({n for a in adapters for n in adapter_names(a)}))
    if failed:
        raise BenchError("could not load adapters into slots: " + "; ".join(f"{n}: {e}" for n, e in failed.items()))
    last = rng.integers(3, engine.vocab_size, batch).tolist()

    def seqs(with_lora: bool) -> list[ScheduledSeq]:   # the decode step at position `context` (rewritten)
        return [ScheduledSeq(f"p{i}", [last[i]], context, tables[i], True,
                             adapters[i % len(adapters)] if with_lora else None) for i in range(batch)]

    def step(with_lora: bool) -> float:
        batch_seqs = seqs(with_lora)
        t0 = time.perf_counter()
        engine.execute(batch_seqs, adapter_slots=slots)
        return time.perf_counter() - t0

    if np.array_equal(engine.execute(seqs(False), slots).copy(), engine.execute(seqs(True), slots)):
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
