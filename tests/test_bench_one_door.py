"""bench/ has one door: `ortllm bench` and its scenario registry (bench/scenarios.py). No module of bench/ parses a
command line of its own but the child processes a scenario starts on purpose (CHILDREN) and the drivers and probes
run by path (bench/peers/, bench/probes/); every Makefile target that measures goes through `ortllm bench`; and the
options that replaced the old entry points (the peers alone, the ops parts, the docs' figure tables) answer through
the CLI."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.cli_run import ortllm
from tests.test_cli import assert_user_error

REPO = Path(__file__).resolve().parents[1]
RUN_BY_PATH = ("peers", "probes")      # bench/peers/: drivers in the peers' venvs; bench/probes/: one-off probes
# module -> why it keeps a command line: a process a scenario starts itself, never a front door
CHILDREN = {"memory.py": "the memory scenario's fresh process (memory.measure runs `python -m ortllm.bench.memory`), "
                         "so nothing the bench process loaded counts in its peak RSS"}
# Makefile targets named bench* that measure nothing
INSTALLERS = {"bench-peers": "installs the peers and their weights (ci/install_peers.sh)"}


def front_doors(bench: Path) -> list[str]:
    """bench/ modules (outside RUN_BY_PATH and CHILDREN) with a command line: an argparse import or a
    `__name__ == "__main__"` block."""
    found = []
    for f in sorted(bench.rglob("*.py")):
        rel = f.relative_to(bench)
        if rel.parts[0] in RUN_BY_PATH or rel.as_posix() in CHILDREN:
            continue
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            argparse = (isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names)
                        or isinstance(node, ast.ImportFrom) and node.module == "argparse")
            dunder_main = (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
                           and node.left.id == "__name__")
            if argparse or dunder_main:
                found.append(f"bench/{rel.as_posix()}:{node.lineno}")
                break
    return found


def test_no_module_of_bench_has_a_command_line_of_its_own(tmp_path):
    assert front_doors(REPO / "bench") == [], "make it a scenario of bench/scenarios.py or an `ortllm bench` option"
    planted = tmp_path / "bench"
    for rel, text in {"ok.py": "X = 1\n", "peers/driver.py": "import argparse\n", "probes/p.py": "import argparse\n",
                      "memory.py": "import argparse\n", "tool.py": "def main():\n    import argparse\n",
                      "runner.py": "if __name__ == '__main__':\n    pass\n"}.items():
        (planted / rel).parent.mkdir(parents=True, exist_ok=True)
        (planted / rel).write_text(text)
    assert front_doors(planted) == ["bench/runner.py:1", "bench/tool.py:2"]


def test_the_children_are_started_by_their_scenario():
    """Each module CHILDREN allows a command line is one its scenario starts as `python -m ortllm.bench.X`."""
    for name in CHILDREN:
        text = (REPO / "bench" / name).read_text()
        assert f'"ortllm.bench.{name.removesuffix(".py")}"' in text and "def main(" in text, name


def _targets(makefile: str) -> dict[str, str]:
    """target -> its recipe (the tab-indented lines after `target: ...`)."""
    out, current = {}, None
    for line in makefile.splitlines():
        m = re.match(r"^([\w.-]+):(?!=)", line)
        if m:
            current = m.group(1)
            out[current] = ""
        elif line.startswith("\t") and current:
            out[current] += line + "\n"
        elif line.strip() and not line.startswith("#"):
            current = None
    return out


def _bench_modules_run(text: str) -> list[str]:
    """Commands in `text` that run a bench/ module directly (not a peers driver or a probe)."""
    return re.findall(r"-m ortllm\.bench\.\w+|-m bench\.\w+|\bbench/(?!peers/|probes/)\w+\.py", text)


def test_every_makefile_bench_target_goes_through_ortllm_bench():
    targets = _targets((REPO / "Makefile").read_text())
    assert {"bench", "bench-ray", "bench-vs-peers", "bench-8b", "figures"} <= set(targets)
    for name, recipe in targets.items():
        scripts = "".join((REPO / s).read_text() for s in re.findall(r"\bci/\w+\.sh", recipe))
        assert _bench_modules_run(recipe + scripts) == [], name
        if (name.startswith("bench") or name == "figures") and name not in INSTALLERS:
            assert "ortllm bench" in recipe + scripts, f"make {name} does not run `ortllm bench`"
    assert _bench_modules_run("python -m ortllm.bench.serve_ray ART; .venv-peers/bin/python bench/peers/x.py") == \
        ["-m ortllm.bench.serve_ray"]


def test_the_replaced_entry_points_are_scenarios_and_options():
    from ortllm.bench.scenarios import SCENARIOS
    assert {"http-engine", "serve-ray", "ops", "serve-guidellm", "decode", "memory"} <= set(SCENARIOS)
    helped = ortllm("bench", "--help").stdout
    for option in ("--render-figures", "--check", "--peers-model", "--rates", "--max-seconds", "--max-requests",
                   "--ops-only", "--ops-baseline", "--ops-spinning"):
        assert option in helped, option


def test_what_the_door_refuses_is_one_line(tmp_path):
    assert_user_error(ortllm("bench", "--scenario", "engine"), "needs --out DIR")
    assert_user_error(ortllm("bench", "--check", "--out", tmp_path), "--check goes with --render-figures")
    assert_user_error(ortllm("bench", "--scenario", "decode", "--out", tmp_path),
                      "needs an ARTIFACT", "or --peers to run the peers alone")
    assert_user_error(ortllm("bench", "--render-figures", tmp_path / "nope.md"), "no such page")
    assert_user_error(ortllm("bench", "--scenario", "serve-guidellm", "--rates", "1,x", "--out", tmp_path),
                      "--rates must be comma-separated numbers")


def test_ops_part_through_the_door(tmp_path):
    """`--ops-only paged_attention` (the per-call case alone, a smoke run): its rows in results.json and the ops
    scenario's own docs tables in results.md."""
    p = ortllm("bench", "--scenario", "ops", "--quick", "--ops-only", "paged_attention", "--threads", "1",
               "--out", tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    assert rows and all(r["scenario"].startswith("ops/attention/decode_per_call_") for r in rows)
    md = (tmp_path / "results.md").read_text()
    assert "| PagedAttention per call, B = 1 decode (30 layers in one graph) | system | us |" in md


def test_http_engine_through_the_door(tiny_engine, tmp_path):
    """The http-engine scenario (the service against its engine in process) at 2 streams, a smoke run: both sides
    generate the same tokens, and the ratio row is the HTTP rate over the engine's."""
    p = ortllm("bench", tiny_engine, "--scenario", "http-engine", "--batches", "2", "--repeats", "1", "--threads", "1",
               "--out", tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = {(r["system"], r["metric"]): r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    engine = rows[("ortllm engine (in-process)", "decode_tokens_per_s")]
    http = rows[("ortllm service (HTTP, SSE)", "decode_tokens_per_s")]
    assert engine["batch"] == http["batch"] == 2 and engine["median"] > 0 and http["median"] > 0
    assert rows[("service / engine", "throughput_ratio")]["median"] == pytest.approx(http["median"] / engine["median"])
