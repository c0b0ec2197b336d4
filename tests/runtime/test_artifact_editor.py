"""runtime/artifact_editor.py, atomic_files.py and model_create.py: a draft from a base never writes through the
base's files, the manifest is written last and verifies, a failed write leaves the old file, and Ollama's create
(as a runtime function, without HTTP) puts a model with its adapter and defaults into a store."""
from __future__ import annotations

import json

import pytest

from ortllm.runtime import contract as C
from ortllm.runtime.artifact import load_artifact, read_manifest
from ortllm.runtime.artifact_editor import ArtifactDraft, read_defaults
from ortllm.runtime.atomic_files import atomic_file, atomic_write, link_or_copy
from ortllm.runtime.errors import AdapterFileError
from ortllm.runtime.model_create import create_model
from ortllm.runtime.store import ModelRef, Store


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    f = tmp_path / "a.json"
    atomic_write(f, "old")
    with pytest.raises(RuntimeError):
        with atomic_file(f) as tmp:
            tmp.write_text("half")
            raise RuntimeError("the writer failed")
    assert f.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
    atomic_write(f, b"new", fsync=True)
    assert f.read_bytes() == b"new"


def test_a_rewritten_link_leaves_its_source(tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("base")
    link_or_copy(src, tmp_path / "d" / "dst.txt")
    atomic_write(tmp_path / "d" / "dst.txt", "changed")
    assert src.read_text() == "base" and (tmp_path / "d" / "dst.txt").read_text() == "changed"


def test_a_draft_from_a_base_changes_only_its_own_files(tiny_engine, tmp_path):
    base_manifest = (tiny_engine / C.MANIFEST).read_bytes()
    base_config = (tiny_engine / C.TOKENIZER_CONFIG).read_bytes()
    draft = ArtifactDraft.from_base(tiny_engine, tmp_path / "work")
    draft.update_json(C.TOKENIZER_CONFIG, lambda cfg: {**cfg, "chat_template": "{{ messages }}"})
    draft.set_defaults({"from": "tiny", "system": "Be brief."})
    assert (draft.path / C.MANIFEST).read_bytes() == base_manifest      # the manifest waits for commit()
    draft.commit()
    assert (tiny_engine / C.MANIFEST).read_bytes() == base_manifest
    assert (tiny_engine / C.TOKENIZER_CONFIG).read_bytes() == base_config
    load_artifact(draft.path, full=True)                                # every file's sha256 as listed
    man = read_manifest(draft.path)
    assert C.MODELFILE in man.files and read_defaults(draft.path)["system"] == "Be brief."
    assert json.loads((draft.path / C.TOKENIZER_CONFIG).read_text())["chat_template"] == "{{ messages }}"
    assert read_defaults(tiny_engine) == {}


def test_a_removed_file_goes_after_the_manifest(tiny_engine, tmp_path):
    draft = ArtifactDraft.from_base(tiny_engine, tmp_path / "work")
    draft.write_file("notes.txt", "x")
    draft.commit()
    draft = ArtifactDraft.in_place(tmp_path / "work")
    draft.remove_file("notes.txt")
    assert (tmp_path / "work" / "notes.txt").exists()
    draft.commit()
    assert not (tmp_path / "work" / "notes.txt").exists() and "notes.txt" not in read_manifest(draft.path).files


def test_create_model_puts_a_model_with_its_adapter_and_defaults(tiny_engine, tmp_path, monkeypatch):
    from ortllm.pipeline.sources import load_model
    from tests.reference.peft_lora import make_peft_lora

    peft = tmp_path / "peft"
    make_peft_lora(load_model("llama-tiny-random")[1], peft, seed=5, r=8, targets=["q_proj", "v_proj"])
    monkeypatch.setenv("ORTLLM_HOME", str(tmp_path / "home"))
    store = Store()
    store.put(tiny_engine, ModelRef("tiny", "latest"), source="test")
    files = {f.name: f for f in peft.iterdir() if f.is_file()}
    lines = list(create_model(store, ModelRef("tuned", "latest"), store.path("tiny"), "tiny:latest",
                              adapter_files=files, system="Be brief.", parameters={"temperature": 0}))
    assert lines == ["using tiny:latest as the base", "converting adapter tuned", "writing manifest"]
    path = store.path("tuned")
    load_artifact(path, full=True)
    assert set(read_manifest(path).adapters) == {"tuned"}
    assert read_defaults(path) == {"from": "tiny:latest", "adapter": "tuned", "system": "Be brief.",
                                   "parameters": {"temperature": 0}, "template": None, "license": None}
    # a model created from it inherits its defaults; a bad adapter is an AdapterFileError naming "adapters"
    list(create_model(store, ModelRef("child", "latest"), path, "tuned:latest", parameters={"top_k": 5}))
    assert read_defaults(store.path("child"))["parameters"] == {"temperature": 0, "top_k": 5}
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(AdapterFileError, match="^adapters: "):
        list(create_model(store, ModelRef("bad", "latest"), path, "tuned:latest",
                          adapter_files={"adapter_config.json": tmp_path / "junk.json"}))
    assert not store.has(ModelRef("bad", "latest")) and not list((store.home / "tmp").iterdir())
