"""sha256 of files, remembered by what the file system says about them.

Hashing every artifact file at each load costs ~0.7 s for SmolLM2 int4 (docs/notes/benchmarks.md, Startup). A file
whose device, inode, size, mtime and ctime are all unchanged since it was hashed has the same bytes unless
someone wrote it and then reset both clocks (ctime cannot be set from user space), so its hash is taken from
this cache. Anything else — another inode (replaced), another size or time (written), a file never seen — is
hashed again. `ORTLLM_VERIFY=1` (or `--verify` on the command line) re-hashes everything.

The cache is one JSON file, $ORTLLM_HOME/hash-cache.json: {"DEV:INO:SIZE:MTIME_NS:CTIME_NS": sha256}, merged
and replaced atomically on save, so concurrent processes lose at most an entry (which is then hashed again).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from .atomic_files import atomic_write

MAX_ENTRIES = 20_000


def ortllm_home() -> Path:
    """$ORTLLM_HOME, default ~/.cache/ortllm: the store, the hash cache."""
    return Path(os.environ.get("ORTLLM_HOME") or Path.home() / ".cache" / "ortllm").expanduser()


def full_verify_forced() -> bool:
    return os.environ.get("ORTLLM_VERIFY", "") not in ("", "0")


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class HashCache:
    _default: "HashCache | None" = None
    _default_lock = threading.Lock()

    def __init__(self, file: Path):
        self.file = Path(file)
        self._lock = threading.Lock()
        self._entries: dict[str, str] | None = None
        self._new: dict[str, str] = {}
        self.hits = self.misses = 0

    @classmethod
    def default(cls) -> "HashCache":
        """One cache per process and ORTLLM_HOME."""
        file = ortllm_home() / "hash-cache.json"
        with cls._default_lock:
            if cls._default is None or cls._default.file != file:
                cls._default = cls(file)
            return cls._default

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.file.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def sha256(self, path: Path, st: os.stat_result | None = None, full: bool = False) -> str:
        """The file's sha256: from the cache when its stat key is known (and not `full`), else hashed now."""
        st = st or os.stat(path)
        key = stat_key(st)
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            known = None if full else self._entries.get(key)
        if known is not None:
            self.hits += 1
            return known
        self.misses += 1
        digest = sha256_of(path)
        if stat_key(os.stat(path)) == key:     # unchanged while we read it: safe to remember
            self.remember(path, digest, st)
        return digest

    def remember(self, path: Path, digest: str, st: os.stat_result | None = None) -> None:
        """Record a hash just computed from the file's bytes (e.g. while writing a store blob)."""
        key = stat_key(st or os.stat(path))
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            self._entries[key] = digest
            self._new[key] = digest

    def save(self) -> None:
        """Merge new entries into the file (atomic replace); a read-only home only loses the speed-up."""
        with self._lock:
            if not self._new:
                return
            merged = {**self._read(), **self._new}
            if len(merged) > MAX_ENTRIES:      # keep the newest: ours last
                merged = dict(list(merged.items())[-MAX_ENTRIES:])
            try:
                atomic_write(self.file, json.dumps(merged))
                self._new.clear()
            except OSError:
                pass
