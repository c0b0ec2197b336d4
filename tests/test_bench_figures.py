"""bench/figures.py: a page's marked tables are rendered from results.json files, so the docs' figures are the
results files' own. Real files in tmp_path; the repository's own pages (docs/ and the README) are checked to be
current, their links to the "now" table's sections to land, and docs/img to hold only files a page renders or
names."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ortllm.bench.figures import FIGURES, NowRow, NowTable, PeerTable, ServeTable, Tables, render_page
from tests.cli_run import ortllm

REPO = Path(__file__).resolve().parents[1]


def _row(scenario, system, batch, metric, median, lo, hi, unit, **extra):
    return {"scenario": scenario, "system": system, "batch": batch, "metric": metric, "median": median, "min": lo,
            "max": hi, "unit": unit, "n": 3, **extra}


# what `ortllm bench ART --scenario decode,prefill --peers llama.cpp-q4_0 --batches 1` writes (bench/results.py)
RESULTS = {"machine": "test machine", "commit": "abc1234", "command": "ortllm bench ART ...", "results": [
    _row("decode", "ortllm", 1, "decode_tokens_per_s", 31.286, 30.1854, 34.594, "tok/s"),
    _row("decode", "llama.cpp-q4_0", 1, "decode_tokens_per_s", 33.589, 31.167, 34.631, "tok/s"),
    _row("decode", "ortllm", 1, "python_share_of_step", 0.0044, 0.0042, 0.0046, "fraction"),
    _row("prefill", "ortllm", 1, "time_to_first_token", 2.33699, 2.29695, 2.56203, "s"),
    _row("prefill", "llama.cpp-q4_0", 1, "time_to_first_token", 4.79977, 4.7384, 4.8254, "s"),
    _row("decode", "ortllm / fastest peer", 1, "speed_ratio", 0.93147, 0.87, 1.11, "x", peer="llama.cpp-q4_0"),
    _row("prefill", "ortllm / fastest peer", 1, "speed_ratio", 2.0538, 1.9, 2.1, "x", peer="llama.cpp-q4_0"),
]}
SPEC = {"small": PeerTable(results="out/results.json", columns={"ortllm": "ortllm int4", "llama.cpp-q4_0": "Q4_0"},
                           targets={"decode B = 1, tok/s": 1.3, "prefill 512, s to first token": 1.5})}
EXPECTED = """\
| scenario | ortllm int4 | Q4_0 | ortllm / best peer (target) |
|---|---|---|---|
| decode B = 1, tok/s | 31.29 (30.19-34.59) | **33.59** | 0.93x (1.3x): missed |
| prefill 512, s to first token | **2.337** (2.297-2.562) | 4.800 | **2.05x** (1.5x) |
- `ortllm bench ART ...` at abc1234; test machine; results `out/results.json`
"""


def _page(tmp_path: Path, table: str = "| stale |\n") -> Path:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text(json.dumps(RESULTS))
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\nText before.\n\n<!-- figures: small -->\n{table}<!-- /figures -->\n\nText after.\n")
    return page


def test_a_small_results_file_renders_the_expected_table(tmp_path):
    """Medians to 4 digits (trailing zeros kept), ortllm's min-max, the row's fastest in bold (lower is better for
    prefill), the ratio row against its target; the text around the markers is kept as it was."""
    page = _page(tmp_path)
    out = render_page(page.read_text(), SPEC, root=tmp_path)
    assert out == f"# Page\n\nText before.\n\n<!-- figures: small -->\n{EXPECTED}<!-- /figures -->\n\nText after.\n"
    assert render_page(out, SPEC, root=tmp_path) == out                 # rendering again changes nothing


def test_check_names_a_stale_page_and_the_rewrite_fixes_it(tmp_path, monkeypatch):
    """`ortllm bench --render-figures PAGE [--check]` (make figures), in this process."""
    page = _page(tmp_path)
    monkeypatch.setitem(FIGURES, "small", PeerTable(**{**SPEC["small"].__dict__,
                                                       "results": str(tmp_path / "out" / "results.json")}))
    before = page.read_text()
    stale = ortllm("bench", "--render-figures", page, "--check")
    assert stale.returncode == 1 and page.read_text() == before and str(page) in stale.stderr
    assert ortllm("bench", "--render-figures", page).returncode == 0
    assert EXPECTED.split("\n- ")[0] in page.read_text()     # the table (its provenance line names the results
    # file by the absolute path FIGURES holds here)
    assert ortllm("bench", "--render-figures", page, "--check").returncode == 0


def test_an_unknown_table_name_says_what_to_do(tmp_path):
    page = _page(tmp_path)
    with pytest.raises(SystemExit, match="no table named 'small'.*add it to FIGURES"):
        render_page(page.read_text(), {}, root=tmp_path)


def _pages() -> list[Path]:
    return [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]


def test_the_docs_tables_are_their_results_files():
    """Every marked table in docs/ and the README is what its results file gives: edit the results (or FIGURES),
    not the table."""
    pages = [p for p in _pages() if "<!-- figures: " in p.read_text()]
    assert {REPO / "docs" / "benchmarks.md", REPO / "docs" / "benchmarks-zen4-and-xeon-vnni.md",
            REPO / "README.md"} <= set(pages)
    for page in pages:
        assert render_page(page.read_text()) == page.read_text(), \
            f"{page.relative_to(REPO)}: run ortllm bench --render-figures {page.relative_to(REPO)} (make figures)"


def _serve_row(system, metric, median, batch=16):
    return _row("serve-guidellm", system, batch, metric, median, median, median, "")


SERVE = {"machine": "test machine", "commit": "abc1234", "command": "python -m ortllm.bench.serve_guidellm ...",
         "results": [_serve_row(s, m, v) for s, row in {
             "ortllm": {"output_tokens_per_s": 102.4, "completed": 48, "incomplete": 16, "ttft_p50": 1920.0,
                        "ttft_p99": 11170.0, "itl_p50": 97.2, "goodput": 0.017, "goodput_fraction": 0.02,
                        "errors": 0},
             "llama-server-q4_0": {"output_tokens_per_s": 51.2, "completed": 24, "incomplete": 16,
                                   "ttft_p50": 13120.0, "ttft_p99": 17100.0, "itl_p50": 130.0, "goodput": 0.0,
                                   "goodput_fraction": 0.0, "errors": 0}}.items() for m, v in row.items()]}


def test_a_serve_table_and_the_now_table_from_small_results(tmp_path):
    """A GuideLLM run's rows per level and system; the now table's cells: a peer run's own ratio row, and for
    serving ortllm's output tok/s over the fastest peer server's, each linked to its section on its page."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text(json.dumps(RESULTS))
    (tmp_path / "out" / "serve.json").write_text(json.dumps(SERVE))
    serve = ServeTable("out/serve.json", {"ortllm": "ortllm int4", "llama-server-q4_0": "llama-server Q4_0"})
    now = NowTable((NowRow("Zen 4", "tiny", "tiny-on-zen-4", {"decode B = 1": "out/results.json",
                                                             "prefill 512": "out/results.json",
                                                             "served, C = 16": "out/serve.json"}),),
                   serve_section="serving", page="docs/benchmarks.md")
    both = Tables((SPEC["small"], serve))
    page = "<!-- figures: serve -->\n<!-- /figures -->\n<!-- figures: now -->\n<!-- /figures -->\n" \
           "<!-- figures: both -->\n<!-- /figures -->\n"
    out = render_page(page, {"serve": serve, "now": now, "both": both}, root=tmp_path)
    assert """\
| C | system | output tok/s | done / cut | TTFT p50 / p99 (s) | ITL p50 (ms) | goodput (req/s, share) | errors |
|---|---|---|---|---|---|---|---|
| 16 | **ortllm int4** | 102.4 | 48 / 16 | 1.92 / 11.17 | 97 | 0.02 (2%) | 0 |
| 16 | llama-server Q4_0 | 51.2 | 24 / 16 | 13.12 / 17.10 | 130 | 0 | 0 |
- `python -m ortllm.bench.serve_guidellm ...` at abc1234; test machine; results `out/serve.json`
""" in out
    assert ("| Zen 4 | tiny | [0.93x](docs/benchmarks.md#tiny-on-zen-4) llama.cpp Q4_0 | - | "
            "[**2.05x**](docs/benchmarks.md#tiny-on-zen-4) llama.cpp Q4_0 | - | "
            "[**2.00x**](docs/benchmarks.md#serving) llama-server Q4_0 |") in out
    assert EXPECTED + "\n" in out.split("<!-- figures: both -->\n", 1)[1]     # the group: each table, a blank between
    # a section on another page: its path from the directory of the page the bare anchors are on
    assert [now.link(s) for s in ("older.md#tiny", "#tiny", "tiny")] == \
        ["docs/older.md#tiny", "docs/benchmarks.md#tiny", "docs/benchmarks.md#tiny"]
    assert NowTable(()).link("older.md#tiny") == "older.md#tiny" and NowTable(()).link("tiny") == "#tiny"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _unlanded(page: Path, links) -> list[str]:
    """The links of `links`, as written on `page` ("#anchor", or "path.md#anchor" from page's directory), with no
    heading of that anchor on the page they name."""
    out = []
    for link in sorted(links):
        path, _, anchor = link.partition("#")
        target = page.parent / path if path else page
        headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M) if target.is_file() else []
        out += [] if anchor in {_anchor(h) for h in headings} else [link]
    return out


