"""The how-to pages (docs/howto-add-a-model.md) walk a contributor through code that exists:
every ```python / ```cpp block on them is quoted from the repository file named last before it (`path/to/file.py`),
line for line, so a page cannot drift from the code it teaches."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = ["docs/howto-add-a-model.md", "docs/howto-add-an-op.md", "docs/howto-add-an-isa.md"]
_BLOCK = re.compile(r"```(python|cpp)\n(.*?)```", re.S)
_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|h|cc))`")


def quoted_blocks(page: str) -> list[tuple[str, str]]:
    """(the file a block quotes, the block) for each code block of `page`."""
    text, out = (REPO / page).read_text(), []
    for m in _BLOCK.finditer(text):
        paths = _PATH.findall(text[:m.start()])
        assert paths, f"{page}: the block at offset {m.start()} names no file before it"
        out.append((paths[-1], m.group(2)))
    return out


@pytest.mark.parametrize("page", PAGES)
def test_every_block_is_in_the_file_it_names(page):
    blocks = quoted_blocks(page)
    assert len(blocks) >= 3, f"{page} quotes {len(blocks)} blocks"
    for path, block in blocks:
        source = (REPO / path).read_text()
        for line in filter(str.strip, block.splitlines()):
            assert line in source, f"{page}: '{line.strip()}' is not in {path} any more: update the page"


def test_the_check_catches_a_stale_quote(tmp_path, monkeypatch):
    """A planted page quoting a line the file does not have fails the check."""
    (tmp_path / "docs").mkdir()
    quote = "In `tests/test_howto_pages.py`:\n\n```python\ndef here():\n```\n"
    (tmp_path / "docs" / "p.md").write_text(quote * 2 + quote.replace("here", "not_here"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_howto_pages.py").write_text("def here():\n")
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    with pytest.raises(AssertionError, match="not in tests/test_howto_pages.py"):
        test_every_block_is_in_the_file_it_names("docs/p.md")
