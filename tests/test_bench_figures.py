"""bench/figures.py: a page's marked tables are rendered from results.json files, so the docs' figures are the
results files' own. Real files in tmp_path; the repository's own pages are checked to be current."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortllm.bench.figures import FIGURES, PeerTable, main, render_page

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


def test_check_names_a_stale_page_and_the_rewrite_fixes_it(tmp_path, monkeypatch, capsys):
    page = _page(tmp_path)
    monkeypatch.setitem(FIGURES, "small", PeerTable(**{**SPEC["small"].__dict__,
                                                       "results": str(tmp_path / "out" / "results.json")}))
    before = page.read_text()
    assert main([str(page), "--check"]) == 1
    assert page.read_text() == before and str(page) in capsys.readouterr().err
    assert main([str(page)]) == 0 and EXPECTED in page.read_text()
    assert main([str(page), "--check"]) == 0


def test_an_unknown_table_name_says_what_to_do(tmp_path):
    page = _page(tmp_path)
    with pytest.raises(SystemExit, match="no table named 'small'.*add it to FIGURES"):
        render_page(page.read_text(), {}, root=tmp_path)


def test_the_docs_tables_are_their_results_files():
    """Every marked table in docs/ is what its results file gives: edit the results (or FIGURES), not the table."""
    pages = [p for p in sorted((REPO / "docs").rglob("*.md")) if "<!-- figures: " in p.read_text()]
    assert pages, "no docs page has a generated table"
    for page in pages:
        assert render_page(page.read_text()) == page.read_text(), \
            f"{page.relative_to(REPO)}: run python -m ortllm.bench.figures {page.relative_to(REPO)}"
