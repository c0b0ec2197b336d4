"""The artifact contract: manifest, determinism, atomic writes, --out protection, verification at load."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from ortllm.pipeline.build import BuildOptions, build
from ortllm.pipeline.errors import BuildError
from ortllm.runtime import contract as C
from ortllm.runtime.artifact import ArtifactError, load_artifact, sha256_file
from tests.artifact_copies import linked_copy, own_file

QUIET = dict(log=lambda m: None)


def test_manifest_lists_every_file_with_hash_and_size(tiny_artifact):
    manifest = json.loads((tiny_artifact / C.MANIFEST).read_text())
    assert manifest["format_version"] == C.FORMAT_VERSION and manifest["contract_version"] == C.CONTRACT_VERSION
    assert manifest["recipe"] == "llama-tiny-random"
    assert manifest["build"]["quant"] == "fp32" and manifest["graph"] == "portable"
    assert {C.MODEL, C.MODEL_DATA, C.TOKENIZER, C.GENERATION, C.CONFIG} <= set(manifest["files"])
    on_disk = {str(p.relative_to(tiny_artifact)) for p in tiny_artifact.rglob("*") if p.is_file()} - {C.MANIFEST}
    assert on_disk == set(manifest["files"])
    for name, entry in manifest["files"].items():
        assert sha256_file(tiny_artifact / name) == entry["sha256"]
    assert {"onnx", "numpy"} <= set(manifest["tools"])


def test_same_input_same_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    build("llama-tiny-random", a, BuildOptions(), **QUIET)
    build("llama-tiny-random", b, BuildOptions(), **QUIET)
    assert (a / C.MANIFEST).read_bytes() == (b / C.MANIFEST).read_bytes()


def test_out_dir_with_other_artifact_is_refused_unless_force(tmp_path, tiny_artifact):
    out = linked_copy(tiny_artifact, tmp_path / "out")
    with pytest.raises(BuildError, match="holds a different artifact"):
        build("llama-tiny-random", out, BuildOptions(), **QUIET)   # tiny_artifact was built with --exporter optimum
    assert (out / "optimum").is_dir(), "a refused build must leave the old artifact untouched"
    build("llama-tiny-random", out, BuildOptions(), force=True, **QUIET)
    assert not (out / "optimum").exists()
    build("llama-tiny-random", out, BuildOptions(), **QUIET)        # the same artifact again: allowed


def test_out_dir_with_foreign_files_is_refused(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(BuildError, match="not an ortllm artifact"):
        build("llama-tiny-random", out, BuildOptions(), **QUIET)
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("damage, match", [
    ("flip", "model.onnx.data does not match its sha256"),
    ("truncate", "model.onnx.data is .* bytes, the manifest says"),
    ("delete", "model.onnx.data is missing"),
])
def test_damaged_artifact_names_the_file(tmp_path, tiny_artifact, damage, match):
    art = linked_copy(tiny_artifact, tmp_path / "art")
    data = art / C.MODEL_DATA
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        own_file(data).write_bytes(bytes(raw))
    elif damage == "truncate":
        own_file(data).write_bytes(data.read_bytes()[:1000])
    else:
        data.unlink()
    with pytest.raises(ArtifactError, match=match):
        load_artifact(art)


def test_other_contract_version_is_refused(tmp_path, tiny_artifact):
    art = linked_copy(tiny_artifact, tmp_path / "art")
    manifest = json.loads((art / C.MANIFEST).read_text())
    manifest["contract_version"] = C.CONTRACT_VERSION + 1
    own_file(art / C.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="contract_version"):
        load_artifact(art)


def test_interrupted_build_leaves_no_artifact(tmp_path):
    """Kill a real build midway: --out must not exist (nothing that looks like a valid artifact)."""
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "ortllm", "build", "tinyllama-1.1b-shape", "--out", str(out)],
                            stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and not any(tmp_path.glob(".killed.building-*/model.onnx.data")):
        time.sleep(0.2)
    assert any(tmp_path.glob(".killed.building-*")), "the build never started writing"
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    with pytest.raises(ArtifactError):
        load_artifact(out)
    # the next build clears the dead one's leftovers
    build("llama-tiny-random", out, BuildOptions(), **QUIET)
    assert not any(tmp_path.glob(".killed.building-*"))
    load_artifact(out)
