"""The dependency rules of docs/architecture.md ("Dependency rules"), one per top-level package, checked on an AST
scan of every import (module level and inside functions; tests/import_graph.py).

A rule lists what the folder's modules may reach outside their own folder, directly or through other modules
(a whole folder, or single modules of one); some also name third-party packages they must never reach. Every
top-level package of ours has exactly one rule, and no rule has exceptions: an edge the rules do not allow is
fixed in the code, by moving what both sides need to where the rules let both reach it.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.import_graph import Graph, packages, write_tree

EVERYTHING = ("runtime", "pipeline", "protocol", "service", "calibration", "batch", "bench", "cli", "models")


@dataclass(frozen=True)
class Rule:
    why: str
    may_reach: tuple[str, ...]          # folders ('runtime') or modules ('runtime.contract') outside the folder
    never_reach: tuple[str, ...] = ()   # third-party packages no module it reaches may import


RULES = {
    "runtime": Rule("the engine and the artifact contract: imports nothing of ours outside runtime/; downloads from a "
                    "model hub are the build's (pipeline/hub.py), never the runtime's", (), ("huggingface_hub",)),
    "pipeline": Rule("the offline build: the artifact contract and the tokenizer of the runtime (artifact "
                     "verification uses hash_cache, which writes through atomic_files, and process), the custom ops' "
                     "input tables (ops_library), the memory it may take (host_memory), calibration's text and tasks; "
                     "never the engine",
                     ("runtime.contract", "runtime.artifact", "runtime.errors", "runtime.tokenizer",
                      "runtime.ops_library", "runtime.hash_cache", "runtime.process", "runtime.atomic_files",
                      "runtime.host_memory", "calibration.data", "calibration.adapter_tasks")),
    "protocol": Rule("the OpenAI/Ollama request and response protocol, shared by the service and the batch job: "
                     "the runtime only, and no Flask", ("runtime",), ("flask", "werkzeug")),
    "service": Rule("the HTTP service drives the engine through the protocol (a hub pull runs `ortllm pull` in a "
                    "child process)", ("runtime", "protocol"), ("huggingface_hub",)),
    "batch": Rule("the batch job drives the engine through the protocol, without Flask", ("runtime", "protocol"),
                  ("flask", "werkzeug")),
    "calibration": Rule("eval jobs and the in-build quality check drive the engine", ("runtime",)),
    "bench": Rule("measures everything but is measured by nothing: product code never reaches bench (no other "
                  "rule lists it) and bench never reaches the command line",
                  tuple(p for p in EVERYTHING if p not in ("bench", "cli"))),
    "cli": Rule("the composition root: every verb, `ortllm bench` included, so the one folder that reaches bench",
                tuple(p for p in EVERYTHING if p != "cli")),
    "ortllm": Rule("the import namespace; `python -m ortllm` runs the command line", EVERYTHING),
    "models": Rule("recipes (TOML): data, no code of ours", ()),
}


def _allowed(dep: str, rule: Rule, own: str) -> bool:
    return dep.split(".")[0] == own or any(dep == a or dep.startswith(a + ".") for a in rule.may_reach)


def violations(graph: Graph, rules: dict[str, Rule]) -> list[str]:
    """Every module whose reach breaks its folder's rule, with the import chain that does it."""
    out = []
    missing = sorted(set(graph.packages) - set(rules))
    out += [f"{p}/ has no rule in tests/test_layering.py RULES" for p in missing]
    for mod in sorted(graph.modules):
        own = mod.split(".")[0]
        if own not in rules:
            continue
        rule = rules[own]
        paths = graph.paths_from(mod)
        for dep, chain in sorted(paths.items()):
            if not _allowed(dep, rule, own):
                out.append(f"{mod} reaches {dep}: {' -> '.join(chain)}")
        for m in [mod, *paths]:
            bad = graph.external[m] & set(rule.never_reach)
            if bad:
                via = " -> ".join(paths[m]) if m != mod else mod
                out.append(f"{mod} reaches {', '.join(sorted(bad))} (imported by {m}: {via})")
    return out


def test_every_package_has_one_rule():
    assert set(packages()) == set(RULES), "a top-level package without a rule, or a rule without a package"


def test_the_rules_hold():
    assert violations(Graph(), RULES) == []


def test_the_scan_sees_imports():
    """Known edges of each kind: module level, in a function, relative, a submodule through its package."""
    g = Graph()
    assert "runtime.block_pool" in g.edges["runtime.scheduler"]        # from .block_pool import ...
    assert "calibration.quality" in g.edges["cli.build"]               # inside build_artifact()
    assert "protocol.openai" in g.edges["protocol.generation"]
    assert "runtime.contract" in g.edges["pipeline.build"]             # from ortllm.runtime import contract as C
    assert "flask" in g.external["service.app"]


def _tree(root: Path, files: dict[str, str]) -> Graph:
    return Graph(write_tree(root, files))


