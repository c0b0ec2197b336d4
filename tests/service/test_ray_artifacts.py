"""The model's files reaching a Ray node by content hash (service/ray_artifacts.py, runtime/store.py Store.fetch),
without Ray: the head's ArtifactSource is called in process, the receiving node's store is a second ORTLLM_HOME.
The same code runs on the nodes of tests/service/test_ray_nodes.py (`make test-ray`)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ortllm.runtime import contract as C
from ortllm.runtime.artifact import load_artifact, read_manifest
from ortllm.runtime.store import ModelRef, Store, StoreError
from ortllm.service.ray_artifacts import ArtifactRef, ArtifactSource, artifact_files


class Counting:
    """The head's ArtifactSource, read the way a replica reads it (size, then pieces), counting bytes sent."""

    def __init__(self, artifact: Path, piece: int = 1000):
        self.digest, files = artifact_files(artifact)
        self.source = ArtifactSource(files)
        self.piece = piece
        self.sent = 0

    def read(self, sha: str):
        size = self.source.size(sha)
        for offset in range(0, size, self.piece):
            chunk = self.source.read(sha, offset, self.piece)
            self.sent += len(chunk)
            yield chunk


@pytest.fixture
def node_home(tmp_path, monkeypatch) -> Path:
    """The receiving node's ORTLLM_HOME (its hash cache too), empty."""
    home = tmp_path / "node-home"
    monkeypatch.setenv("ORTLLM_HOME", str(home))
    return home


def test_a_node_without_the_model_gets_it_by_hash_and_loads_it(tiny_engine, node_home):
    src = Counting(tiny_engine)
    store = Store(node_home)
    ref = ModelRef("tiny", "ray-" + src.digest[:12])
    view = store.fetch(ref, src.digest, src.read, source="the head")
    assert view == store.views / src.digest
    art = load_artifact(view, full=True)                  # every file re-hashed against the manifest
    for name in [*art.manifest.files, C.MANIFEST]:
        assert (view / name).read_bytes() == (tiny_engine / name).read_bytes(), name
    total = sum(e["size"] for e in read_manifest(tiny_engine).files.values())
    assert src.sent == total + (tiny_engine / C.MANIFEST).stat().st_size
    assert store.names() == [str(ref)]                    # kept by `ortllm rm`'s collection, shown by `list`

    again = Counting(tiny_engine)
    assert store.fetch(ref, again.digest, again.read, source="the head") == view
    assert again.sent == 0                                # the blobs it holds are not sent again


def test_a_tampered_file_is_refused_and_never_stored(tiny_engine, tmp_path, node_home):
    head = tmp_path / "head-art"
    shutil.copytree(tiny_engine, head)
    man = read_manifest(head)
    name = max(man.files, key=lambda n: man.files[n]["size"])     # the weights
    target = head / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01                          # one bit, same size: only the hash can tell
    os.chmod(target, 0o644)
    target.write_bytes(bytes(data))

    src = Counting(head)                                  # its manifest still lists the original sha256
    store = Store(node_home)
    with pytest.raises(StoreError, match=rf"{name} \(sha256-[0-9a-f]{{12}}\) as received from the head does not "
                                         r"match its sha256 in the artifact's manifest: refused"):
        store.fetch(ModelRef("tiny", "latest"), src.digest, src.read, source="the head")
    bad_sha = man.files[name]["sha256"]
    assert not store.blob(bad_sha).exists()               # nothing under the manifest's name for that file
    assert not list(store.blobs.glob(".tmp-*"))           # and no half-written temporary
    assert store.names() == [] and not (store.views / src.digest).exists()


def test_a_tampered_manifest_is_refused(tiny_engine, tmp_path, node_home):
    """The digest a node checks comes from the head's deployment arguments: a manifest.json changed at the
    source afterwards (e.g. to list a changed file's new hash) is refused before any other file is read."""
    head = tmp_path / "head-art"
    shutil.copytree(tiny_engine, head)
    src = Counting(head)                                  # published: the digest of the manifest as it was
    mf = head / C.MANIFEST
    os.chmod(mf, 0o644)
    mf.write_text(mf.read_text().replace('"format_version"', ' "format_version"', 1))
    with pytest.raises(StoreError, match=r"manifest.json \(sha256-.* refused"):
        Store(node_home).fetch(ModelRef("tiny", "latest"), src.digest, src.read, "the head")
    assert src.sent == mf.stat().st_size and not Store(node_home).blob(src.digest).exists()


def test_the_source_serves_only_the_artifact_files(tiny_engine):
    digest, files = artifact_files(tiny_engine)
    source = ArtifactSource(files)
    assert source.read(digest, 0, 1 << 20) == (tiny_engine / C.MANIFEST).read_bytes()
    with pytest.raises(KeyError, match="not a file of the deployed artifact"):
        source.read("0" * 64, 0, 10)


def test_fetch_names_a_path_deployment_by_its_directory_and_digest():
    ref = ArtifactRef("ab" * 32, "/models/My Model_v2", None, source=None)
    assert str(ref.fetch_name) == "my-model_v2:ray-" + "ab" * 6
    assert str(ArtifactRef("ab" * 32, "/x", "tiny:fp32", source=None).fetch_name) == "tiny:fp32"
