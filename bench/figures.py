"""The figure tables of a docs page, rendered from the results.json files `ortllm bench --out DIR` writes
(bench/results.py), so that a page's numbers are its results files' numbers and nobody copies them by hand.

A page marks each generated table by name; everything between the two markers is replaced:

    <!-- figures: tinyllama-shape-int4 -->
    | scenario | ortllm ... |
    <!-- /figures -->

NAME is a key of FIGURES below: which results file (a path in the repository) and how to lay it out.

    python -m ortllm.bench.figures docs/benchmarks.md            # rewrite the tables in place
    python -m ortllm.bench.figures docs/benchmarks.md --check    # exit 1, naming them, if a table is stale
Dev tooling: reads results files and pages of the repository, imports nothing of ortllm.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_MARKED = re.compile(r"(<!-- figures: ([\w.-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)

# The peer scenarios' rows, in a table's order: (scenario, batch, row label, True if lower is better).
PEER_ROWS = [("decode", 1, "decode B = 1, tok/s", False),
             ("decode", 16, "decode B = 16, tok/s", False),
             ("prefill", 1, "prefill 512, s to first token", True),
             ("long-context", 1, "decode after a 1984-token prompt, tok/s", False)]
SPEED_METRICS = {"decode_tokens_per_s", "time_to_first_token"}
RATIO = "ortllm / fastest peer"           # the best-peer rows bench/peer_runner.py adds (metric speed_ratio)


@dataclass(frozen=True)
class PeerTable:
    """ortllm against its peers, one row per peer scenario the results hold: each system's median (ortllm's with
    min-max), the row's fastest in bold, then ortllm over the fastest peer against the row's target."""
    results: str                    # results.json, relative to the repository
    columns: dict[str, str]         # system name in the rows -> its column heading (ortllm first), in order
    targets: dict[str, float]       # row label -> the ratio ortllm aims at against the fastest peer

    def render(self, doc: dict) -> str:
        rows = doc["results"]
        speed = {(r["scenario"], r["batch"], r["system"]): r for r in rows if r["metric"] in SPEED_METRICS}
        ratio = {(r["scenario"], r["batch"]): r for r in rows if r["system"] == RATIO}
        out = ["| scenario | " + " | ".join(self.columns.values()) + " | ortllm / best peer (target) |",
               "|---" * (len(self.columns) + 2) + "|"]
        for scenario, batch, label, lower in PEER_ROWS:
            cells = {s: speed.get((scenario, batch, s)) for s in self.columns}
            if not any(cells.values()):
                continue
            best = (min if lower else max)((c["median"] for c in cells.values() if c), default=None)
            out.append(f"| {label} | " + " | ".join(_cell(c, best, s == "ortllm") for s, c in cells.items())
                       + f" | {_ratio(ratio.get((scenario, batch)), self.targets.get(label))} |")
        return "\n".join(out) + "\n"


FIGURES: dict[str, PeerTable] = {
    "tinyllama-shape-int4": PeerTable(
        results="docs/img/peers_tinyllama_shape_int4_5a16560_results.json",
        columns={"ortllm": "ortllm (default int4: b32, scale + offset)", "llama.cpp-q4_0": "llama.cpp Q4_0",
                 "onnxruntime-genai": "onnxruntime-genai int4"},
        targets={"decode B = 1, tok/s": 1.3, "decode B = 16, tok/s": 1.5, "prefill 512, s to first token": 1.5,
                 "decode after a 1984-token prompt, tok/s": 2.0}),
}


def _num(x: float) -> str:
    """4 significant digits, trailing zeros kept (4.800, 148.1, 2.337)."""
    return f"{x:#.4g}".rstrip(".")


def _cell(r: dict | None, best: float | None, spread: bool) -> str:
    if r is None:
        return "-"
    text = f"**{_num(r['median'])}**" if r["median"] == best else _num(r["median"])
    return text + (f" ({_num(r['min'])}-{_num(r['max'])})" if spread else "")


def _ratio(r: dict | None, target: float | None) -> str:
    if r is None:
        return "-"
    value = f"{r['median']:.2f}x"
    if target is None:
        return value
    return f"**{value}** ({target:g}x)" if r["median"] >= target else f"{value} ({target:g}x): missed"


def render_page(text: str, figures: dict[str, PeerTable] | None = None, root: Path = REPO) -> str:
    """`text` with every marked table rendered from its results file (paths relative to `root`)."""
    figures = FIGURES if figures is None else figures

    def table(m: re.Match) -> str:
        name = m.group(2)
        if name not in figures:
            raise SystemExit(f"figures: no table named {name!r} (known: {', '.join(sorted(figures))}); "
                             "add it to FIGURES in bench/figures.py or fix the marker")
        spec = figures[name]
        doc = json.loads((root / spec.results).read_text())
        return m.group(1) + spec.render(doc) + m.group(4)

    return _MARKED.sub(table, text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pages", type=Path, nargs="+", help="markdown pages with <!-- figures: NAME --> markers")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page's tables are stale")
    a = p.parse_args(argv)
    stale = []
    for page in a.pages:
        text = page.read_text()
        new = render_page(text)
        if new != text:
            stale.append(str(page))
            if not a.check:
                page.write_text(new)
    if stale:
        print(("stale figures (run python -m ortllm.bench.figures on them): " if a.check else "rewrote: ")
              + ", ".join(stale), file=sys.stderr)
    return 1 if stale and a.check else 0


if __name__ == "__main__":
    sys.exit(main())
