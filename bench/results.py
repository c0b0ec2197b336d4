"""results.json of `ortllm bench`: rows {scenario, system, batch, metric, median, min, max, unit} plus the
machine, the commit and the command that made them (docs/architecture.md, Interfaces; bench/provenance.py). Every
entry point writes it through write_results, once per run."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Callable

from .provenance import provenance

__all__ = ["row", "timed", "provenance", "write_results", "write_markdown", "markdown_table"]


def row(scenario: str, system: str, batch: int, metric: str, samples, unit: str, scale: float = 1.0,
        digits: int | None = None, **extra) -> dict:
    """The one row builder: median, min and max of samples (each times scale, rounded to digits if given)."""
    values = [float(x) * scale for x in samples]
    stats = (statistics.median(values), min(values), max(values))
    if digits is not None:
        stats = tuple(round(v, digits) for v in stats)
    return {"scenario": scenario, "system": system, "batch": batch, "metric": metric,
            "median": stats[0], "min": stats[1], "max": stats[2], "unit": unit, "n": len(values), **extra}


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of `repeats` calls."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


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
