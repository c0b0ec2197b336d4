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


def write_results(out_dir: Path, rows: list[dict], command: str | None = None, sections: dict | None = None
                  ) -> Path:
    """results.json: provenance, "results": the rows, and any `sections` (e.g. "quality_data": the held-out text's
    sources and sha256s) as further top-level keys."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**provenance(command), **(sections or {}), "results": rows}
    return _write(out_dir / "results.json", json.dumps(doc, indent=2) + "\n")


def write_markdown(out_dir: Path, rows: list[dict], command: str | None = None, plots=(), notes=(), tables=()
                   ) -> Path:
    """results.md: machine, commit and command, the table of rows (median, min, max), any notes (one bullet
    each), the scenarios' own tables (markdown, scenarios.scenario_tables), then the plots (PNG names relative to
    out_dir)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    p = provenance(command)
    lines = ["# ortllm bench results", "", f"- Machine: {p['machine']}", f"- Commit: {p['commit']}",
             f"- Command: `{p['command']}`", "", markdown_table(rows), ""]
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    for table in tables:
        lines += [table.rstrip("\n"), ""]
    for name in plots:
        lines += [f"![{Path(name).stem}]({name})", ""]
    return _write(out_dir / "results.md", "\n".join(lines))


QUALITY = "quality"                 # the scenario of the held-out quality rows (bench/quality.py)
NO_REFERENCE = "no reference"


def markdown_table(rows: list[dict]) -> str:
    """The rows' table; speed rows that carry "quality" (bench/quality.beside) get KLD, top-1 and PPL ratio
    columns, and the quality rows themselves their own table (quality_table)."""
    main = [r for r in rows if r["scenario"] != QUALITY]
    scored = any(r["scenario"] == QUALITY for r in rows)
    with_q = any("quality" in r for r in main)
    head = "| scenario | system | batch | metric | median | min | max | unit |"
    lines = [head + (" KLD | top-1 | PPL ratio |" if with_q else ""),
             "|---" * (8 + 3 * with_q) + "|"]
    for r in main:
        system = f"{r['system']}: {r['peer']}" if "peer" in r else r["system"]     # best-peer rows name it
        line = (f"| {r['scenario']} | {system} | {r['batch']} | {r['metric']} | {r['median']:.4g} | "
                f"{r['min']:.4g} | {r['max']:.4g} | {r['unit']} |")
        if with_q:
            line += " " + " | ".join(_quality_cells(r, scored)) + " |"
        lines.append(line)
    if not main:
        return quality_table(rows) if scored else "\n".join(lines)
    if scored:
        lines += ["", quality_table(rows)]
    return "\n".join(lines)


def _quality_cells(r: dict, scored: bool) -> list[str]:
    if "quality" not in r:
        return [""] * 3
    q = r["quality"]
    if q is None:
        return ["not scored" if scored else NO_REFERENCE] * 3
    return [f"{q['kld_mean']:.4f}", f"{100 * q['top1_agreement']:.1f}%", f"{q['ppl_ratio']:.4f}"]


def quality_table(rows: list[dict]) -> str:
    """One line per system: KLD mean, top-1 agreement and PPL ratio (+- its standard error) of all held-out
    domains together, then KLD / top-1 of each domain."""
    by: dict[str, dict] = {}
    for r in rows:
        if r["scenario"] == QUALITY:
            by.setdefault(r["system"], {}).setdefault(r["domain"], {})[r["metric"]] = r
    domains = [d for d in dict.fromkeys(d for per in by.values() for d in per) if d != "all"]
    lines = ["| system (against the fp32 reference) | positions | KLD mean | top-1 | PPL ratio | "
             + " | ".join(f"{d}: KLD / top-1" for d in domains) + " |",
             "|---" * (5 + len(domains)) + "|"]
    for system, per in by.items():
        a = per["all"]
        cells = [f"{a['kld_mean']['median']:.4f}", f"{100 * a['top1_agreement']['median']:.1f}%",
                 f"{a['ppl_ratio']['median']:.4f} +- {a['ppl_ratio']['err']:.4f}"]
        cells += [f"{per[d]['kld_mean']['median']:.4f} / {100 * per[d]['top1_agreement']['median']:.1f}%"
                  if d in per else "-" for d in domains]
        lines.append(f"| {system} | {a['kld_mean']['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
