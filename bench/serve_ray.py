"""`make bench-ray`: HTTP throughput of `ortllm serve --ray` (2 replicas x 1 thread) against the single-process
`ortllm serve --threads 2` on the same artifact, both up at once, load alternating between them (docs/notes/service.md).

Per round and system: a closed loop of CONCURRENCY streaming clients over REQUESTS random 64-token prompts (fresh
per round: no prefix-cache hits), 64 new tokens, greedy, ignore_eos; output tokens / wall. Prints one JSON line
per round and the medians with min/max and the ratio, with the machine, commit and command."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from .client import random_prompts
from .provenance import command, provenance
from .child_server import free_port
from .serve import ServeProcess, run_load, summarize

CONCURRENCY, REQUESTS, MAX_TOKENS, ROUNDS = 16, 48, 64, 3


class RayServeProcess(ServeProcess):
    def __init__(self, artifact: Path, log_path: Path, replicas: int, threads_per_replica: int):
        super().__init__(artifact, log_path, start_timeout=300.0, grace=60.0)
        port = free_port()
        self.cmd = [sys.executable, "-m", "ortllm", "serve", str(artifact), "--ray", "--port", str(port),
                    "--replicas", str(replicas), "--threads-per-replica", str(threads_per_replica),
                    "--drain-timeout", "5", "--spec-max-tokens", "0"]   # as ServeProcess: plain decoding


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("artifact", type=Path)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--out", type=Path, default=Path("bench-results/serve-ray"))
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((a.artifact / "manifest.json").read_text()).get("vocab_size", 49152)
    tok = {"single 1x2": [], "ray 2x1": []}
    with ServeProcess(a.artifact, a.out / "single.log", threads=2) as single, \
            RayServeProcess(a.artifact, a.out / "ray.log", 2, 1) as on_ray:
        for r in range(a.rounds):
            for name, srv in (("single 1x2", single), ("ray 2x1", on_ray)):
                prompts = random_prompts(min(vocab, 49152), REQUESTS, 64, seed=1000 * r + len(name))
                wall, results = run_load(srv.url, prompts, MAX_TOKENS, CONCURRENCY)
                s = summarize(wall, results)
                failed = sum(not hasattr(x, "tokens") for x in results)
                tok[name].append(s["output_tokens_per_s"])
                print(json.dumps({"round": r, "system": name, "tok_s": round(s["output_tokens_per_s"], 1),
                                  "ttft_p50_ms": round(s["ttft_p50"], 1), "failed": failed}), flush=True)
    med = {k: statistics.median(v) for k, v in tok.items()}
    summary = {**provenance(command("python -m ortllm.bench.serve_ray")),
               "concurrency": CONCURRENCY, "requests": REQUESTS, "max_tokens": MAX_TOKENS,
               **{f"{k} tok/s": f"{med[k]:.1f} (min {min(v):.1f}, max {max(v):.1f})" for k, v in tok.items()},
               "ratio ray/single": round(med["ray 2x1"] / med["single 1x2"], 3)}
    print(json.dumps(summary, indent=1))
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
