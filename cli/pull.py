"""`ortllm pull`: build (or take) an artifact and put it into the store under NAME:TAG.

    RECIPE | GGUF | HF_DIR --build into $ORTLLM_HOME/tmp/pull-<pid>-*/--> artifact --Store.put--> blobs + manifest
    ARTIFACT_DIR (has manifest.json) -------------------------------------------^
    hf.co/ORG/REPO[:QUANT|:FILE], URL --pipeline/hub.py: download, sha256 check--> GGUF | HF_DIR --^

One pull per name at a time (a file lock): a second pull of the same name waits, then finds the name there
and stops, saying so. The build directory is removed whatever happens; a killed pull's is collected by the
next `ortllm rm`. The name is written last, so nothing half-written is ever listed.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from ortllm.runtime import contract as C
from ortllm.runtime.store import ModelRef, Store, StoreError


def default_ref(spec: str, quant: str, manifest=None) -> ModelRef:
    """Recipe (or file/directory stem) as the name, the quantization as the tag: smollm2-135m-instruct:int4."""
    if manifest is not None:
        base = manifest.recipe or Path(spec).resolve().name      # manifest: a runtime.artifact.Manifest
        quant = manifest.quant
    else:
        base = spec if "/" not in spec and not Path(spec).exists() else Path(spec).resolve().name
        base = re.sub(r"\.(gguf|safetensors)$", "", base)
    name = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._") or "model"
    return ModelRef(name[:100], quant)


class _Progress:
    """A tqdm line per build stage (the build's log messages), then a byte bar while blobs are written."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def stage(self, message: str) -> None:
        self.close()
        if not self.enabled:
            print(message, file=sys.stderr)
            return
        from tqdm import tqdm
        self.bar = tqdm(total=1, desc=message.rstrip(". "), file=sys.stderr, leave=True,
                        bar_format="{desc}: {elapsed}")

    def bytes(self, total: int, desc: str):
        self.close()
        if not self.enabled:
            return None
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr)
        return self.bar.update

    def close(self) -> None:
        if self.bar is not None:
            if self.bar.total == 1 and self.bar.n == 0:
                self.bar.update(1)
            self.bar.close()
            self.bar = None


def pull(spec: str, opts, name: str | None = None, source: str | None = None, force: bool = False,
         store: Store | None = None, progress: bool = True) -> tuple[ModelRef, dict, bool]:
    """Returns (name, store manifest, whether this call wrote it). `opts`: pipeline BuildOptions."""
    from ortllm.runtime.artifact import read_manifest

    store = store or Store()
    src_dir = Path(spec)
    is_artifact = src_dir.is_dir() and (src_dir / C.MANIFEST).is_file()
    manifest = read_manifest(src_dir) if is_artifact else None
    hub = None if src_dir.exists() else _hub_plan(spec, store, progress)   # the files to fetch, their arch checked
    ref = ModelRef.parse(name) if name else default_ref(hub.name if hub else spec, opts.quant, manifest)
    bars = _Progress(progress)

    def waiting() -> None:
        print(f"ortllm: another pull of {ref} is running; waiting for it", file=sys.stderr, flush=True)

    with store.pull_lock(ref, on_wait=waiting):
        if store.has(ref) and not force:
            print(f"ortllm: {ref} is in the store already (pass --force to rebuild it)", file=sys.stderr)
            return ref, store.entry(ref), False
        replaced = store.has(ref)
        if is_artifact:
            entry = _put(store, src_dir, ref, str(src_dir.resolve()), force, bars)
        else:
            entry = _build_and_put(store, spec, opts, ref, source, force, bars, hub)
    bars.close()
    if replaced:
        store.gc()          # the replaced artifact's files, unless another name holds them
    return ref, entry, True


def _put(store: Store, artifact: Path, ref: ModelRef, source: str, force: bool, bars: _Progress) -> dict:
    from ortllm.runtime.artifact import read_manifest
    total = read_manifest(artifact).size_bytes + (artifact / C.MANIFEST).stat().st_size
    update = bars.bytes(total, f"verifying and storing {ref}")
    entry = store.put(artifact, ref, source=source, force=force, progress=update)
    bars.close()
    return entry


