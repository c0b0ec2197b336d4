"""`make soak`: a live `ortllm serve` under mixed load for a bounded time, then checks that it stayed sound.

Clients (threads) loop until the deadline over chat and completions, streaming or not, some abandoned
mid-stream; afterwards: no 5xx and no transport errors, /health ok, KV blocks back to baseline, and the
server's RSS in the second half of the run within 10% of the first half's peak (no steady leak).
Talks only to 127.0.0.1; every loop is bounded by --seconds.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metric(url: str, name: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def client(url: str, deadline: float, seed: int, counts: Counter, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        chat, stream, abandon = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.1
        body = {"max_tokens": rng.randint(4, 64), "temperature": rng.choice([0, 0.7]), "stream": stream}
        text = f"Request {rng.randint(0, 10**6)}: tell me about " + rng.choice(["rivers", "stars", "bread", "code"])
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        path = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            with requests.post(url + path, json=body, stream=stream, timeout=120) as r:
                key = f"{r.status_code}"
                if stream and r.status_code == 200:
                    for i, line in enumerate(r.iter_lines()):
                        if abandon and i >= 2:
                            key = "abandoned"
                            break
                        if line.startswith(b'data: {"error"'):
                            key = "stream-error"
                else:
                    r.content
        except requests.RequestException as e:
            key = f"transport:{type(e).__name__}"
        with lock:
            counts[key] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("soak-results.json"))
    a = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "ortllm", "serve", str(a.artifact), "--port", str(port),
                               "--max-queued", "64"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if server.poll() is not None:
                print(server.stderr.read(), file=sys.stderr)
                return 1
            time.sleep(0.5)
        baseline = metric(url, "ortllm_kv_blocks_in_use")
        counts: Counter = Counter()
        lock = threading.Lock()
        start = time.monotonic()
        deadline = start + a.seconds
        threads = [threading.Thread(target=client, args=(url, deadline, k, counts, lock)) for k in range(a.clients)]
        for t in threads:
            t.start()
        samples = []
        while any(t.is_alive() for t in threads):
            samples.append((time.monotonic() - start, rss_mib(server.pid)))
            time.sleep(2)
        for t in threads:
            t.join()
        time.sleep(1)
        health = requests.get(url + "/health", timeout=10)
        in_use = metric(url, "ortllm_kv_blocks_in_use")
        half = a.seconds / 2
        first = max((r for t, r in samples if t <= half), default=0.0)
        second = max((r for t, r in samples if t > half), default=0.0)
        bad = {k: v for k, v in counts.items() if k.startswith(("5", "transport", "stream-error"))}
        checks = {
            "no 5xx, stream or transport errors": not bad,
            "health ok": health.status_code == 200,
            "kv blocks back to baseline": in_use <= baseline,
            "rss second half <= 1.10 x first half peak": second <= 1.10 * first,
        }
        result = {"seconds": a.seconds, "clients": a.clients, "responses": dict(counts),
                  "rss_mib_first_half_peak": first, "rss_mib_second_half_peak": second,
                  "kv_blocks_in_use": {"baseline": baseline, "after": in_use}, "checks": checks}
        a.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return 0 if all(checks.values()) else 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    sys.exit(main())
