"""`ortllm adapters train` as the CLI runs it: ortllm.pipeline's trainer, then the runtime's add_adapter into the
artifact directory, or into a store model (a new version of the same NAME:TAG with the adapter).

The pipeline may reach neither runtime/adapter_files.py nor the store (tests/test_layering.py), so they are joined
here. Order: the data is checked (every bad line reported) and the name too, before any weight is loaded; training
checkpoints into a work directory beside the artifact (`.ortllm-train/` in its parent; for a store model, the
store's tmp/), which a later run of the same command resumes from; the adapter is added last, atomically: on any
error or Ctrl-C the artifact (or the store name) is as it was, and only the work directory's checkpoint is left.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import uuid
from pathlib import Path

from ortllm.pipeline.adapter_train import CHECKPOINT, load_examples, train_lora
from ortllm.pipeline.train_config import TrainConfig
from ortllm.runtime import contract as C
from ortllm.runtime.adapter_files import _NAME as ADAPTER_NAME      # the one rule for adapter names
from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.errors import AdapterFileError
from ortllm.runtime.store import Store

WORK_DIR = ".ortllm-train"      # beside an artifact directory: <parent>/.ortllm-train/<artifact>.<adapter>/


def work_dir_for(artifact: Path, name: str, store_name: str | None = None) -> Path:
    """Where a run's checkpoints live: found again by the same command, never inside the artifact."""
    if store_name is not None:
        return Store().home / "tmp" / f"train-{store_name.replace(':', '@')}.{name}"
    artifact = Path(artifact).resolve()
    return artifact.parent / WORK_DIR / f"{artifact.name}.{name}"


@contextlib.contextmanager
def _sigint_deferred():
    """Ctrl-C waits for the block to end (then raises): an adapter's file and its manifest entry land together."""
    got = []
    try:
        old = signal.signal(signal.SIGINT, lambda *_: got.append(True))
    except ValueError:           # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got:
            raise KeyboardInterrupt


def add_atomically(artifact: Path, peft_dir: Path, name: str, force: bool, meta: dict) -> dict:
    """add_adapter, undone on failure: the adapter file it replaced (with --force) comes back, a new one goes, and
    its temporary file too, unless the manifest (written last, by rename) already lists the new adapter."""
    artifact = Path(artifact)
    final = artifact / "adapters" / f"{name}.safetensors"
    backup = final.with_name(f".{final.name}.{os.getpid()}.before")
    manifest_before = (artifact / C.MANIFEST).read_bytes()
    had_dir = final.parent.is_dir()
    if final.is_file():
        os.link(final, backup)
    try:
        with _sigint_deferred():
            return add_adapter(artifact, peft_dir, name, force=force, meta=meta)
    except BaseException:
        if (artifact / C.MANIFEST).read_bytes() == manifest_before:      # not committed: put the file back
            if backup.is_file():
                backup.replace(final)
            else:
                final.unlink(missing_ok=True)
            final.with_name(final.name + ".tmp").unlink(missing_ok=True)
            if not had_dir:
                with contextlib.suppress(OSError):
                    final.parent.rmdir()
        raise
    finally:
        backup.unlink(missing_ok=True)
        final.with_name(final.name + ".tmp").unlink(missing_ok=True)


def _link_tree(src: Path, dst: Path, copy_weights: bool) -> None:
    """dst: a hard link to every file of src (a copy where links are refused); writes replace, never edit.
    copy_weights: the ONNX external data files are copied (onnx refuses to read a hard-linked one, and a DoRA's
    norms are taken over the artifact's weights: runtime/base_weights.py)."""
    for f in src.rglob("*"):
        if f.is_file():
            out = dst / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            if copy_weights and f.suffix == ".data":
                shutil.copyfile(f, out)
                continue
            try:
                os.link(f, out)
            except OSError:
                shutil.copyfile(f, out)


def add_to_store(store_name: str, view: Path, peft_dir: Path, name: str, force: bool, meta: dict,
                 dora: bool = False) -> Path:
    """The store model NAME:TAG again, with the adapter: staged beside the store (the shared view is never
    edited), then put under the same name (the store writes its manifest last). Returns the new artifact dir."""
    store = Store()
    ref = store.resolve(store_name)
    entry = store.entry(ref)
    # tmp/pull-<pid>-...: the store's garbage collection removes it if this process dies before its cleanup
    stage = store.home / "tmp" / f"pull-{os.getpid()}-train-{uuid.uuid4().hex[:8]}"
    try:
        _link_tree(Path(view), stage, copy_weights=dora)
        add_adapter(stage, peft_dir, name, force=force, meta=meta)
        with _sigint_deferred():
            store.put(stage, ref, source=entry.get("source") or str(ref), force=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return store.path(str(ref))


def _check_name(artifact: Path, name: str, force: bool) -> None:
    if not ADAPTER_NAME.match(name):
        raise AdapterFileError(f"adapter name {name!r} must be 1-64 letters, digits, '.', '_' or '-' (no '/')")
    if name in read_manifest(artifact).adapters and not force:
        raise AdapterFileError(f"the artifact already has an adapter named {name!r}; choose another --name, or pass "
                               "--force to replace it")


def _meta(cfg: TrainConfig, info: dict) -> dict:
    """The manifest entry's record of the run (`ortllm adapters list`, `ortllm eval --suite adapters`)."""
    train = {k: info[k] for k in ("eval_loss_before", "eval_loss_after", "loss_first", "loss_last", "steps",
                                  "examples", "eval_examples", "seconds")}
    train |= {"data": Path(cfg.data).name} if cfg.data else {}
    train |= {"rank": cfg.rank, "alpha": cfg.lora_alpha, "lr": cfg.lr, "batch": cfg.batch, "seed": cfg.seed}
    return ({"task": cfg.task} if cfg.task else {}) | {"train": train}


def train_adapter(artifact: Path, name: str, cfg: TrainConfig, *, base: str | None = None, force: bool = False,
                  store_name: str | None = None, work_dir: Path | None = None, restart: bool = False,
                  progress: bool = True, log=print) -> tuple[dict, Path]:
    """Check, train (resuming this run's checkpoint), add. Returns (train info, the artifact dir holding the
    adapter: `artifact`, or the store model's new view)."""
    artifact = Path(artifact)
    cfg = cfg.validate()
    _check_name(artifact, name, force)
    examples = load_examples(artifact, cfg)              # bad lines: reported now, nothing written yet
    work = Path(work_dir) if work_dir is not None else work_dir_for(artifact, name, store_name)
    if restart:
        (work / CHECKPOINT).unlink(missing_ok=True)
    elif (work / CHECKPOINT).is_file():
        log(f"found a checkpoint in {work}; resuming it if it is this run's (--restart starts over)")
    peft_dir = work / "peft"
    shutil.rmtree(peft_dir, ignore_errors=True)
    info = train_lora(artifact, peft_dir, cfg, base=base, log=log, work_dir=work, progress=progress,
                      examples=examples)
    meta = _meta(cfg, info)
    if store_name is not None:
        where = add_to_store(store_name, artifact, peft_dir, name, force, meta, dora=cfg.dora)
    else:
        add_atomically(artifact, peft_dir, name, force, meta)
        where = artifact
    shutil.rmtree(work, ignore_errors=True)
    if work_dir is None:
        with contextlib.suppress(OSError):
            work.parent.rmdir()                  # .ortllm-train/ (or the store's tmp/) when it held only this run
    return info, where