def test_planted_violations_are_caught(tmp_path):
    """A tree with one breach of each kind: the check names each, with its chain; the clean modules pass."""
    g = _tree(tmp_path, {
        "runtime/__init__.py": "",
        "runtime/contract.py": "X = 1\n",
        "runtime/engine.py": "from .contract import X\n",
        "runtime/leak.py": "def f():\n    from ortllm.service import app\n",                 # lazy, upwards
        "pipeline/__init__.py": "",
        "pipeline/ok.py": "from ortllm.runtime import contract\n",
        "pipeline/bad.py": "from ortllm.runtime.engine import X\n",                          # not a stated module
        "protocol/__init__.py": "",
        "protocol/p.py": "from ortllm.runtime import contract\n",
        "protocol/web.py": "from flask import Flask\n",                                     # protocol uses Flask
        "service/__init__.py": "",
        "service/app.py": "import flask\nfrom ortllm.protocol import p\n",
        "batch/__init__.py": "",
        "batch/job.py": "from ortllm.protocol import web\n",                                # Flask, two steps away
        "bench/__init__.py": "",
        "bench/b.py": "from ortllm.cli import main\n",
        "cli/__init__.py": "def main():\n    from ortllm.bench import b\n",                  # allowed for cli
        "calibration/__init__.py": "",
        "calibration/c.py": "import ortllm.bench.b\n",                                       # product -> bench
        "extra/__init__.py": "",                                                            # a package, no rule
    })
    rules = {k: v for k, v in RULES.items() if k not in ("ortllm", "models")}
    got = violations(g, rules)
    expected = [
        "extra/ has no rule",
        "runtime.leak reaches service.app: runtime.leak -> service.app",
        "pipeline.bad reaches runtime.engine: pipeline.bad -> runtime.engine",
        "protocol.web reaches flask (imported by protocol.web: protocol.web)",
        "batch.job reaches flask (imported by protocol.web: batch.job -> protocol.web)",
        "bench.b reaches cli: bench.b -> cli",
        "calibration.c reaches bench.b: calibration.c -> bench.b",
    ]
    for e in expected:
        assert any(v.startswith(e) for v in got), (e, got)
    assert not [v for v in got if v.startswith(("pipeline.ok", "service.app", "protocol.p ", "cli "))], got


def runner_users(graph: Graph) -> list[str]:
    """Every `.runner` outside runtime/ (module:line). The engine's model runner (its ORT session, KV pool and output
    buffers) is runtime's own: calibration, bench and the service use the engine's API for what they need
    (Engine.scorer, Engine.execute, Engine.kv_pool, Engine.vocab_size, Engine.end_profiling)."""
    out = []
    for mod, path in sorted(graph.modules.items()):
        if mod.split(".")[0] == "runtime":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "runner":
                out.append(f"{mod}:{node.lineno}")
    return out


def test_nothing_outside_runtime_touches_an_engines_runner(tmp_path):
    """A planted `engine.runner` in bench and in calibration is caught; runtime's own use and `from .runner import`
    (batch/runner.py, a module of its own) are not."""
    assert runner_users(Graph()) == []
    g = _tree(tmp_path, {
        "runtime/__init__.py": "", "runtime/engine.py": "def f(self):\n    return self.runner.vocab_size\n",
        "bench/__init__.py": "", "bench/b.py": "def f(engine):\n    return engine.runner.block_size\n",
        "calibration/__init__.py": "", "calibration/c.py": "def f(e):\n    x = 1\n    return e.runner\n",
        "batch/__init__.py": "", "batch/runner.py": "X = 1\n", "batch/job.py": "from .runner import X\n"})
    assert runner_users(g) == ["bench.b:2", "calibration.c:3"]


def importers_of_the_tests(graph: Graph) -> list[str]:
    """Modules of ours that import the test suite (tests/ is no package of the product, bench and probes included)."""
    return sorted(m for m in graph.modules if "tests" in graph.external[m])


def test_nothing_imports_the_tests(tmp_path):
    """The op benches and probes get their graphs from bench/op_graphs.py, never from tests/; a planted import is
    caught."""
    assert importers_of_the_tests(Graph()) == []
    g = _tree(tmp_path, {"bench/__init__.py": "", "bench/probes/p.py": "from tests.custom_ops.conftest import X\n"})
    assert importers_of_the_tests(g) == ["bench.probes.p"]


def test_peer_drivers_import_nothing_of_ortllm():
    """bench/peers/ runs in the peers' own venv (no ortllm installed there)."""
    g = Graph()
    peers = [m for m in g.modules if m.startswith("bench.peers.")]
    assert peers and all(not g.edges[m] and "ortllm" not in g.external[m] for m in peers)


def test_batch_runs_without_importing_flask(tiny_engine, tmp_path):
    """`ortllm batch` (the real CLI, one chat line) completes with neither flask nor werkzeug ever imported."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
                   '"body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}\n')
    out = tmp_path / "out.jsonl"
    code = ("import sys; from ortllm.cli import main; rc = main(sys.argv[1:]); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'werkzeug')); "
            "print('FLASK', bad, file=sys.stderr); sys.exit(rc or (3 if bad else 0))")
    p = subprocess.run([sys.executable, "-c", code, "batch", str(tiny_engine), "--input", str(src),
                        "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "FLASK []" in p.stderr
    line = json.loads(out.read_text())
    assert line["custom_id"] == "a" and line["response"]["status_code"] == 200
