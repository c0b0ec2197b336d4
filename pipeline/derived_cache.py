"""Files a build derives from its inputs alone, kept for the next build of the same inputs: a GGUF's tokenizer
converted to tokenizer.json (Gemma 3's 262k tokens: ~60 s, transformers' merge generation and the GGUF's vocabulary
arrays), and the ONNX tokenizer graphs checked against it (~40 s for Gemma: a session and the whole vocabulary).
Rebuilding a model (another quantization, a test session's many builds) copies them instead.

    $ORTLLM_HOME/derived/{kind}/{key}/   the files, and entry.json: {"value": what the maker returned,
                                         "files": {name: sha256}}

The key is the sha256 of everything the files depend on: the caller's inputs (the GGUF's sha256; the tokenizer
files' bytes) and the maker's own code and libraries (`code_salt`), so a change to either makes a new entry. An entry
is written beside its place and renamed into it (concurrent builds: the first rename wins, the others' copies are
dropped); on use every file's sha256 is checked, and an entry that does not match is made again.
ORTLLM_DERIVED_CACHE=0 turns the cache off.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from ortllm.runtime.hash_cache import ortllm_home, sha256_of


def enabled() -> bool:
    return os.environ.get("ORTLLM_DERIVED_CACHE", "1") != "0"


def code_salt(*modules: str, dists: tuple[str, ...] = ()) -> str:
    """The source bytes of `modules` (files of this package, by path) and the versions of `dists`: what a maker's
    output depends on besides its inputs."""
    h = hashlib.sha256()
    for m in modules:
        h.update(Path(m).read_bytes())
    for d in dists:
        try:
            h.update(f"{d}={importlib.metadata.version(d)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{d}=none".encode())
    return h.hexdigest()


def cached(kind: str, key_parts: list[str | bytes], out_dir: Path, make: Callable[[Path], tuple[object, list[str]]],
           log=print):
    """make(out_dir) -> (a JSON-able value, the names of the files it wrote into out_dir), or the same from the
    entry of this key: its files copied into out_dir (never linked: an artifact file is its own) and its value."""
    if not enabled():
        return make(out_dir)[0]
    h = hashlib.sha256()
    for p in key_parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    entry = ortllm_home() / "derived" / kind / h.hexdigest()
    value = _use(entry, out_dir)
    if value is not None:
        log(f"{kind}: the files of an earlier build of the same inputs ({entry})")
        return value["value"]
    value, files = make(out_dir)
    _keep(entry, out_dir, value, files)
    return value


def _use(entry: Path, out_dir: Path) -> dict | None:
    try:
        meta = json.loads((entry / "entry.json").read_text())
        if any(sha256_of(entry / n) != s for n, s in meta["files"].items()):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name in meta["files"]:
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry / name, out_dir / name)
    return meta


def _keep(entry: Path, out_dir: Path, value, files: list[str]) -> None:
    """Write the entry beside its place and rename it in; a cache that cannot be written costs only the next build."""
    work = entry.with_name(f"{entry.name}.{os.getpid()}.making")
    try:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(entry, ignore_errors=True)       # an entry that failed its check
        work.mkdir(parents=True)
        for name in files:
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out_dir / name, work / name)
        meta = {"value": value, "files": {n: sha256_of(work / n) for n in files}}
        (work / "entry.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.rename(work, entry)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
