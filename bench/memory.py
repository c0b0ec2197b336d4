"""`memory` scenario: KV bytes per token and peak RSS (docs/architecture.md, Benchmarks).

ortllm is measured in a fresh child process (`python -m ortllm.bench.memory ARTIFACT ...`), so nothing the
bench process loaded before counts; the child reads its own VmHWM (peak resident set, /proc/self/status):
  kv_bytes_per_token     bytes of KV pool per cached token, all layers (bytes_per_block / block_size)   batch 1
  peak_rss_at_load       VmHWM once Engine.from_artifact returned (session built, pool allocated, warmed) batch 0
  peak_rss_after_decode  VmHWM after a batch of B = 16 requests (64-token prompts, 128 new tokens)      batch 16
Peers (--peers): each driver of bench/peers/ in its own process; the bench reads the driver's VmHWM from
/proc/PID/status once it is ready (model loaded) and after one `decode` request at B = 16. Those figures
include each peer's Python and libraries (torch for transformers), as ortllm's include its own.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import BenchError
from .proc_status import MIB, status_bytes
from .results import row

BATCH = 16
NEW_TOKENS, QUICK_NEW_TOKENS = 128, 16


def peak_rss_bytes() -> int:
    """This process' peak resident set: VmHWM, or getrusage's ru_maxrss (KiB on Linux) where /proc is absent."""
    hwm = status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def kv_bytes_per_token(pool) -> float:
    """KV pool bytes per cached token over all layers (K and V, plus the 8-bit caches' scales); pool: Engine.kv_pool."""
    return pool.bytes_per_token


def child(artifact: Path, batch: int, new_tokens: int, threads: int | None) -> dict:
    """Runs in the fresh process: load, read VmHWM, decode one batch, read VmHWM again."""
    import numpy as np

    from ortllm.runtime.engine import Engine

    from .engine import PLAIN, decode_run

    after_imports = status_bytes("VmRSS")
    overrides = {"threads": threads} if threads else {}
    with Engine.from_artifact(artifact, max_num_seqs=batch, **PLAIN, **overrides) as engine:
        at_load = peak_rss_bytes()
        decode_run(engine, batch, np.random.default_rng(0), new_tokens=new_tokens)
        after_decode = peak_rss_bytes()
        pool = engine.kv_pool
        return {"kv_bytes_per_token": kv_bytes_per_token(pool), "kv": pool.kv, "block_size": pool.block_size,
                "kv_pool_bytes": pool.pool_bytes, "num_blocks": pool.num_blocks,
                "rss_after_imports": after_imports, "peak_rss_at_load": at_load, "peak_rss_after_decode": after_decode}


def measure(artifact: Path, batch: int = BATCH, new_tokens: int = NEW_TOKENS, threads: int | None = None,
            timeout: float = 900.0) -> dict:
    """child() in a fresh `python -m ortllm.bench.memory` process; its JSON line as a dict."""
    cmd = [sys.executable, "-m", "ortllm.bench.memory", str(artifact), "--batch", str(batch),
           "--new-tokens", str(new_tokens), *(["--threads", str(threads)] if threads else [])]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"the memory child did not finish within {timeout:.0f} s: {' '.join(cmd)}") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise BenchError(f"the memory child failed: {last.removeprefix('ortllm: error: ')}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _peer_rows(peers, artifact: Path, repeats: int, threads: int, new_tokens: int, log_dir: Path) -> list[dict]:
    """Each available peer driver on the weights of the artifact's recipe, one fresh process per repeat: VmHWM
    when ready and after decode at B = 16."""
    from .peer_runner import PeerProcess, available, model_of

    rows = []
    for spec in available(peers, model_of(artifact)):
        load, decode = [], []
        for _ in range(repeats):
            try:
                proc = PeerProcess(spec, threads, log_dir)
            except (RuntimeError, OSError, json.JSONDecodeError) as e:
                print(f"warning: peer {spec.system} skipped in memory: {e}", file=sys.stderr)
                break
            try:
                load.append(status_bytes("VmHWM", proc.proc.pid))
                proc.request("decode", BATCH, repeats=1, seed=0, warmup=0, new_tokens=new_tokens)
                decode.append(status_bytes("VmHWM", proc.proc.pid))
            finally:
                proc.close()
        if load and None not in load + decode:
            rows += [row("memory", spec.system, 0, "peak_rss_at_load", [b / MIB for b in load], "MiB"),
                     row("memory", spec.system, BATCH, "peak_rss_after_decode", [b / MIB for b in decode], "MiB",
                         new_tokens=new_tokens)]
    return rows


def run(artifact: Path, repeats: int = 3, threads: int | None = None, quick: bool = False, peers=(),
        log_dir: Path | None = None) -> list[dict]:
    """Rows {scenario "memory", system, batch, metric, median, min, max, unit}; `repeats` fresh processes each."""
    new_tokens = QUICK_NEW_TOKENS if quick else NEW_TOKENS
    runs = [measure(artifact, BATCH, new_tokens, threads) for _ in range(repeats)]
    first = runs[0]
    pool = {"kv": first["kv"], "block_size": first["block_size"], "kv_pool_mib": first["kv_pool_bytes"] / MIB,
            "num_blocks": first["num_blocks"]}
    rows = [row("memory", "ortllm", 1, "kv_bytes_per_token", [r["kv_bytes_per_token"] for r in runs], "bytes",
                kv=first["kv"], block_size=first["block_size"]),
            row("memory", "ortllm", 0, "peak_rss_at_load", [r["peak_rss_at_load"] / MIB for r in runs], "MiB",
                rss_after_imports_mib=(first["rss_after_imports"] or 0) / MIB, **pool),
            row("memory", "ortllm", BATCH, "peak_rss_after_decode", [r["peak_rss_after_decode"] / MIB for r in runs],
                "MiB", new_tokens=new_tokens, **pool)]
    if peers:
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="ortllm-peers-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        rows += _peer_rows(peers, artifact, repeats, threads or 2, new_tokens, log_dir)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ortllm.bench.memory",
                                description="the memory child: one JSON line of KV bytes per token and peak RSS")
    p.add_argument("artifact", type=Path)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    from ortllm.runtime.errors import OrtllmError
    try:
        out = child(a.artifact, a.batch, a.new_tokens, a.threads)
    except OrtllmError as e:
        print(f"ortllm: error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