def test_the_now_tables_link_to_sections_that_exist():
    """Each now table's cells, on the page it is rendered on, link to a heading of the page the link names (a
    section moved to another page is found there, not on docs/benchmarks.md); the README's links to the benchmarks
    pages too."""
    for name, page in (("now", REPO / "docs" / "benchmarks.md"), ("now-readme", REPO / "README.md")):
        table = FIGURES[name]
        assert f"<!-- figures: {name} -->" in page.read_text()
        links = {table.link(s) for s in {row.section for row in table.rows} | {table.serve_section}}
        assert not _unlanded(page, links), f"{name} on {page.name}: no heading for {_unlanded(page, links)}"
    benchmarks = REPO / "docs" / "benchmarks.md"
    assert _unlanded(benchmarks, {"#smollm2-on-zen-4", "benchmarks-zen4-and-xeon-vnni.md#now", "nowhere.md#now"}) \
        == ["#smollm2-on-zen-4", "benchmarks-zen4-and-xeon-vnni.md#now", "nowhere.md#now"]     # each one fails
    readme = REPO / "README.md"
    linked = set(re.findall(r"\]\((docs/benchmarks[\w-]*\.md#[\w-]+)\)", readme.read_text()))
    assert linked and not _unlanded(readme, linked), _unlanded(readme, linked)


def test_docs_img_holds_only_what_a_page_renders_or_names():
    """A results file no table renders and no page names leaves docs/img (git keeps it)."""
    text = "\n".join(p.read_text() for p in _pages())
    rendered = {Path(f).name for spec in FIGURES.values() for f in spec.files()}
    stray = [f.name for f in sorted((REPO / "docs" / "img").iterdir()) if f.name not in rendered and f.name not in text]
    assert not stray, f"docs/img files no page renders or names (git rm them): {stray}"
