"""`ortllm batch` against the engine driven in-process at the same concurrency: what the JSONL plumbing costs.

    python -m ortllm.batch.bench ARTIFACT [--n 128] [--max-tokens 32] [--max-num-seqs 16] [--repeats 2]

Both sides run the same greedy completions (ignore_eos: every request generates max_tokens) with the same
engine settings and the same number in flight (EngineFeeder's cap); runs alternate. The batch side includes
reading, checking and tokenizing the lines and writing the output; engine load is left out of both.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

from .job import BatchOptions, run_batch
from .runner import IN_FLIGHT_PER_SEQ

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()


def prompts(n: int) -> list[str]:
    return [f"Story {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8 + (i * 7) % 56)) for i in range(n)]


def engine_in_process(artifact: Path, texts: list[str], max_tokens: int, max_num_seqs: int) -> dict:
    t_load = time.perf_counter()
    with Engine.from_artifact(artifact, max_num_seqs=max_num_seqs) as engine:
        load_s = time.perf_counter() - t_load
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        cap = min(IN_FLIGHT_PER_SEQ * max_num_seqs, engine.config.scheduler.max_queued + max_num_seqs)
        t0 = time.perf_counter()
        todo, running, tokens = list(reversed(texts)), [], 0
        while todo or running:
            while todo and len(running) < cap:
                running.append(engine.submit(todo.pop(), params))
            tokens += len(running.pop(0).result().token_ids)
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "load_s": load_s, "tokens": tokens}


def batch_job(artifact: Path, texts: list[str], max_tokens: int, max_num_seqs: int, tmp: Path) -> dict:
    src, out = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                       "body": {"prompt": t, "max_tokens": max_tokens, "temperature": 0,
                                                "ignore_eos": True}}) + "\n" for i, t in enumerate(texts)))
    out.unlink(missing_ok=True)
    s = run_batch(artifact, src, out, BatchOptions(max_num_seqs=max_num_seqs, progress=False))
    assert s.ok == len(texts), s
    return {"seconds": s.seconds - s.load_s, "tokens": s.completion_tokens}


def compare(artifact: Path, n: int = 128, max_tokens: int = 32, max_num_seqs: int = 16, repeats: int = 2) -> dict:
    """Median requests/s and generated tokens/s of both sides, and their ratio."""
    texts = prompts(n)
    runs: dict[str, list[dict]] = {"engine": [], "batch": []}
    with tempfile.TemporaryDirectory(prefix="ortllm-batch-bench-") as tmp:
        for _ in range(repeats):
            runs["engine"].append(engine_in_process(artifact, texts, max_tokens, max_num_seqs))
            runs["batch"].append(batch_job(artifact, texts, max_tokens, max_num_seqs, Path(tmp)))
    result = {"n": n, "max_tokens": max_tokens, "max_num_seqs": max_num_seqs, "repeats": repeats}
    for side, rs in runs.items():
        result[side] = {"req_per_s": statistics.median(n / r["seconds"] for r in rs),
                        "tok_per_s": statistics.median(r["tokens"] / r["seconds"] for r in rs),
                        "seconds": [round(r["seconds"], 2) for r in rs]}
    result["engine"]["load_s"] = statistics.median(r["load_s"] for r in runs["engine"])
    result["batch_over_engine"] = result["batch"]["tok_per_s"] / result["engine"]["tok_per_s"]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ortllm.batch.bench", description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args(argv)
    print(json.dumps(compare(a.artifact, a.n, a.max_tokens, a.max_num_seqs, a.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
