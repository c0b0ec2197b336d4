"""The dependency direction of DESIGN.md, as an AST scan of every import (module level and inside functions).

    cli  ->  anything (the composition root: e.g. the build with its in-build quality check, cli/build.py)
    service, batch, calibration  ->  runtime, protocol          bench  ->  anything but cli
    protocol (the OpenAI request/response protocol: no Flask)  ->  runtime
    pipeline  ->  runtime.{contract, artifact, errors, tokenizer} and calibration's data (data.py,
                  adapter_tasks.py), which must themselves reach no other runtime module
    runtime   ->  nothing of ours outside runtime
Product code never imports bench; bench/peers/ (the peers' drivers, run in their own venv) imports nothing of ours.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "pipeline", "service", "protocol", "calibration", "batch", "bench", "cli")
PIPELINE_RUNTIME = {"runtime", "runtime.contract", "runtime.artifact", "runtime.errors", "runtime.tokenizer"}
PIPELINE_CALIBRATION = {"calibration.data", "calibration.adapter_tasks"}
# What the stated modules use themselves (reached, never imported by the pipeline directly): artifact
# verification hashes through runtime.hash_cache; runtime.process tells a live writer's leftovers from a dead one's.
PIPELINE_RUNTIME_REACHED = {"runtime.hash_cache", "runtime.process"}

# Known exception, left for a later change (reported in issue 22): the service's adapter upload
# (POST/DELETE /v1/adapters) rewrites the artifact with pipeline.adapters.
SERVICE_EXCEPTIONS = {"pipeline", "pipeline.adapters", "pipeline.errors"}


def _module_of(path: Path) -> str:
    """bench/peer_runner.py -> 'bench.peer_runner'; runtime/__init__.py -> 'runtime' (ortllm.* without ortllm.)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Our modules `path` imports, as 'runtime.engine' (relative imports resolved)."""
    mod = _module_of(path).split(".")
    package = mod if path.name == "__init__.py" else mod[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n.startswith("ortllm."):
                n = n[len("ortllm."):]
            elif n.split(".")[0] not in PACKAGES:
                continue
            out.add(n)
    return {n for n in out if _is_module(n)}


def _is_module(name: str) -> bool:
    p = REPO.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _product_files():
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            if "peers" not in f.relative_to(REPO).parts:
                yield f


GRAPH = {_module_of(f): _imports(f) for f in _product_files()}


def _closure(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in GRAPH.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _violations(pkg: str, allowed) -> list[str]:
    return [f"{m} imports {d}" for m, deps in sorted(GRAPH.items()) if m.split(".")[0] == pkg
            for d in sorted(deps) if d.split(".")[0] != pkg and not allowed(d)]


def test_runtime_imports_nothing_of_ours_outside_itself():
    assert _violations("runtime", lambda d: False) == []


def test_pipeline_imports_only_the_stated_runtime_modules():
    assert _violations("pipeline", lambda d: d in PIPELINE_RUNTIME | PIPELINE_CALIBRATION) == []
    for m in [m for m in GRAPH if m.split(".")[0] == "pipeline"]:
        reached = {d for d in _closure(m) if d.split(".")[0] not in ("pipeline",)}
        extra = reached - PIPELINE_RUNTIME - PIPELINE_CALIBRATION - PIPELINE_RUNTIME_REACHED
        assert not extra, f"{m} reaches {sorted(extra)}"


def test_protocol_is_flask_free_and_uses_only_runtime():
    assert _violations("protocol", lambda d: d.split(".")[0] == "runtime") == []
    for f in (REPO / "protocol").rglob("*.py"):
        tree = ast.parse(f.read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and not n.level}
        assert not roots & {"flask", "werkzeug"}, f"{f.name} imports {roots & {'flask', 'werkzeug'}}"


@pytest.mark.parametrize("pkg", ["service", "batch", "calibration"])
def test_service_batch_calibration_use_runtime_and_protocol(pkg):
    allowed = {"runtime", "protocol"}
    extra = SERVICE_EXCEPTIONS if pkg == "service" else set()
    assert _violations(pkg, lambda d: d.split(".")[0] in allowed or d in extra) == []


def test_product_code_never_imports_bench():
    users = [f"{m} imports {d}" for m, deps in sorted(GRAPH.items()) if m.split(".")[0] not in ("bench", "cli")
             for d in deps if d.split(".")[0] == "bench"]
    assert users == []
    assert _violations("bench", lambda d: d.split(".")[0] != "cli") == []


def test_peer_drivers_import_nothing_of_ortllm():
    for f in sorted((REPO / "bench" / "peers").glob("*.py")):
        tree = ast.parse(f.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {n for n in names if n.split(".")[0] in ("ortllm", *PACKAGES)}, f.name


def test_the_scan_sees_imports():
    """The scan itself: a known edge of each kind (module level, in a function, relative)."""
    assert "runtime.block_pool" in GRAPH["runtime.scheduler"]
    assert "calibration.quality" in GRAPH["cli.build"]
    assert "protocol.openai" in GRAPH["protocol.generation"]


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
