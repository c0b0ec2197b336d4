"""`ortllm serve` runs from the base install (pyproject's `dependencies`: what `make serve`'s .venv-serve holds):
served here in a process where every package outside the base install's dependency closure cannot be imported
(torch, transformers, onnxruntime-extensions, gguf, the dev tools...), it loads, answers each API and stops
cleanly, and never even tries torch or a build-only package."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from importlib import metadata

import requests
from packaging.requirements import Requirement

BUILD_ONLY = {"torch", "transformers", "onnxruntime_extensions", "gguf", "optimum", "peft", "accelerate"}

RUNNER = """
import importlib.abc, json, sys
BLOCKED, LOG = set(json.loads(sys.argv[1])), sys.argv[2]

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in BLOCKED:
            with open(LOG, "a") as f:
                f.write(top + "\\n")
            raise ModuleNotFoundError(f"{top} is outside the base install", name=top)
        return None

sys.meta_path.insert(0, Block())
from ortllm.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _base_closure() -> set[str]:
    """Normalized names of the distributions the base install brings: ortllm's dependencies (no extras) and
    theirs, recursively, markers evaluated here."""
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()      # noqa: E731
    todo, seen = ["ortllm"], set()
    while todo:
        name = todo.pop()
        if norm(name) in seen:
            continue
        seen.add(norm(name))
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in reqs:
            r = Requirement(text)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return seen


def _blocked_modules() -> set[str]:
    """Top-level modules that only distributions outside the base closure provide."""
    closure = _base_closure()
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()      # noqa: E731
    return {mod for mod, dists in metadata.packages_distributions().items()
            if mod != "ortllm" and not any(norm(d) in closure for d in dists)}


def test_serve_from_the_base_install(tiny_engine, tmp_path):
    blocked = _blocked_modules()
    assert BUILD_ONLY <= blocked | {"optimum"}, BUILD_ONLY - blocked        # they are not base dependencies
    assert not {"onnxruntime", "numpy", "flask", "tokenizers"} & blocked
    log = tmp_path / "blocked-imports.txt"
    log.touch()
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, json.dumps(sorted(blocked)), str(log), "serve",
                             str(tiny_engine), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={"PATH": "/usr/bin:/bin", "ORTLLM_HOME": str(tmp_path / "home"),
                                            "PYTHONUNBUFFERED": "1"})
    try:
        url, out, end = None, [], time.monotonic() + 120
        while url is None and time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if m := re.search(r"serving .* at (http://127\.0\.0\.1:\d+)", line):
                url = m.group(1)
        assert url, "".join(out)[-3000:]
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for method, path, body in [("GET", "/health", None), ("POST", "/v1/chat/completions", chat),
                                   ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 3}),
                                   ("POST", "/api/chat", {"model": "llama-tiny-random", "stream": False, **chat}),
                                   ("POST", "/v1/messages", {"model": "llama-tiny-random", **chat}),
                                   ("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 4}),
                                   ("POST", "/v1/embeddings", {"input": "hi"}), ("POST", "/tokenize", {"prompt": "a"}),
                                   ("GET", "/openapi.json", None), ("GET", "/metrics", None), ("GET", "/", None)]:
            r = requests.request(method, url + path, json=body, timeout=60)
            assert r.status_code == 200, (path, r.text[:300])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    tried = set(log.read_text().split())
    assert not tried & BUILD_ONLY, tried
