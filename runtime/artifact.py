"""Artifact directory: manifest read, verification and the file hashing the builder shares.

manifest.json lists every file with its sha256 and size, the format and contract versions, the build
options and the tool versions. Loading checks all of it and names the first file that differs.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import contract as C
from .errors import OrtllmError
from .hash_cache import HashCache, full_verify_forced, sha256_of
from .process import pid_alive as pid_alive  # re-exported: pipeline/build.py imports it from here


class ArtifactError(OrtllmError):
    """The artifact is missing, damaged or of another version; the message says what to rebuild.

    `damaged`: the artifact directory whose files failed verification (None for other errors), `hint`: what
    repairs it. A caller that knows more about the directory (the store's callers: a store view is repaired
    by a pull, not a rebuild) raises `with_hint(...)` instead."""

    def __init__(self, reason: str, damaged: Path | None = None, hint: str | None = None):
        super().__init__(f"{reason}; {hint}" if hint else reason)
        self.reason, self.damaged, self.hint = reason, damaged, hint

    def with_hint(self, hint: str) -> "ArtifactError":
        return ArtifactError(self.reason, self.damaged, hint)


sha256_file = sha256_of      # one hashing function for the builder, the loader and the store
REBUILD = "rebuild with --force"     # what repairs a damaged artifact directory


def file_entry(path: Path) -> dict:
    return {"sha256": sha256_file(path), "size": path.stat().st_size}


@dataclass(frozen=True)
class Manifest:
    """manifest.json as a typed object, read once per load (read_manifest) and handed to whoever needs it.

    The builder writes it (pipeline/build.py write_artifact), runtime/adapter_files.py adds and removes adapters
    through to_dict(); every reader uses these fields."""
    format_version: int
    contract_version: int
    graph: str                                  # C.GRAPH_KINDS
    recipe: str | None                          # the models/ recipe it was built from; None for a path
    source: dict                                # {"desc", "sha256"} of the weights it was built from
    build: dict                                 # pipeline.build.BuildOptions as written (quant, kv, kv_block_size, ...)
    model: C.ModelConfig
    files: dict[str, dict]                      # relative path -> {"sha256", "size"}
    adapters: dict[str, dict] = field(default_factory=dict)   # name -> {"file", "sha256", "rank", "task", ...}
    raw: dict = field(default_factory=dict, repr=False, compare=False)   # the JSON as read

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        return cls(format_version=d.get("format_version"), contract_version=d.get("contract_version"),
                   graph=d.get("graph", "engine"), recipe=d.get("recipe"), source=dict(d.get("source") or {}),
                   build=dict(d.get("build") or {}), model=C.ModelConfig.from_dict(d["model"]),
                   files=dict(d.get("files") or {}), adapters=dict(d.get("adapters") or {}), raw=d)

    def to_dict(self) -> dict:
        """A deep copy of the JSON, for a writer that changes it and writes it back."""
        return copy.deepcopy(self.raw)

    @property
    def source_sha256(self) -> str | None:
        return self.source.get("sha256")

    @property
    def quant(self) -> str:
        return self.build.get("quant", "fp32")

    @property
    def kv(self) -> str:
        """The build option --kv (fp32 | int8 | fp8); C.KV_DTYPES[kv] is its dtype name."""
        return self.build.get("kv", "fp32")

    @property
    def kv_block_size(self) -> int:
        return self.build.get("kv_block_size", 16)

    @property
    def context_length(self) -> int:
        return self.model.max_position_embeddings

    @property
    def size_bytes(self) -> int:
        """Bytes of every file the manifest lists (manifest.json itself excluded)."""
        return sum(e["size"] for e in self.files.values())

    # Mapping access to the raw JSON, only for code not moved to the fields yet (runtime/engine.py
    # engine_config and runtime/model_runner.py, which other changes own now). New code: use the fields.
    def __getitem__(self, key: str):
        return self.raw[key]

    def get(self, key: str, default=None):
        return self.raw.get(key, default)


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: Manifest

    @property
    def graph(self) -> str:
        return self.manifest.graph

    @property
    def model(self) -> C.ModelConfig:
        return self.manifest.model

    @property
    def model_config(self) -> dict:
        """The model's config as the raw dict: only for runtime/model_runner.py until it moves to `model`."""
        return self.manifest.raw["model"]

    def file(self, name: str) -> Path:
        return self.path / name

    def read_json(self, name: str) -> dict:
        return json.loads((self.path / name).read_text())


