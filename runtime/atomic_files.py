"""Every file ortllm changes on disk is written the same two ways (the artifact editor, the store, the hash cache,
the service's uploads):

    atomic_file(path)    write a temporary file beside `path`, rename it over `path` only when the writer is done:
                         a reader sees the old file or the new one, never a part; an error removes the temporary
    link_or_copy(src, dst)   a hard link (no second copy on disk), a copy where the file system refuses links

A file that is a hard link to another artifact's or the store's file is never written through: atomic_file
replaces the link with a new file, so the other side keeps its content.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator


def temp_beside(path: Path) -> Path:
    """A name in path's folder no other writer uses (the store's collection removes `.tmp-*` names it finds)."""
    return path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{path.name}")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, fsync: bool = False) -> Iterator[Path]:
    """Yields a temporary path to write (open it, save into it); on a normal exit it replaces `path`, on an error it
    is removed. fsync: flush the file to disk first (store manifests and blobs, which must survive a crash)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: str | bytes, fsync: bool = False) -> None:
    """Replace path's content with `data` (text is written as UTF-8) through atomic_file."""
    with atomic_file(path, fsync) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """dst as a hard link to src, or a copy where links fail (another file system; ORT refuses external data behind
    a symlink, so never a symlink). dst's folder is made; dst must not exist."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
