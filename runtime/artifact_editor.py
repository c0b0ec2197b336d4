"""Editing an artifact, one way for every writer: `ortllm adapters add|remove|train` (runtime/adapter_files.py),
Ollama's create (runtime/model_create.py), and what the store and `ortllm pull` write (runtime/store.py,
runtime/atomic_files.py).

    draft = ArtifactDraft.from_base(base, work)   a new artifact in work/: the base's files hard-linked (copies where
                                                  links fail), so only the files that change take space
    draft = ArtifactDraft.in_place(artifact)      an artifact edited where it is
    draft.write_file / write_json / update_json / write_tensors      a file written, its manifest entry updated
    draft.add_adapter(name, entry) / remove_adapter(name)            the manifest's adapters
    draft.set_defaults({...})                     modelfile.json: the defaults a created model's requests get
    draft.commit()                                manifest.json rewritten last; removed files deleted after it

Every file is written beside and renamed over (runtime/atomic_files.py): a file linked from the base is replaced,
never written through, so the base keeps its bytes; a reader of an artifact edited in place sees the old manifest
(which still verifies) until commit() and the new one after it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from . import contract as C
from .artifact import file_entry, read_manifest
from .atomic_files import atomic_file, atomic_write, link_or_copy


class ArtifactDraft:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = read_manifest(self.path).to_dict()   # the JSON commit() writes
        self._removed: list[str] = []                        # files deleted once the manifest no longer lists them

    @classmethod
    def in_place(cls, artifact: str | Path) -> "ArtifactDraft":
        return cls(artifact)

    @classmethod
    def from_base(cls, base: str | Path, work: str | Path) -> "ArtifactDraft":
        """work/ (new or empty): every file of the artifact at base, each a hard link (a copy where links fail)."""
        base, work = Path(base), Path(work)
        for name in [*read_manifest(base).files, C.MANIFEST]:
            link_or_copy(base / name, work / name)
        return cls(work)

    # ---- files
    def write_file(self, name: str, data: str | bytes) -> dict:
        """Write `name` (relative to the artifact); returns its manifest entry {sha256, size}."""
        atomic_write(self.path / name, data)
        return self._listed(name)

    def write_json(self, name: str, obj, **dumps) -> dict:
        return self.write_file(name, json.dumps(obj, **{"indent": 2, **dumps}) + "\n")

    def read_json(self, name: str) -> dict:
        """The JSON object in `name`, {} if the artifact has none (or not a readable one)."""
        try:
            return json.loads((self.path / name).read_text())
        except (OSError, ValueError):
            return {}

    def update_json(self, name: str, change: Callable[[dict], dict]) -> dict:
        """Rewrite a JSON file through change(current) (current: {} when the file is missing)."""
        return self.write_json(name, change(self.read_json(name)), ensure_ascii=False)

    def write_tensors(self, name: str, tensors: dict, metadata: dict[str, str] | None = None) -> dict:
        """A safetensors file (name -> float32 array), as the engine reads adapters and smoothing scales."""
        from safetensors.numpy import save_file

        with atomic_file(self.path / name) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
        return self._listed(name)

    def _listed(self, name: str) -> dict:
        entry = file_entry(self.path / name)
        self.manifest["files"][name] = entry
        if name in self._removed:
            self._removed.remove(name)
        return entry

    def remove_file(self, name: str) -> None:
        """Drop `name` from the manifest; the file goes after commit()."""
        self.manifest["files"].pop(name, None)
        self._removed.append(name)

    # ---- adapters and defaults
    @property
    def adapters(self) -> dict[str, dict]:
        return self.manifest.setdefault("adapters", {})

    def add_adapter(self, name: str, entry: dict) -> dict:
        """entry: {file, sha256, size, rank, scale, targets, ...} of a file write_tensors wrote."""
        self.adapters[name] = entry
        return entry

    def remove_adapter(self, name: str) -> dict | None:
        """The adapter's entry (None: no such adapter); its file goes after commit()."""
        entry = self.adapters.pop(name, None)
        if entry is not None:
            self.remove_file(entry["file"])
        return entry

    def set_defaults(self, modelfile: dict) -> dict:
        """modelfile.json: {from, adapter, system, parameters, template, license} (read_defaults)."""
        return self.write_json(C.MODELFILE, modelfile, sort_keys=True)

    # ---- the end
    def commit(self) -> Path:
        """Write manifest.json (atomically, last), then delete the files it no longer lists. Returns the path."""
        atomic_write(self.path / C.MANIFEST, json.dumps(self.manifest, indent=2, sort_keys=True) + "\n")
        for name in self._removed:
            (self.path / name).unlink(missing_ok=True)
        self._removed.clear()
        return self.path


def read_defaults(artifact: str | Path | None) -> dict:
    """The defaults of a model Ollama's create made (its artifact's modelfile.json), else {}."""
    if artifact is None:
        return {}
    try:
        return json.loads((Path(artifact) / C.MODELFILE).read_text())
    except (OSError, ValueError):
        return {}
