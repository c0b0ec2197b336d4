"""`ortllm serve` sized for many long contexts, checked end to end (minutes; `make serve-sizing`, never make test).

    python ci/serve_sizing.py ARTIFACT [--parallel 64] [--ctx-size 2048] [--max-tokens 96] [--kv-cache-size auto]
                                       [--out RESULT.json]

Starts `ortllm serve ARTIFACT --parallel P --ctx-size C --kv-cache-size auto` (or GiB) on 127.0.0.1, keeps its printed
memory plan, then opens P concurrent streams, each a distinct prompt of C - max_tokens token ids (no prefix is
shared, so every stream holds its own ~C tokens of KV) generating max_tokens tokens with ignore_eos. It passes if
every stream ends with finish_reason "length", [DONE] and max_tokens completion tokens (nothing lost, no error),
while /health and /metrics are sampled for the most sequences running at once, KV usage and preemptions. SIGTERM
then drains and the server must exit 0. The result (plan, timings, counts) is printed and written as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests


def start(artifact: Path, args) -> tuple[subprocess.Popen, str, list[str]]:
    exe = Path(sys.executable).with_name("ortllm")
    cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "ortllm"]), "serve",
           str(artifact), "--port", "0", "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size),
           "--kv-cache-size", args.kv_cache_size, "--max-queued", str(args.parallel), "--request-timeout", "14400"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    plan = []
    end = time.monotonic() + 600
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"ortllm serve exited ({proc.returncode}) before serving; its output:\n" + "".join(plan))
        plan.append(line)
        if m := re.search(r"at (http://127\.0\.0\.1:\d+) ", line):
            print("".join(plan), end="", flush=True)
            return proc, m.group(1), [ln.rstrip() for ln in plan]
    proc.kill()
    raise SystemExit("ortllm serve did not start within 600 s")


def stream(url: str, prompt: list[int], max_tokens: int, out: dict) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    out.update(status=None, finish=None, done=False, completion_tokens=None, error=None)
    try:
        with requests.post(url + "/v1/completions", json=body, stream=True, timeout=14400) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == b"data: [DONE]":
                    out["done"] = True
                elif line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        out["error"] = chunk["error"]
                    for c in chunk.get("choices", []):
                        if out.get("first_token_s") is None and c.get("text"):
                            out["first_token_s"] = time.monotonic() - t0
                        out["finish"] = c.get("finish_reason") or out["finish"]
                    if chunk.get("usage"):
                        out["completion_tokens"] = chunk["usage"]["completion_tokens"]
    except requests.RequestException as e:
        out["error"] = str(e)
    out["seconds"] = time.monotonic() - t0


def sample(url: str, stop: threading.Event, seen: dict, results: list[dict]) -> None:
    t0, last = time.monotonic(), 0.0
    while not stop.wait(1.0):
        try:
            text = requests.get(url + "/metrics", timeout=10).text
        except requests.RequestException:
            continue
        for name, key in (("ortllm_requests_running", "max_running"), ("ortllm_kv_usage_ratio", "max_kv_usage"),
                          ("ortllm_requests_waiting", "max_waiting")):
            m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
            if m:
                seen[key] = max(seen.get(key, 0.0), float(m.group(1)))
        m = re.search(r"^ortllm_preemptions_total(?:{[^}]*})? ([0-9.e+]+)$", text, re.M)
        if m:
            seen["preemptions"] = float(m.group(1))
        if time.monotonic() - last >= 30:          # progress, for a run of many minutes
            last = time.monotonic()
            running = re.search(r"^ortllm_requests_running ([0-9.e+]+)$", text, re.M)
            usage = re.search(r"^ortllm_kv_usage_ratio ([0-9.e+]+)$", text, re.M)
            print(f"[{last - t0:6.0f} s] finished {sum('seconds' in r for r in results)}/{len(results)}, running "
                  f"{running.group(1) if running else '?'}, KV {float(usage.group(1)) if usage else 0:.0%}, "
                  f"preemptions {seen.get('preemptions', 0):.0f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--parallel", type=int, default=64)
    ap.add_argument("--ctx-size", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--kv-cache-size", default="auto", help="GiB or auto (a small pool: preemption at scale)")
    ap.add_argument("--out", type=Path, default=Path("serve-sizing.json"))
    args = ap.parse_args()

    proc, url, plan = start(args.artifact, args)
    try:
        limits = requests.get(url + "/v1/models", timeout=30).json()["data"][0]["limits"]
        vocab = json.loads((args.artifact / "config.json").read_text()).get("vocab_size", 32000)
        rng = random.Random(0)
        prompt_len = args.ctx_size - args.max_tokens
        prompts = [[rng.randrange(100, vocab) for _ in range(prompt_len)] for _ in range(args.parallel)]
        results = [{} for _ in prompts]
        seen: dict = {}
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(url, stop, seen, results), daemon=True)
        sampler.start()
        t0 = time.monotonic()
        threads = [threading.Thread(target=stream, args=(url, p, args.max_tokens, r)) for p, r in zip(prompts, results)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        stop.set()
        ok = [r for r in results if r["status"] == 200 and r["finish"] == "length" and r["done"]
              and r["completion_tokens"] == args.max_tokens and not r["error"]]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        summary = {
            "command": " ".join(sys.argv), "artifact": str(args.artifact), "parallel": args.parallel,
            "ctx_size": args.ctx_size, "kv_cache_size": args.kv_cache_size, "prompt_tokens": prompt_len,
            "max_tokens": args.max_tokens,
            "memory_plan": [ln for ln in plan if ln.startswith("  ")], "limits": limits,
            "streams": len(results), "complete": len(ok), "errors": [r for r in results if r not in ok][:5],
            "wall_s": round(wall, 1), "first_token_s_max": round(max(r.get("first_token_s") or 0 for r in results), 1),
            "tokens_generated": sum(r["completion_tokens"] or 0 for r in results),
            "prompt_tokens_total": prompt_len * len(results), "observed": seen, "server_exit": code,
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=Path(__file__).parent).stdout.strip(),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2))
        print(json.dumps({k: v for k, v in summary.items() if k != "memory_plan"}, indent=2))
        passed = len(ok) == args.parallel and code == 0
        print(f"serve-sizing: {'PASS' if passed else 'FAIL'}: {len(ok)}/{args.parallel} streams of "
              f"{prompt_len} + {args.max_tokens} tokens complete in {wall:.0f} s; server exit {code}")
        return 0 if passed else 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
