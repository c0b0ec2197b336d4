"""The model's files on every Ray node (docs/service-scale-out.md, Ray across nodes).

    head (the `ortllm serve --ray` process)          any node
      publish(artifact dir) -> ArtifactRef ---------> EngineReplica: materialize(ref) -> the directory it loads
      ArtifactSource actor (on the head's node):        1. this node's own store (ORTLLM_HOME) holds the
        serves the artifact's files by sha256,             artifact's view (a store name, or fetched before)
        in CHUNK_BYTES pieces, and nothing else         2. a path deployment: the same path here, with the same
                                                           manifest.json (a shared file system)
                                                        3. else: Store.fetch from the ArtifactSource, every blob
                                                           verified against the manifest's sha256 as it is
                                                           written; a mismatch or an unreachable source raises
                                                           ArtifactUnavailable and the replica never starts

The head's files travel over Ray's own connections (an actor call per chunk): no second port to open or secure,
and at most CHUNK_BYTES x FETCH_AHEAD of a file in Ray's object store at a time (a whole model would not fit a
small object store). The digest every node checks against (the sha256 of manifest.json, which lists every
file's sha256) is computed by the head before the deployment starts and travels with the deployment's
arguments, so a changed file at the source is refused, never loaded.
"""
from __future__ import annotations

import hashlib
import logging
import re
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator

from ortllm.runtime import contract as C
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.errors import OrtllmError
from ortllm.runtime.store import ModelRef, Store

log = logging.getLogger("ortllm.service")

SOURCE_ACTOR = "ortllm-artifact-source"
CHUNK_BYTES = 8 << 20           # one actor call's payload
FETCH_AHEAD = 2                 # chunks requested before the first one is written
CHUNK_TIMEOUT_S = 120.0         # one chunk; a source that does not answer in this long is unreachable


class ArtifactUnavailable(OrtllmError):
    """This node cannot get the deployed artifact (source unreachable, a file refused); the message says what to do."""


class ArtifactSource:
    """A Ray actor on the head's node: the deployed artifact's files by sha256 (only those)."""

    def __init__(self, files: dict[str, str]):
        self.files = {sha: Path(p) for sha, p in files.items()}       # sha256 -> the head's file

    def size(self, sha: str) -> int:
        return self._file(sha).stat().st_size

    def read(self, sha: str, offset: int, n: int) -> bytes:
        with open(self._file(sha), "rb") as f:
            f.seek(offset)
            return f.read(n)

    def _file(self, sha: str) -> Path:
        if sha not in self.files:
            raise KeyError(f"sha256-{sha} is not a file of the deployed artifact")
        return self.files[sha]


@dataclass(frozen=True)
class ArtifactRef:
    """What a replica needs to find or fetch the deployed artifact: sent with the deployment's arguments."""
    digest: str                 # sha256 of the head's manifest.json
    path: str                   # the head's artifact directory
    store_name: str | None      # the head's store name when it serves one (each node then looks in its own store)
    source: object              # the ArtifactSource actor's handle

    @property
    def fetch_name(self) -> ModelRef:
        """The name a fetched copy gets in a node's store (kept by `ortllm rm`'s collection, shown by `list`)."""
        if self.store_name:
            return ModelRef.parse(self.store_name)
        stem = re.sub(r"[^a-z0-9._-]+", "-", Path(self.path).name.lower()).strip("-._") or "artifact"
        return ModelRef(stem[:80], f"ray-{self.digest[:12]}")


def _store_name_of(path: Path) -> str | None:
    """The store name of an artifact directory that is a store view ($ORTLLM_HOME/views/<digest>), else None."""
    view = path.resolve()
    if view.parent.name != "views":
        return None
    entries = Store(view.parent.parent).names_of_view(view)
    return entries[0]["name"] if entries else None


def artifact_files(artifact: Path) -> tuple[str, dict[str, str]]:
    """(sha256 of manifest.json, {sha256: file} of every file the manifest lists and of manifest.json itself)."""
    manifest = read_manifest(artifact)
    files = {e["sha256"]: str(artifact / name) for name, e in manifest.files.items()}
    digest = hashlib.sha256((artifact / C.MANIFEST).read_bytes()).hexdigest()
    files[digest] = str(artifact / C.MANIFEST)
    return digest, files


def publish(artifact: Path) -> ArtifactRef:
    """Start the ArtifactSource for this artifact on the calling process's node (detached, named SOURCE_ACTOR;
    unpublish() stops it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    artifact = Path(artifact).resolve()
    digest, files = artifact_files(artifact)
    unpublish()
    here = ray.get_runtime_context().get_node_id()
    source = ray.remote(ArtifactSource).options(
        name=SOURCE_ACTOR, namespace="serve", lifetime="detached", num_cpus=0, max_restarts=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(files)
    return ArtifactRef(digest, str(artifact), _store_name_of(artifact), source)


def unpublish() -> None:
    import ray
    try:
        ray.kill(ray.get_actor(SOURCE_ACTOR, namespace="serve"))
    except ValueError:
        pass                    # none running


def materialize(ref: ArtifactRef) -> tuple[Path, str]:
    """The directory this node loads the artifact from, and how it got here ("store", "path" or "fetched")."""
    store = Store()
    view = store.views / ref.digest
    if (view / C.MANIFEST).is_file():
        return view, "store"
    if not ref.store_name:
        mf = Path(ref.path) / C.MANIFEST
        if mf.is_file() and hashlib.sha256(mf.read_bytes()).hexdigest() == ref.digest:
            return Path(ref.path), "path"
        if mf.is_file():
            log.warning("the artifact at this node's %s is another build than the head's; fetching the head's",
                        ref.path)
    return fetch(ref, store), "fetched"


def fetch(ref: ArtifactRef, store: Store) -> Path:
    """Every file of the artifact from the head's ArtifactSource into this node's store (Store.fetch verifies)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    node = ray.get_runtime_context().get_node_id()[:12]
    what = f"the model {ref.store_name or ref.path} (artifact sha256-{ref.digest[:12]})"
    try:
        log.info("fetching %s from the head into %s", what, store.home)
        return store.fetch(ref.fetch_name, ref.digest, lambda sha: _chunks(ref.source, sha),
                           source=f"the head's ArtifactSource ({ref.path})")
    except (GetTimeoutError, RayError) as e:
        raise ArtifactUnavailable(
            f"node {node}: cannot get {what} from the head ({type(e).__name__}: {e}); this replica does not "
            f"serve. Put the artifact at {ref.path} on this node (a shared file system) or into its store "
            f"(`ortllm pull`), or restart `ortllm serve --ray` on the head") from None
    except OrtllmError as e:
        raise ArtifactUnavailable(f"node {node}: {what}: {e}; this replica does not serve") from None


def _chunks(source, sha: str) -> Iterator[bytes]:
    """One file's bytes from the source, FETCH_AHEAD chunk requests in flight."""
    import ray
    size = ray.get(source.size.remote(sha), timeout=CHUNK_TIMEOUT_S)
    offsets = iter(range(0, size, CHUNK_BYTES))
    pending = deque(source.read.remote(sha, o, CHUNK_BYTES) for o in islice(offsets, FETCH_AHEAD))
    while pending:
        chunk = ray.get(pending.popleft(), timeout=CHUNK_TIMEOUT_S)
        for o in offsets:
            pending.append(source.read.remote(sha, o, CHUNK_BYTES))
            break
        yield chunk
