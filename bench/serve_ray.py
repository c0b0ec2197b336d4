"""`serve-ray` scenario (`make bench-ray`): HTTP throughput of `ortllm serve --ray` (2 replicas x 1 thread) against
the single-process `ortllm serve --threads 2` on the same artifact, both up at once, load alternating between them
(docs/notes/service.md).

Per round and system: a closed loop of CONCURRENCY streaming clients over REQUESTS random 64-token prompts (fresh
per round: no prefix-cache hits), 64 new tokens, greedy, ignore_eos; output tokens / wall. Rows per system:
output_tokens_per_s and ttft_p50 (ms) over the rounds, the requests that failed; and "ray 2x1 / single 1x2"
throughput_ratio, round by round (the two ran back to back). The servers' logs go to log_dir."""
from __future__ import annotations

import sys
from pathlib import Path

from ortllm.runtime.artifact import read_manifest

from .child_server import free_port
from .client import random_prompts
from .results import row
from .serve import ServeProcess, run_load, summarize

SCENARIO = "serve-ray"
CONCURRENCY, REQUESTS, MAX_TOKENS, ROUNDS = 16, 48, 64, 3
SINGLE, RAY = "single 1x2", "ray 2x1"


class RayServeProcess(ServeProcess):
    def __init__(self, artifact: Path, log_path: Path, replicas: int, threads_per_replica: int):
        super().__init__(artifact, log_path, start_timeout=300.0, grace=60.0)
        port = free_port()
        self.cmd = [sys.executable, "-m", "ortllm", "serve", str(artifact), "--ray", "--port", str(port),
                    "--replicas", str(replicas), "--threads-per-replica", str(threads_per_replica),
                    "--drain-timeout", "5", "--spec-max-tokens", "0"]   # as ServeProcess: plain decoding


def run(artifact: Path, rounds: int = ROUNDS, log_dir: Path = Path("bench-results/serve-ray"),
        progress=None) -> list[dict]:
    progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    artifact, log_dir = Path(artifact), Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    vocab = read_manifest(artifact).model.vocab_size     # (the manifest's top level has none: was 49152 always)
    tok = {SINGLE: [], RAY: []}
    ttft = {SINGLE: [], RAY: []}
    failed = {SINGLE: 0, RAY: 0}
    with ServeProcess(artifact, log_dir / "single.log", threads=2) as single, \
            RayServeProcess(artifact, log_dir / "ray.log", 2, 1) as on_ray:
        for r in range(rounds):
            for name, srv in ((SINGLE, single), (RAY, on_ray)):
                prompts = random_prompts(vocab, REQUESTS, 64, seed=1000 * r + len(name))
                wall, results = run_load(srv.url, prompts, MAX_TOKENS, CONCURRENCY)
                s = summarize(wall, results)
                failed[name] += sum(not hasattr(x, "tokens") for x in results)
                tok[name].append(s["output_tokens_per_s"])
                ttft[name].append(s["ttft_p50"])
                progress(f"serve-ray round {r + 1}/{rounds} {name}: {s['output_tokens_per_s']:.1f} tok/s, "
                         f"TTFT p50 {s['ttft_p50']:.1f} ms")
    shape = {"requests": REQUESTS, "max_tokens": MAX_TOKENS}
    rows = []
    for name in (SINGLE, RAY):
        rows += [row(SCENARIO, name, CONCURRENCY, "output_tokens_per_s", tok[name], "tok/s", failed=failed[name],
                     **shape),
                 row(SCENARIO, name, CONCURRENCY, "ttft_p50", ttft[name], "ms", **shape)]
    rows.append(row(SCENARIO, f"{RAY} / {SINGLE}", CONCURRENCY, "throughput_ratio",
                    [a / b for a, b in zip(tok[RAY], tok[SINGLE])], "ratio", **shape))
    return rows
