"""The LoRA's share of a decode step, for A/B runs on a loaded host: bench/paired_steps.py's paired steps (16 sequences
at context 128, all base vs request i on adapter i % 4, ABBA, in the engine's own session), several rounds, each timed
by wall clock and by the calling thread's CPU time (with --threads 1 the whole step runs on that thread, so its CPU
time does not count the waits of a shared machine).

    .venv/bin/python bench/probes/lora_steps.py ARTIFACT [--rank 16] [--adapters 4] [--rounds 3] [--pairs 100]
        [--threads N] [--targets q_proj,k_proj,v_proj,o_proj]

Prints per round the base and LoRA step medians and the overhead (LoRA / base - 1), then the rounds' overheads and
their median. Dev tooling.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from ortllm.bench.engine import PLAIN
from ortllm.bench.synthetic_adapters import link_copy, write_peft_lora
from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.engine import Engine
from ortllm.runtime.ops_library import ops_isa
from ortllm.runtime.scheduler_messages import ScheduledSeq

BATCH, CONTEXT = 16, 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    args = ap.parse_args()
    overrides = {"threads": args.threads} if args.threads else {}
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-steps-") as tmp:
        art = link_copy(args.artifact, Path(tmp) / "artifact")
        model, names = read_manifest(art).model, [f"s{k}" for k in range(args.adapters)]
        for k, name in enumerate(names):
            add_adapter(art, write_peft_lora(Path(tmp) / name, model, args.rank, seed=k,
                                             targets=tuple(args.targets.split(","))), name)
        with Engine.from_artifact(art, max_num_seqs=BATCH, max_adapters_per_batch=args.adapters,
                                  enable_prefix_cache=False, **PLAIN, **overrides) as engine:
            rounds = run(engine, names, args.rounds, args.pairs)
    res = np.asarray(rounds) * 100
    print(f"isa {ops_isa()}; overhead % by CPU time {np.round(res[:, 0], 2).tolist()} (median "
          f"{np.median(res[:, 0]):.2f}), by wall time {np.round(res[:, 1], 2).tolist()} (median "
          f"{np.median(res[:, 1]):.2f})")


def run(engine: Engine, names: list[str], rounds: int, pairs: int) -> list[tuple[float, float]]:
    rng = np.random.default_rng(0)
    per_seq = -(-(CONTEXT + 1) // engine.kv_pool.block_size)
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(BATCH)]
    engine.execute([ScheduledSeq(f"p{i}", rng.integers(3, engine.vocab_size, CONTEXT).tolist(), 0, tables[i], True,
                                 None) for i in range(BATCH)])
    slots, failed = engine.adapters.activate(names)
    if failed:
        raise SystemExit(f"could not load adapters: {failed}")
    last = rng.integers(3, engine.vocab_size, BATCH).tolist()

    def step(lora: bool) -> tuple[float, float]:
        seqs = [ScheduledSeq(f"p{i}", [last[i]], CONTEXT, tables[i], True, names[i % len(names)] if lora else None)
                for i in range(BATCH)]
        cpu, wall = time.thread_time(), time.perf_counter()
        engine.execute(seqs, adapter_slots=slots)
        return time.thread_time() - cpu, time.perf_counter() - wall

    for _ in range(3):
        step(False), step(True)
    out = []
    for k in range(rounds):
        base, lora = [], []
        for j in range(pairs):
            if j % 2 == 0:
                base.append(step(False)), lora.append(step(True))
            else:
                lora.append(step(True)), base.append(step(False))
        b, x = np.median(base, axis=0), np.median(lora, axis=0)
        out.append((x[0] / b[0] - 1, x[1] / b[1] - 1))
        print(f"round {k}: base {b[1] * 1e3:.2f} ms ({BATCH / b[1]:.0f} tok/s, CPU {b[0] * 1e3:.2f} ms), LoRA "
              f"{x[1] * 1e3:.2f} ms ({BATCH / x[1]:.0f} tok/s, CPU {x[0] * 1e3:.2f} ms): overhead wall "
              f"{100 * out[-1][1]:.2f}%, CPU {100 * out[-1][0]:.2f}%", flush=True)
    return out


if __name__ == "__main__":
    main()
