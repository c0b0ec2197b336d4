"""Shared by the peer drivers: scenarios, prompts and the one-JSON-line protocol.

Standard library and numpy only: the drivers run inside .venv-peers, which has no ortllm installed.

Scenarios (docs/architecture.md, Benchmarks; the same for ortllm in runner.py):
  decode        prompt 64 random tokens, 128 new tokens, batch B; aggregate decode tok/s =
                B * (new - 1) tokens after the first (prefill) token / the time they took
  prefill       prompt 512 random tokens, B = 1; seconds until the first token (prompt forward + argmax)
  long-context  prompt 1984 random tokens, 64 new (context 2048), B = 1; decode tok/s as for `decode`
Greedy (argmax) and EOS is never a stop: every sequence gets exactly `new` tokens.

Logits (held-out quality, ortllm.bench.quality): a request {"logits": [token ids], "out": PATH} makes the driver
run the window in one forward pass and save every position's logits, float32 [len(ids), vocab], to PATH (.npy);
the bench scores them against its fp32 reference and deletes the file. One window at a time: 512 x 49152 x 4 B
is ~100 MB.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import numpy as np

SCENARIOS = {
    # name: (prompt tokens, new tokens, metric, unit)
    "decode": (64, 128, "decode_tokens_per_s", "tok/s"),
    "prefill": (512, 1, "time_to_first_token", "s"),
    "long-context": (1984, 64, "decode_tokens_per_s", "tok/s"),
}
FIRST_TOKEN = 3          # like ortllm.bench.engine: ids below 3 are <|endoftext|>, <|im_start|>, <|im_end|>


def prompts(vocab: int, batch: int, length: int, seed: int) -> np.ndarray:
    """[batch, length] int32 random token ids; a new seed per run keeps prefix caches cold."""
    return np.random.default_rng(seed).integers(FIRST_TOKEN, vocab, (batch, length)).astype(np.int32)


def metric(scenario: str, batch: int, prefill_s: float, decode_s: float, new: int) -> float:
    if scenario == "prefill":
        return prefill_s
    return batch * (new - 1) / decode_s


class Clock:
    """t_first: after the first token of every sequence exists; t_end: after the last."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.t_first = self.t_end = None

    def first(self):
        self.t_first = time.perf_counter()

    def end(self):
        self.t_end = time.perf_counter()

    @property
    def prefill_s(self):
        return self.t_first - self.t0

    @property
    def decode_s(self):
        return self.t_end - self.t_first


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="decode")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (same shapes)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="override the scenario's (smoke tests only)")
    p.add_argument("--new-tokens", type=int, default=None, help="override the scenario's (smoke tests only)")
    p.add_argument("--serve", action="store_true",
                   help="keep the model loaded: read one JSON request a line on stdin "
                        "({scenario, batch, repeats, seed, warmup}), answer one JSON line each")
    return p


def main(driver_cls, argv=None) -> int:
    """driver_cls(args) loads the model; .run(batch, prompt_len, new, seed) -> (prefill_s, decode_s, generated)."""
    p = base_parser(driver_cls.__doc__.splitlines()[0])
    driver_cls.add_arguments(p)
    args = p.parse_args(argv)
    if args.serve:
        _die_with_parent()
    out = sys.stdout
    sys.stdout = sys.stderr          # library chatter must not corrupt the JSON lines
    try:
        t = time.perf_counter()
        driver = driver_cls(args)
        load_s = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - one line for the runner, the trace for a person
        traceback.print_exc()
        print(json.dumps({"ok": False, "error": f"load failed: {type(e).__name__}: {e}"}), file=out, flush=True)
        return 1
    if not args.serve:
        reply = handle(driver, vars(args), load_s)
        print(json.dumps(reply), file=out, flush=True)
        return 0 if reply["ok"] else 1
    print(json.dumps({"ok": True, "ready": True, "load_s": load_s, "info": driver.info()}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = {**vars(args), **json.loads(line)}
        if req.get("quit"):
            break
        print(json.dumps(handle(driver, req, None)), file=out, flush=True)
    return 0


def answer_once(work) -> int:
    """A one-shot driver's whole run (the LoRA trace drivers): work() -> a reply dict with "ok", printed as one JSON
    line on stdout; meanwhile library chatter goes to stderr, and an exception becomes {"ok": false, "error": ...}
    (its trace on stderr). Returns the exit status."""
    _die_with_parent()
    out, sys.stdout = sys.stdout, sys.stderr          # library chatter must not corrupt the JSON line
    try:
        reply = work()
    except Exception as e:  # noqa: BLE001 - one line for the bench, the trace for a person
        traceback.print_exc()
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(reply), file=out, flush=True)
    return 0 if reply["ok"] else 1


def _die_with_parent() -> None:
    """Linux: SIGTERM this driver when the bench process that started it dies (no orphans left computing)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def handle(driver, req: dict, load_s) -> dict:
    if req.get("logits") is not None:
        return handle_logits(driver, req)
    scenario, batch = req["scenario"], int(req["batch"])
    prompt_len, new, name, unit = SCENARIOS[scenario]
    prompt_len = int(req.get("prompt_tokens") or prompt_len)
    new = int(req.get("new_tokens") or new)
    try:
        for w in range(int(req.get("warmup", 0))):
            driver.run(batch, prompt_len, new, 10_000 + int(req["seed"]) + w)
        samples, generated = [], None
        for r in range(int(req["repeats"])):
            prefill_s, decode_s, generated = driver.run(batch, prompt_len, new, int(req["seed"]) + r)
            if any(g != new for g in generated):
                raise RuntimeError(f"generated {generated} tokens per sequence, wanted {new}")
            samples.append(metric(scenario, batch, prefill_s, decode_s, new))
        return {"ok": True, "scenario": scenario, "batch": batch, "metric": name, "unit": unit,
                "samples": samples, "generated_per_sequence": generated, "prompt_tokens": prompt_len,
                "new_tokens": new,
                "threads": req["threads"], "load_s": load_s, "info": driver.info()}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return {"ok": False, "scenario": scenario, "batch": batch, "error": f"{type(e).__name__}: {e}"}


def handle_logits(driver, req: dict) -> dict:
    """driver.logits(ids) -> float32 [n, vocab] of every position, saved to req["out"] (.npy)."""
    ids = np.asarray(req["logits"], np.int64)
    try:
        if ids.ndim != 1 or len(ids) < 2:
            raise ValueError(f"a logits window needs >= 2 token ids in a flat list; got shape {ids.shape}")
        t = time.perf_counter()
        out = np.ascontiguousarray(driver.logits(ids), dtype=np.float32)
        seconds = time.perf_counter() - t
        if out.shape[0] != len(ids):
            raise RuntimeError(f"{len(ids)} positions in, {out.shape[0]} rows of logits out")
        np.save(req["out"], out)
        return {"ok": True, "out": req["out"], "shape": list(out.shape), "seconds": seconds}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return {"ok": False, "error": f"logits: {type(e).__name__}: {e}"}