def read_manifest(path: Path) -> Manifest:
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path} is not an artifact directory; build one with: ortllm build RECIPE --out {path}")
    mf = path / C.MANIFEST
    if not mf.is_file():
        raise ArtifactError(f"{path} has no {C.MANIFEST}: not an artifact, or its build did not finish; "
                            f"rebuild with: ortllm build RECIPE --out {path} --force")
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as e:
        raise ArtifactError(f"{mf} is damaged ({e}); rebuild the artifact with --force") from None
    for key, want in (("format_version", C.FORMAT_VERSION), ("contract_version", C.CONTRACT_VERSION)):
        if manifest.get(key) != want:
            raise ArtifactError(f"{path} has {key} {manifest.get(key)}, this ortllm reads {want}; "
                                f"rebuild it with this version: ortllm build ... --out {path} --force")
    try:
        return Manifest.from_dict(manifest)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{mf} is damaged ({type(e).__name__}: {e}); rebuild the artifact with --force") from None


def load_artifact(path: Path, verify: bool = True, full: bool | None = None) -> Artifact:
    """Read and (by default) verify every file's size and sha256 against the manifest.

    A file hashed earlier whose (device, inode, size, mtime, ctime) are unchanged is taken from the hash cache
    (hash_cache.py) instead of being read again; `full=True` or ORTLLM_VERIFY=1 re-hashes every file."""
    path = Path(path)
    manifest = read_manifest(path)
    if verify:
        full = full_verify_forced() if full is None else full
        cache = HashCache.default()
        for name, entry in manifest.files.items():
            f = path / name
            try:
                st = f.stat()
            except FileNotFoundError:
                st = None
            if st is None or not f.is_file():
                raise ArtifactError(f"artifact file {name} is missing from {path}", path, REBUILD)
            if st.st_size != entry["size"]:
                raise ArtifactError(f"artifact file {name} is {st.st_size} bytes, the manifest says "
                                    f"{entry['size']}: damaged or truncated ({f})", path, REBUILD)
            if cache.sha256(f, st, full=full) != entry["sha256"]:
                raise ArtifactError(f"artifact file {name} does not match its sha256 in the manifest: damaged "
                                    f"({os.path.realpath(f)})", path, REBUILD)
        cache.save()
    return Artifact(path, manifest)


def quality_line(path: Path) -> str | None:
    """One line of the measured quality of a quantized artifact (its quality.json), for load-time display."""
    f = Path(path) / C.QUALITY
    if not f.is_file():
        return None
    q = json.loads(f.read_text())
    b, fid = q.get("build", {}), q.get("fidelity", {})
    what = f"weights {b.get('quant')}, LM head {b.get('lm_head')}, KV {b.get('kv')}"
    if not fid:
        return f"quality ({what}): no fidelity figures in {C.QUALITY}"
    doms = fid.get("domains", {})
    worst = (f"; worst domain: KLD {max(d['kld_mean'] for d in doms.values()):.5f}, top-1 "
             f"{min(d['top1_agreement'] for d in doms.values()):.2%} ({', '.join(doms)})") if doms else ""
    return (f"quality ({what}) vs fp32 over {fid['tokens']} held-out tokens: PPL ratio {fid['ppl_ratio']:.4f} "
            f"± {fid['ppl_ratio_err']:.4f}, mean KLD {fid['kld_mean']:.5f}, top-1 {fid['top1_agreement']:.2%}"
            f"{worst} ({C.QUALITY}; full-size figures: ortllm eval)")
