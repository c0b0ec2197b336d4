"""The output file: append-only, crash-safe, resumable.

- Each line goes out in ONE os.write() of the whole line + "\\n" on an O_APPEND descriptor (a write to a
  regular file completes or does not happen when the process is killed), then os.fsync every `fsync_every`
  lines or `fsync_s` seconds and at close.
- On open, a torn last line (no trailing newline, or not JSON) is truncated away; a bad line elsewhere is
  not ours to repair and stops the job with a message.
- `done` tells what a rerun skips: the custom_ids already answered, and the ids (batch_req_<input line>) of
  lines that carry no custom_id of their own (missing or repeated custom_id).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ortllm.runtime.errors import OrtllmError



class BatchFileError(OrtllmError):
    """The input or output file cannot be used as it is; the message says what to do."""


@dataclass
class Done:
    custom_ids: set[str] = field(default_factory=set)
    line_ids: set[str] = field(default_factory=set)
    lines: int = 0

    def has(self, line_id: str, custom_id: str | None, own: bool) -> bool:
        """own: the line answers custom_id itself (not a missing/duplicate custom_id error line)."""
        return (custom_id in self.custom_ids) if own else (line_id in self.line_ids)


def repair_and_scan(path: Path) -> Done:
    """Truncate a torn last line; return what the file already answers."""
    done = Done()
    if not path.exists():
        return done
    with open(path, "r+b") as f:
        data = f.read()
        keep = len(data)
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1            # the torn tail (0: the only line is torn)
        lines = data[:keep].splitlines()
        if lines and _parse(lines[-1]) is None:     # last line complete but not JSON: torn in another way
            keep -= len(lines[-1]) + 1
            lines.pop()
        if keep != len(data):
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    for n, raw in enumerate(lines, 1):
        obj = _parse(raw)
        if obj is None or not isinstance(obj.get("id"), str):
            raise BatchFileError(f"{path} line {n} is not an output line of `ortllm batch`; pass a new --output "
                                 "or remove that line to resume")
        if not owns_custom_id(obj):
            done.line_ids.add(obj["id"])
        else:
            done.custom_ids.add(obj["custom_id"])
        done.lines += 1
    return done


def owns_custom_id(line: dict) -> bool:
    """False for error lines whose custom_id is absent or belongs to an earlier line (tracked by line id)."""
    return line.get("custom_id") is not None and (line.get("error") or {}).get("code") != "duplicate_custom_id"


def _parse(raw: bytes) -> dict | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class ResultWriter:
    def __init__(self, path: Path, fsync_every: int = 64, fsync_s: float = 1.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.fsync_every, self.fsync_s = fsync_every, fsync_s
        self._unsynced = 0
        self._last_sync = time.monotonic()
        self.written = 0

    def write(self, line: dict) -> None:
        data = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        n = os.write(self.fd, data)
        if n != len(data):       # only on a full disk; say so rather than leave half a line behind
            os.ftruncate(self.fd, os.fstat(self.fd).st_size - n)
            raise BatchFileError(f"could not write {self.path} (disk full?); free space and rerun to resume")
        self.written += 1
        self._unsynced += 1
        if self._unsynced >= self.fsync_every or time.monotonic() - self._last_sync >= self.fsync_s:
            self.sync()

    def sync(self) -> None:
        if self._unsynced:
            os.fsync(self.fd)
            self._unsynced = 0
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self.fd >= 0:
            self.sync()
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
