"""The local model store under $ORTLLM_HOME (default ~/.cache/ortllm): artifacts by NAME:TAG.

    $ORTLLM_HOME/
      blobs/sha256-<hex>             every artifact file once, named by its content (read-only)
      manifests/<name>/<tag>.json    {"artifact": "sha256-<hex of manifest.json>", "source", "created"}
      views/<hex>/                   the artifact directory ORT loads: hard links to the blobs, one per artifact
      locks/                         store.lock (shared: writers; exclusive: garbage collection), one per pull
      servers/<pid>.json             what a running `ortllm serve` holds (`ortllm ps`, `ortllm rm` refusals)
      hash-cache.json                hash_cache.py

A store manifest points at the artifact's own manifest.json (a blob), which lists every file's sha256: that
list is the only one (no second copy to disagree with). Two names of the same artifact (`ortllm cp`) are two
small manifests; two artifacts sharing a file (tokenizer, weights) share its blob.

Writes are atomic: blobs are hashed as they are written and renamed into place only when they match the
manifest; the store manifest is written last, so an interrupted pull leaves no name, only blobs that the
next `ortllm rm` (garbage collection) removes.
"""
from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from . import contract as C
from .artifact import ArtifactError, Manifest
from .atomic_files import atomic_file, atomic_write, link_or_copy
from .errors import OrtllmError
from .hash_cache import HashCache, ortllm_home
from .process import pid_alive

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
DEFAULT_TAG = "latest"


class StoreError(OrtllmError):
    """A store name is unknown or invalid, or the store refused an operation; the message says what to do."""


@dataclass(frozen=True, order=True)
class ModelRef:
    name: str
    tag: str

    def __str__(self) -> str:
        return f"{self.name}:{self.tag}"

    @classmethod
    def parse(cls, text: str, default_tag: str | None = DEFAULT_TAG) -> "ModelRef":
        """NAME[:TAG]; a missing tag is `default_tag` (None: keep it empty, for lookups that infer it)."""
        name, _, tag = str(text).partition(":")
        tag = tag or default_tag or ""
        if not _NAME.match(name) or (tag and not _TAG.match(tag)):
            raise StoreError(f"{text!r} is not a store name: use NAME:TAG with lower-case letters, digits, '.', "
                             "'_', '-' in NAME (e.g. smollm2-135m-instruct:int4)")
        return cls(name, tag)


def looks_like_name(text: str) -> bool:
    """A command-line value that is a store name rather than a path (no '/', valid NAME[:TAG])."""
    name, _, tag = str(text).partition(":")
    return "/" not in str(text) and bool(_NAME.match(name)) and (not tag or bool(_TAG.match(tag)))