def _hub_plan(spec: str, store: Store, progress: bool):
    """A hub or URL spec's HubPlan (pipeline/hub.py), or None for a recipe or a path (one that does not exist but
    reads as ORG/REPO: an error saying how to pull it from the hub)."""
    from ortllm.pipeline.hub import missing_path_hint, parse_spec, resolve

    hub = parse_spec(spec)
    if hub is None and (hint := missing_path_hint(spec)) is not None:
        raise hint
    return None if hub is None else resolve(hub, store.home / "downloads", progress, _log)


def pulled_from(spec: str, store: Store) -> ModelRef | None:
    """The store model `ortllm pull SPEC` made, for a hub or URL SPEC given where a model is expected
    (`ortllm generate hf.co/ORG/REPO:Q4_K_M ...`); None when SPEC is no such spec. Several builds of one spec (other
    --quant): a StoreError naming them; none: a StoreError saying to pull it first."""
    from ortllm.pipeline.hub import HubError, parse_spec

    spec = re.sub(r"^(hf|https?):/(?=[^/])", r"\1://", spec)   # ARTIFACT arguments are Paths: "hf://" -> "hf:/"
    wanted = parse_spec(spec)
    if wanted is None:
        return None

    def made_by(ref: ModelRef) -> bool:
        try:
            source = parse_spec(_source_of(store, ref).split(" ")[0])
        except HubError:
            return False
        return source is not None and source.key() == wanted.key()
    refs = [r for r in store.refs() if made_by(r)]
    if len(refs) == 1:
        return refs[0]
    if refs:
        raise StoreError(f"{spec} was pulled as {', '.join(map(str, refs))}: name one of them")
    raise StoreError(f"{spec} is not in the store: run `ortllm pull {spec}` first")


def _source_of(store: Store, ref: ModelRef) -> str:
    try:
        return store.entry(ref).get("source") or ""
    except StoreError:             # a damaged store manifest: `ortllm list` shows it
        return ""


def _log(message: str) -> None:
    print(f"ortllm: {message}", file=sys.stderr, flush=True)


def _build_and_put(store: Store, spec: str, opts, ref: ModelRef, source: str | None, force: bool,
                   bars: _Progress, hub=None) -> dict:
    from .build import build_artifact as build     # the pipeline's build with the in-build quality check

    with store.scratch("pull") as work:     # on the store's file system; removed whatever happens
        out = work / ref.name
        how = spec if "/" not in spec and not Path(spec).exists() else str(Path(spec).resolve())
        if hub is not None:
            from ortllm.pipeline.hub import download
            spec, how = str(download(hub, work / "hub", _log)), spec
        build(spec, out, opts, source=source, force=True, log=bars.stage)
        bars.close()
        flags = _flags(opts)
        if source:
            flags = f"--source {source} {flags}".strip()
        return _put(store, out, ref, f"{how} {flags}".strip(), force, bars)


def _flags(opts) -> str:
    """The build options as `ortllm pull` flags (for the repair command a damaged model's message gives)."""
    from dataclasses import fields

    from ortllm.pipeline.build import BuildOptions
    default = BuildOptions()
    out = []
    for f in fields(opts):
        v = getattr(opts, f.name)
        if v == getattr(default, f.name):
            continue
        if f.name == "symmetric":
            out.append("--symmetric")
        elif f.name == "keep":
            out += [f"--keep '{k}'" for k in v]
        elif f.name in _FLAG:
            out.append(f"{_FLAG[f.name]} {int(v) if isinstance(v, bool) else v}")
    return " ".join(out)


_FLAG = {"quant": "--quant", "block_size": "--block-size", "algo": "--algo", "lm_head": "--lm-head",
         "lm_head_algo": "--lm-head-algo", "kv": "--kv",
         "graph": "--graph", "exporter": "--exporter", "kv_block_size": "--kv-block-size",
         "kv_rotate": "--kv-rotate", "smooth": "--smooth", "calib_tokens": "--calib-tokens",
         "accuracy_level": "--accuracy-level"}

