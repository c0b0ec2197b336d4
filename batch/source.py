"""The input file, read lazily: each non-blank line becomes a LineItem to run or an error line to write, minus
what the output already answers (a rerun resumes)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .output import BatchFileError, Done, owns_custom_id
from .protocol import LineItem, line_id, parse_line


@dataclass
class Counts:
    lines: int = 0          # non-blank input lines
    skipped: int = 0        # already answered by the output file


def count_lines(path: Path) -> int:
    """Non-blank lines, for the progress bar's total."""
    with open(path, "rb") as f:
        return sum(1 for raw in f if raw.strip())


def read_items(path: Path, done: Done, counts: Counts | None = None) -> Iterator[LineItem | dict]:
    """LineItems and error lines in input order, leaving out what `done` holds."""
    counts = counts if counts is not None else Counts()
    if not Path(path).is_file():
        raise BatchFileError(f"--input {path} is not a file")
    seen: set[str] = set()
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            counts.lines += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                text = f"\x00 byte {e.start} is not UTF-8"        # fails to parse: an invalid_json error line
            item = parse_line(line_no, text, seen)
            if isinstance(item, LineItem):
                own, cid = True, item.custom_id
            else:
                own, cid = owns_custom_id(item), item["custom_id"]
            if done.has(line_id(line_no), cid, own):
                counts.skipped += 1
                continue
            yield item
