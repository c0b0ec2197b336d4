"""results.json of `ortllm bench`: rows {scenario, system, batch, metric, median, min, max, unit} plus the
machine, the commit and the command that made them (DESIGN.md, Interfaces)."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        text = open("/proc/cpuinfo").read()
        flags = ", ".join(f for f in ("avx2", "fma", "avx512f") if f" {f}" in text)
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model} ({len(os.sched_getaffinity(0))} cores available; {flags}), {mem:.0f} GiB, {platform.platform()}"


def commit() -> str:
    repo = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{rev}{'+dirty' if dirty else ''}" if rev else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def row(scenario: str, system: str, batch: int, metric: str, samples: list[float], unit: str, **extra) -> dict:
    return {"scenario": scenario, "system": system, "batch": batch, "metric": metric,
            "median": statistics.median(samples), "min": min(samples), "max": max(samples), "unit": unit,
            "n": len(samples), **extra}


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of `repeats` calls."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def provenance(command: str | None = None) -> dict:
    """{machine, commit, command}: what results.json and results.md say about how their rows were made."""
    return {"machine": machine(), "commit": commit(), "command": command or " ".join(["ortllm", *sys.argv[1:]])}


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def write_results(out_dir: Path, rows: list[dict], command: str | None = None) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**provenance(command), "results": rows}
    return _write(out_dir / "results.json", json.dumps(doc, indent=2) + "\n")


def write_markdown(out_dir: Path, rows: list[dict], command: str | None = None, plots=()) -> Path:
    """results.md: machine, commit and command, the table of rows (median, min, max), then the plots (PNG names
    relative to out_dir)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    p = provenance(command)
    lines = ["# ortllm bench results", "", f"- Machine: {p['machine']}", f"- Commit: {p['commit']}",
             f"- Command: `{p['command']}`", "", markdown_table(rows), ""]
    for name in plots:
        lines += [f"![{Path(name).stem}]({name})", ""]
    return _write(out_dir / "results.md", "\n".join(lines))


def markdown_table(rows: list[dict]) -> str:
    lines = ["| scenario | system | batch | metric | median | min | max | unit |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['system']} | {r['batch']} | {r['metric']} | {r['median']:.4g} | "
                     f"{r['min']:.4g} | {r['max']:.4g} | {r['unit']} |")
    return "\n".join(lines)
