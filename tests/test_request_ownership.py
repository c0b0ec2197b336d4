"""Who may end a request, and how the service waits for one, checked on an AST scan of every package of ours:

- a request ends in one place, the engine's output processor (runtime/output_processor.py): no other module calls a
  `_finish`, writes a request's stream (`<x>.stream.put / .finish`) or makes a RequestStream;
- the service waits on queues and events, never by sleeping between polls: no module of service/ calls a `sleep`
  (time.sleep, asyncio.sleep, or one imported by name).
Each rule is also run on a planted tree, so a scan that sees nothing cannot pass.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import REPO, packages, write_tree

OUTPUT_PROCESSOR = "runtime/output_processor.py"
STREAM_WRITES = {"put", "finish"}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            yield node


def _name(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def request_enders(root: Path = REPO) -> list[str]:
    """Every call outside the output processor that ends a request or writes its stream, as 'file:line what'."""
    out = []
    for pkg in packages(root):
        for f in sorted((root / pkg).rglob("*.py")):
            rel = f.relative_to(root).as_posix()
            if rel == OUTPUT_PROCESSOR:
                continue
            for c in _calls(f):
                name, fn = _name(c.func), c.func
                on_stream = (isinstance(fn, ast.Attribute) and name in STREAM_WRITES
                             and _name(fn.value) == "stream")
                if name in ("_finish", "RequestStream") or on_stream:
                    out.append(f"{rel}:{c.lineno} {ast.unparse(fn)}")
    return out


def sleepers(root: Path = REPO, folder: str = "service") -> list[str]:
    """Every call of a `sleep` in folder/, as 'file:line what'."""
    return [f"{f.relative_to(root).as_posix()}:{c.lineno} {ast.unparse(c.func)}"
            for f in sorted((root / folder).rglob("*.py")) for c in _calls(f) if _name(c.func) == "sleep"]


def test_only_the_output_processor_ends_requests():
    assert (REPO / OUTPUT_PROCESSOR).is_file()
    assert request_enders() == [], "a request ended outside runtime/output_processor.py"


def test_the_service_waits_without_sleeping():
    assert (REPO / "service" / "lifecycle.py").is_file()
    assert sleepers() == [], "service/ polls with sleep: wait on a queue or an Event with a timeout instead"


def test_planted_enders_and_sleepers_are_caught(tmp_path):
    root = write_tree(tmp_path, {
        "runtime/__init__.py": "",
        "runtime/output_processor.py": "def f(st):\n    st.stream.finish(1)\n    self._finish(st)\n",   # allowed
        "runtime/engine.py": "def f(h, st):\n    h._finish('stop')\n    st.stream.put('x')\n",
        "runtime/other.py": "from .request_output import RequestStream\nS = RequestStream(True)\n"
                            "def g(q):\n    q.put(1)\n",                           # a queue's put is not a stream's
        "service/__init__.py": "",
        "service/a.py": "import time\nfrom time import sleep\ndef f():\n    time.sleep(0.01)\n    sleep(1)\n",
        "service/b.py": "import asyncio\nasync def f(q):\n    await asyncio.sleep(0.1)\n    q.get(timeout=0.1)\n",
    })
    assert request_enders(root) == ["runtime/engine.py:2 h._finish", "runtime/engine.py:3 st.stream.put",
                                    "runtime/other.py:2 RequestStream"]
    assert sleepers(root) == ["service/a.py:4 time.sleep", "service/a.py:5 sleep", "service/b.py:3 asyncio.sleep"]