class Store:
    def __init__(self, home: str | os.PathLike | None = None):
        self.home = Path(home).expanduser() if home is not None else ortllm_home()
        self.blobs = self.home / "blobs"
        self.manifests = self.home / "manifests"
        self.views = self.home / "views"
        self.locks = self.home / "locks"
        self.servers = self.home / "servers"

    # ---------------------------------------------------------------- locks
    @contextlib.contextmanager
    def _flock(self, path: Path, exclusive: bool, wait_message: Callable[[], None] | None = None) -> Iterator[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as f:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                fcntl.flock(f, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if wait_message:
                    wait_message()
                fcntl.flock(f, mode)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def scratch(self, kind: str) -> Iterator[Path]:
        """A new directory $ORTLLM_HOME/tmp/<kind>-<pid>-<random>/ for a build or a draft (`ortllm pull`, Ollama's
        create), on the store's file system so its files link into blobs; removed whatever happens (a killed
        process's by the next collection)."""
        work = self.home / "tmp" / f"{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        work.mkdir(parents=True)
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def writing(self):
        """Held (shared) while blobs, views or manifests are added; garbage collection waits for it."""
        return self._flock(self.locks / "store.lock", exclusive=False)

    def collecting(self):
        return self._flock(self.locks / "store.lock", exclusive=True)

    def pull_lock(self, ref: ModelRef, on_wait: Callable[[], None] | None = None):
        """One pull of a name at a time; a second waits (on_wait says so) and then finds the first's result."""
        return self._flock(self.locks / f"pull-{ref.name}@{ref.tag}.lock", exclusive=True, wait_message=on_wait)

    # ---------------------------------------------------------------- names
    def _manifest_path(self, ref: ModelRef) -> Path:
        return self.manifests / ref.name / f"{ref.tag}.json"

    def refs(self) -> list[ModelRef]:
        if not self.manifests.is_dir():
            return []
        return sorted(ModelRef(p.parent.name, p.stem) for p in self.manifests.glob("*/*.json")
                      if not p.name.startswith("."))

    def names(self) -> list[str]:
        return [str(r) for r in self.refs()]

    def has(self, ref: ModelRef) -> bool:
        return self._manifest_path(ref).is_file()

    def resolve(self, text: str) -> ModelRef:
        """NAME:TAG, or NAME alone when it has a `latest` tag or a single tag; else a StoreError naming the
        closest names."""
        ref = ModelRef.parse(text, default_tag=None)
        if ref.tag:
            if self.has(ref):
                return ref
        else:
            tags = sorted(p.stem for p in (self.manifests / ref.name).glob("*.json") if not p.name.startswith("."))
            if DEFAULT_TAG in tags or len(tags) == 1:
                return ModelRef(ref.name, DEFAULT_TAG if DEFAULT_TAG in tags else tags[0])
            if tags:
                raise StoreError(f"{ref.name} has several tags ({', '.join(tags)}); say which, e.g. "
                                 f"{ref.name}:{tags[0]}")
        names = self.names()
        close = difflib.get_close_matches(str(text), names, n=3, cutoff=0.4) or \
            [n for n in names if n.startswith(ref.name)][:3]
        hint = f"; closest: {', '.join(close)}" if close else (
            f"; in the store: {', '.join(names[:8])}" if names else "; the store is empty")
        raise StoreError(f"no model {text!r} in the store ({self.home}){hint}; see `ortllm list`, "
                         "or add it with `ortllm pull RECIPE|GGUF|HF_DIR|ARTIFACT_DIR --name NAME:TAG`")

    def entry(self, ref: ModelRef) -> dict:
        try:
            return json.loads(self._manifest_path(ref).read_text())
        except FileNotFoundError:
            raise StoreError(f"no model {str(ref)!r} in the store; see `ortllm list`") from None
        except ValueError as e:
            raise StoreError(f"the store manifest of {ref} is damaged ({e}); remove it with `ortllm rm {ref}` "
                             "and pull it again") from None

    def blob(self, digest: str) -> Path:
        return self.blobs / f"sha256-{digest}"

    def artifact_manifest(self, entry: dict):
        """The artifact's manifest (an artifact.Manifest) from its blob."""

        digest = entry["artifact"].removeprefix("sha256-")
        try:
            return Manifest.from_dict(json.loads(self.blob(digest).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StoreError(f"the artifact manifest blob sha256-{digest} of {entry.get('name')} is missing or "
                             f"damaged ({e}); pull it again with --force") from None

    def _files(self, entry: dict) -> dict[str, str]:
        """relative path -> sha256 of every file of an entry's artifact, manifest.json included."""
        files = {name: e["sha256"] for name, e in self.artifact_manifest(entry).files.items()}
        files[C.MANIFEST] = entry["artifact"].removeprefix("sha256-")
        return files

    # ---------------------------------------------------------------- reading
    def path(self, text: str) -> Path:
        """The artifact directory of a store name (its view, made on first use); load it as any artifact."""
        ref = self.resolve(text)
        entry = self.entry(ref)
        digest = entry["artifact"].removeprefix("sha256-")
        view = self.views / digest
        if (view / C.MANIFEST).is_file():
            return view
        with self.writing():
            return self._make_view(entry)

    def _make_view(self, entry: dict) -> Path:
        """views/<digest>/: a hard link per artifact file (a copy where the file system refuses links)."""
        digest = entry["artifact"].removeprefix("sha256-")
        view = self.views / digest
        if (view / C.MANIFEST).is_file():
            return view
        files = self._files(entry)
        for name, sha in files.items():
            if not self.blob(sha).is_file():
                raise StoreError(f"blob sha256-{sha} ({name}) of {entry.get('name')} is missing from the store; "
                                 f"repair with: {self.repair_command(entry)}")
        tmp = self.views / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            for name, sha in files.items():
                link_or_copy(self.blob(sha), tmp / name)
            try:
                tmp.rename(view)
            except OSError:           # another process made it first
                if not (view / C.MANIFEST).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return view

    def repair_command(self, entry: dict) -> str:
        src = entry.get("source") or "SOURCE"
        return f"ortllm pull {src} --name {entry.get('name')} --force"

    def info(self, ref: ModelRef) -> dict:
        """What `list` and `show` print: the entry, the artifact manifest's summary, bytes on disk."""
        entry = self.entry(ref)
        man = self.artifact_manifest(entry)
        files = self._files(entry)
        return {"name": str(ref), "entry": entry, "manifest": man, "size": man.size_bytes, "files": files,
                "quant": man.quant, "kv": man.kv, "graph": man.graph, "adapters": sorted(man.adapters)}

    # ---------------------------------------------------------------- writing
    def put(self, src: str | os.PathLike, ref: ModelRef, source: str, force: bool = False,
            progress: Callable[[int], None] | None = None) -> dict:
        """Copy an artifact directory into the store as `ref` (verified as each blob is written).

        progress(n) is called with bytes as they are processed. Returns the new store manifest."""
        from .artifact import read_manifest

        src = Path(src)
        man = read_manifest(src)
        manifest_bytes = (src / C.MANIFEST).read_bytes()
        digest = hashlib.sha256(manifest_bytes).hexdigest()
        cache = HashCache.default()
        with self.writing():
            if self.has(ref) and not force:
                raise StoreError(f"{ref} is already in the store; pass --force to replace it, or choose another "
                                 "--name")
            for name, e in sorted(man.files.items()):
                self._put_blob(src / name, e["sha256"], e["size"], name, cache, progress)
            self._put_blob(src / C.MANIFEST, digest, len(manifest_bytes), C.MANIFEST, cache, progress)
            entry = {"schema": 1, "name": str(ref), "artifact": f"sha256-{digest}", "source": source,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            self._make_view(entry)
            atomic_write(self._manifest_path(ref), json.dumps(entry, indent=2, sort_keys=True) + "\n", fsync=True)
        cache.save()
        return entry

    def _put_blob(self, src: Path, sha: str, size: int, name: str, cache: HashCache,
                  progress: Callable[[int], None] | None) -> None:
        """Write one blob from a file unless the store has it."""
        def blocks() -> Iterator[bytes]:
            with open(src, "rb") as fi:
                while block := fi.read(1 << 22):
                    yield block
        self._write_blob(blocks, sha, size, cache, progress,
                         lambda: f"{src} does not match its sha256 in the artifact's manifest ({name}): the source "
                         "artifact is damaged; rebuild it with --force, then pull again")

    def _has_blob(self, sha: str, size: int | None, cache: HashCache) -> bool:
        """The store holds this blob with the right bytes (hashed once, then by the hash cache); size None: any."""
        dst = self.blob(sha)
        with contextlib.suppress(OSError):
            st = dst.stat()
            return (size is None or st.st_size == size) and cache.sha256(dst, st) == sha
        return False

    def _write_blob(self, blocks: Callable[[], Iterable[bytes]], sha: str, size: int | None, cache: HashCache,
                    progress: Callable[[int], None] | None, mismatch: Callable[[], str]) -> None:
        """Write one blob unless the store has it: the bytes of blocks() are hashed while written and renamed into
        place only if they match `sha` (else a StoreError with mismatch(), and nothing is left behind)."""
        dst = self.blob(sha)
        if self._has_blob(sha, size, cache):
            if progress and size:
                progress(size)
            return
        # a damaged blob is written again, and views relinked to the new one
        damaged = dst.stat().st_ino if dst.is_file() else None
        h = hashlib.sha256()
        with atomic_file(dst) as tmp:
            with open(tmp, "wb") as fo:
                for block in blocks():
                    h.update(block)
                    fo.write(block)
                    if progress:
                        progress(len(block))
                fo.flush()
                os.fsync(fo.fileno())
            if h.hexdigest() != sha:
                raise StoreError(mismatch())
            os.chmod(tmp, 0o444)
        if damaged is not None:
            self._relink(damaged, dst)
        cache.remember(dst, sha)

    def fetch(self, ref: ModelRef, digest: str, read: Callable[[str], Iterable[bytes]], source: str,
              progress: Callable[[int], None] | None = None) -> Path:
        """Add the artifact whose manifest.json has sha256 `digest` from a content-addressed source, as `ref`;
        returns its view. read(sha) yields a blob's bytes; every blob (the manifest first) is verified against
        its sha256 as it is written and refused on a mismatch (StoreError naming the file and `source`), so a file
        that did not match is never in the store. Blobs the store already holds are not fetched again."""
        cache = HashCache.default()

        def refused(name: str, sha: str) -> str:
            return (f"{name} (sha256-{sha[:12]}) as received from {source} does not match its sha256 in the "
                    "artifact's manifest: refused (the copy there is damaged or was changed after the manifest was "
                    "written); repair the source artifact, then deploy again")

        with self.pull_lock(ref), self.writing():
            self._write_blob(lambda: read(digest), digest, None, cache, progress, lambda: refused(C.MANIFEST, digest))
            entry = {"schema": 1, "name": str(ref), "artifact": f"sha256-{digest}", "source": source,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            man = self.artifact_manifest(entry)
            for name, e in sorted(man.files.items()):
                self._write_blob(lambda sha=e["sha256"]: read(sha), e["sha256"], e["size"], cache,
                                 progress, lambda name=name, sha=e["sha256"]: refused(name, sha))
            view = self._make_view(entry)
            if not self.has(ref) or self.entry(ref).get("artifact") != entry["artifact"]:
                atomic_write(self._manifest_path(ref), json.dumps(entry, indent=2, sort_keys=True) + "\n",
                             fsync=True)
        cache.save()
        return view

    def _relink(self, old_ino: int, blob: Path) -> None:
        """Point every view file that was a link to a replaced (damaged) blob at its new copy."""
        if not self.views.is_dir():
            return
        for f in self.views.rglob("*"):
            with contextlib.suppress(OSError):
                if not f.is_symlink() and f.is_file() and f.stat().st_ino == old_ino:
                    with atomic_file(f) as tmp:
                        os.link(blob, tmp)

    def copy(self, src: str, dst: str, force: bool = False) -> ModelRef:
        """`ortllm cp`: a second name for the same artifact (a new small manifest; no file is copied)."""
        sref = self.resolve(src)
        dref = ModelRef.parse(dst)
        entry = {**self.entry(sref), "name": str(dref),
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with self.writing():
            if self.has(dref) and not force:
                raise StoreError(f"{dref} is already in the store; `ortllm rm {dref}` first or pass --force")
            atomic_write(self._manifest_path(dref), json.dumps(entry, indent=2, sort_keys=True) + "\n", fsync=True)
        return dref

    # ---------------------------------------------------------------- removing
    def remove(self, text: str) -> tuple[ModelRef, int]:
        """Drop a name, then collect what no name refers to. Refused while a running server serves it.
        Returns (the name, bytes freed)."""
        ref = self.resolve(text)
        for srv in self.live_servers():
            if str(ref) in {m["name"] for m in srv.get("models", [])}:
                raise StoreError(f"{ref} is served by a running server (pid {srv['pid']}, {srv.get('url')}); stop "
                                 f"it first (or remove another name of it), then `ortllm rm {ref}`")
        with self.collecting():
            self._manifest_path(ref).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self._manifest_path(ref).parent.rmdir()
            return ref, self._collect()

    def gc(self) -> int:
        with self.collecting():
            return self._collect()

    def _collect(self) -> int:
        """Remove blobs and views no manifest refers to, and temporary files of dead writers. Bytes freed."""
        keep_blobs, keep_views = set(), set()
        for ref in self.refs():
            entry = self.entry(ref)
            keep_views.add(entry["artifact"].removeprefix("sha256-"))
            try:
                keep_blobs.update(self._files(entry).values())
            except StoreError:
                keep_blobs.add(entry["artifact"].removeprefix("sha256-"))
        freed = 0
        for work in (self.home / "tmp").glob("*-*-*"):      # scratch directories (pulls, creates) of killed processes
            pid = work.name.split("-")[1]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(work, ignore_errors=True)
        if self.views.is_dir():
            for v in self.views.iterdir():
                if v.name not in keep_views:
                    shutil.rmtree(v, ignore_errors=True)
        if self.blobs.is_dir():
            for b in self.blobs.iterdir():
                sha = b.name.removeprefix("sha256-")
                if b.name.startswith("sha256-") and sha in keep_blobs:
                    continue
                with contextlib.suppress(OSError):
                    st = b.stat()
                    b.unlink()
                    if st.st_nlink <= 1:
                        freed += st.st_size
        return freed

    def disk_bytes(self) -> int:
        """Bytes the blobs take on disk (each once, whatever links point at it)."""
        if not self.blobs.is_dir():
            return 0
        return sum(b.stat().st_blocks * 512 for b in self.blobs.iterdir() if b.is_file())

    # ---------------------------------------------------------------- servers (`ortllm ps`)
    def register_server(self, state: dict) -> Path:
        """Write this process's server state (replaced atomically at each change)."""
        path = self.servers / f"{os.getpid()}.json"
        atomic_write(path, json.dumps({**state, "pid": os.getpid()}, indent=2) + "\n", fsync=True)
        return path

    def unregister_server(self) -> None:
        (self.servers / f"{os.getpid()}.json").unlink(missing_ok=True)

    def live_servers(self) -> list[dict]:
        out = []
        if not self.servers.is_dir():
            return out
        for p in sorted(self.servers.glob("*.json")):
            try:
                state = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if pid_alive(int(state.get("pid", 0))):
                out.append(state)
            else:
                p.unlink(missing_ok=True)      # a server that died without cleaning up
        return out

    # ---------------------------------------------------------------- repair hints (with_store_repair_hint)
    def names_of_view(self, view: Path) -> list[dict]:
        digest = view.name
        return [e for r in self.refs() if (e := self.entry(r))["artifact"] == f"sha256-{digest}"]


def repair_hint_for_view(path: Path) -> str | None:
    """For an artifact directory that is a store view: the pull that repairs it."""
    try:
        view = path.resolve()
        store = Store(view.parent.parent)
        if view.parent != store.views.resolve():
            return None
        entries = store.names_of_view(view)
    except (OSError, OrtllmError):
        return None
    if not entries:
        return None
    return (f"the store model {entries[0]['name']} is damaged; repair it with: "
            f"{store.repair_command(entries[0])}")


def with_store_repair_hint(e: ArtifactError) -> ArtifactError:
    """A damaged artifact's error, naming the pull that repairs it when the directory is a store view (a
    view is not rebuilt in place); any other error as it is. For the store's callers: the CLI, the service."""
    if e.damaged is None:
        return e
    hint = repair_hint_for_view(Path(e.damaged))
    return e if hint is None else e.with_hint(hint)

