"""A test's own copy of an artifact without copying its bytes: every file a hard link to the original's
(runtime/atomic_files.link_or_copy; a copy where the file system refuses links).

ortllm writes every file beside and renames it over (runtime/atomic_files.py), so an edit of the copy (an adapter
added or removed, a manifest rewritten) replaces the link and leaves the original's bytes alone. A test that damages
a file in place (write_bytes, open "r+b") writes through the link into the original: it must first replace that
file with a copy of its own (own_file)."""
from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

from ortllm.runtime.atomic_files import link_or_copy


# The files the onnx package reads itself (runtime/base_weights.py: a DoRA adapter's base weights; a test's own
# one-node graph of the artifact's weights): onnx >= 1.19 refuses external data behind a file with several links
# ("a potential hardlink attack"), so a copy whose weights it reads copies them (ORT itself reads links).
ONNX_READS = ("*.onnx.data",)


def linked_copy(src: Path, dst: Path, copied: tuple[str, ...] = ()) -> Path:
    """dst (must not exist): src's tree with each file hard-linked, but those whose names match a pattern of
    `copied` (fnmatch) copied; returns dst."""
    def link(a: str, b: str) -> None:
        if any(fnmatch.fnmatch(Path(a).name, pat) for pat in copied):
            shutil.copyfile(a, b)
        else:
            link_or_copy(a, b)
    shutil.copytree(src, dst, copy_function=link)
    return Path(dst)


def own_file(path: Path) -> Path:
    """path, if a hard link, replaced by a copy of its own, so writing into it leaves the other links' bytes."""
    path = Path(path)
    tmp = path.with_name(path.name + ".own")
    shutil.copyfile(path, tmp)
    tmp.replace(path)
    return path
