"""Embeddings' throughput beside generation, over HTTP on 127.0.0.1: texts/s of POST /v1/embeddings and generated
tokens/s of POST /v1/chat/completions, each alone and both at once on one server (one engine: the embeddings
are prefill-only rows of the same batches). docs/notes/service.md records the figures.

    .venv/bin/python bench/probes/embed_throughput.py ARTIFACT [--seconds 20] [--gen-clients 4] [--embed-clients 2]
                                                     [--batch 8] [--max-tokens 64]

Each client loops (a generation client: one greedy chat completion of max_tokens tokens at a time; an embedding
client: one request of `batch` texts at a time). A phase counts the texts of the embedding requests that finished
within its `seconds` and the tokens the engine generated in them (engine.stats()). Prints a markdown table with
the machine, the commit and the command.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import requests

TEXTS = [
    "The weather is lovely today, so we are going for a long walk along the river.",
    "How do I reset my password if I no longer have access to my old email address?",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "The meeting has been moved to Friday afternoon because the client is travelling.",
    "def add(a, b):\n    return a + b",
    "Paris is the capital of France and one of the most visited cities in the world.",
    "Interest rates rose by half a percent, and the stock market fell sharply on Monday.",
    "A cat naps on the couch while the rain taps gently against the window.",
    "Python is a popular programming language for data analysis and machine learning.",
    "The train to London is delayed by twenty minutes due to a signal failure.",
    "She bought a new car yesterday after comparing prices at three different dealers.",
    "Penguins live in the Southern Hemisphere, mostly in Antarctica and nearby islands.",
]
QUESTIONS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
             "Describe the water cycle in detail.", "List some tips for learning a new language."]


def _loop(url: str, stop: threading.Event, done: list, kind: str, args) -> None:
    """One client: requests back to back until stop; appends (finish time, texts or tokens) to done."""
    s = requests.Session()
    i = 0
    while not stop.is_set():
        if kind == "embed":
            batch = [TEXTS[(i + j) % len(TEXTS)] for j in range(args.batch)]
            r = s.post(url + "/v1/embeddings", json={"input": batch, "encoding_format": "base64"}, timeout=600)
            r.raise_for_status()
            n = len(r.json()["data"])
        else:
            body = {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], "temperature": 0,
                    "max_tokens": args.max_tokens, "ignore_eos": True}
            r = s.post(url + "/v1/chat/completions", json=body, timeout=600)
            r.raise_for_status()
            n = r.json()["usage"]["completion_tokens"]
        done.append((time.perf_counter(), n))
        i += 1


def phase(url: str, engine, gen: int, emb: int, args) -> dict:
    stop = threading.Event()
    gen_done, emb_done = [], []
    threads = [threading.Thread(target=_loop, args=(url, stop, gen_done, "gen", args)) for _ in range(gen)]
    threads += [threading.Thread(target=_loop, args=(url, stop, emb_done, "embed", args)) for _ in range(emb)]
    t0, tokens0 = time.perf_counter(), engine.stats()["tokens_generated"]
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    t1, tokens1 = time.perf_counter(), engine.stats()["tokens_generated"]
    stop.set()
    for t in threads:
        t.join()

    def rate(done):
        return sum(n for t, n in done if t <= t1) / (t1 - t0)
    return {"gen_tok_s": (tokens1 - tokens0) / (t1 - t0) if gen else None,
            "embed_texts_s": rate(emb_done) if emb else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--gen-clients", type=int, default=4)
    p.add_argument("--embed-clients", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="texts per embeddings request")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)

    from ortllm.bench.provenance import command, commit, machine
    from ortllm.runtime.engine import Engine
    from ortllm.service.app import create_app
    from ortllm.service.config import ServiceConfig
    from ortllm.service.server import HTTPServer

    engine = Engine.from_artifact(args.artifact)
    server = HTTPServer(create_app(ServiceConfig(), engine=engine), "127.0.0.1", 0, threads=32).start()
    try:
        phase(server.url, engine, 1, 1, argparse.Namespace(**{**vars(args), "seconds": 3}))      # warm up
        rows = [("generation alone", phase(server.url, engine, args.gen_clients, 0, args)),
                ("embeddings alone", phase(server.url, engine, 0, args.embed_clients, args)),
                ("both at once", phase(server.url, engine, args.gen_clients, args.embed_clients, args))]
    finally:
        server.stop()
        engine.close()
    print(f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}; commit {commit()}")
    print("command: " + command(f"{Path(sys.executable).name} {sys.argv[0]}", argv))
    print(f"{args.gen_clients} generation clients ({args.max_tokens} tokens each, greedy), {args.embed_clients} "
          f"embedding clients ({args.batch} texts a request), {args.seconds:g} s a phase\n")
    print("| phase | generation tok/s | embeddings texts/s |\n|---|---|---|")
    for name, r in rows:
        g, e = r["gen_tok_s"], r["embed_texts_s"]
        print(f"| {name} | {'-' if g is None else f'{g:.1f}'} | {'-' if e is None else f'{e:.1f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
