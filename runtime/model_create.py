"""A new store model from a base one, as Ollama's create makes it (POST /api/create, service/ollama_models.py, is
its HTTP side): an adapter converted in, a chat template, and the defaults its requests get (system message,
parameters) in modelfile.json.

    base artifact --ArtifactDraft.from_base--> $ORTLLM_HOME/tmp/create-*/artifact   (the base's files linked)
      + adapters/<name>.safetensors (the PEFT files converted)  + tokenizer_config.json's chat_template
      + modelfile.json {from, adapter, system, parameters, template, license}       (runtime/artifact_editor.py)
    --commit--> manifest.json --Store.put--> NAME:TAG     only the new files take space in the store

What the new model does not set (system, parameters, template, license, adapter) it inherits from its base's
modelfile.json, so a model created from a created model keeps the first one's defaults.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from . import contract as C
from .adapter_files import add_adapter_to
from .artifact_editor import ArtifactDraft, read_defaults
from .atomic_files import link_or_copy
from .errors import AdapterFileError, OrtllmError
from .store import ModelRef, Store


def create_model(store: Store, ref: ModelRef, base: str | Path, base_name: str, *,
                 adapter_files: dict[str, Path] | None = None, system: str | None = None,
                 parameters: dict | None = None, template: str | None = None,
                 license: str | list[str] | None = None) -> Iterator[str]:
    """Make `ref` in the store from the artifact at `base` (named base_name); yields its progress lines as it goes,
    and the model is in the store when the iteration ends. adapter_files: a PEFT directory's files (file name ->
    path: adapter_config.json, adapter_model.safetensors), converted into an adapter named after ref (an
    AdapterFileError, "adapters: ...", names what is wrong with them). template: a Jinja chat template."""
    yield f"using {base_name} as the base"
    inherited = read_defaults(base)
    with store.scratch("create") as work:
        draft = ArtifactDraft.from_base(base, work / "artifact")
        adapter = inherited.get("adapter")
        if adapter_files:
            adapter = ref.name[:64]
            yield f"converting adapter {adapter}"
            try:
                add_adapter_to(draft, _peft_dir(adapter_files, work / "peft"), adapter, force=True)
            except OrtllmError as e:
                raise AdapterFileError(f"adapters: {e}") from None
        if template is not None:
            yield "writing template"
            draft.update_json(C.TOKENIZER_CONFIG, lambda cfg: {**cfg, "chat_template": template})
        draft.set_defaults({"from": base_name, "adapter": adapter,
                            "system": system if system is not None else inherited.get("system"),
                            "parameters": {**inherited.get("parameters", {}), **(parameters or {})},
                            "template": template if template is not None else inherited.get("template"),
                            "license": license if license is not None else inherited.get("license")})
        draft.commit()
        yield "writing manifest"
        store.put(draft.path, ref, source=f"created from {base_name}", force=True)


def _peft_dir(files: dict[str, Path], out: Path) -> Path:
    """The files as a PEFT directory (each linked, or copied across file systems)."""
    for name, src in files.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise AdapterFileError(f"{name!r} must be a file name, not a path")
        link_or_copy(src, out / name)
    out.mkdir(parents=True, exist_ok=True)
    return out
