"""The store's verbs: `ortllm pull | list | show | rm | cp | ps`, and store names wherever a verb takes an ARTIFACT.

ortllm's command line registers these with `add_store_verbs(sub, ...)` and calls `resolve_artifact_args(args)`
before running any verb: an ARTIFACT that is not an existing path but looks like NAME[:TAG] becomes that store
model's directory, so `ortllm generate smollm2-135m-instruct:int4 --prompt hi` works like a path.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

from ortllm.runtime.errors import OrtllmError
from ortllm.runtime.store import Store, StoreError, looks_like_name

from .options import Bool

ARTIFACT_ARGS = ("artifact", "reference")
READ_ONLY_VERBS = {("adapters", "add"), ("adapters", "remove")}   # `adapters train` makes a new version


def add_store_verbs(sub, add_build_options: Callable[[argparse.ArgumentParser], None],
                    build_options: Callable[[argparse.Namespace], object]) -> None:
    """Register the verbs; `add_build_options` / `build_options` are `ortllm build`'s (shared by `pull`)."""
    p = sub.add_parser("pull", help="build a recipe, GGUF or HF directory (or take an artifact directory), or download "
                                    "a model from a Hugging Face hub and build it, into the local store as NAME:TAG")
    p.add_argument("model", metavar="RECIPE|GGUF|HF_DIR|ARTIFACT_DIR|hf.co/ORG/REPO[:QUANT|:FILE]|URL")
    p.add_argument("--name", default=None, metavar="NAME:TAG",
                   help="store name (default: the recipe or file name, tagged with the quantization)")
    add_build_options(p)
    p.add_argument("--force", action="store_true", help="rebuild and replace NAME:TAG (repairs a damaged model)")
    p.add_argument("--no-progress", action="store_true", help="log lines instead of progress bars")
    p.set_defaults(run=lambda a: _run_pull(a, build_options))

    ls = sub.add_parser("list", help="models in the local store ($ORTLLM_HOME, default ~/.cache/ortllm)")
    ls.set_defaults(run=_run_list)

    show = sub.add_parser("show", help="a store model's manifest, quality summary and adapters")
    show.add_argument("name", metavar="NAME[:TAG]")
    show.add_argument("--verify", action=Bool, default=False, help="re-hash every file against the manifest")
    show.set_defaults(run=_run_show)

    rm = sub.add_parser("rm", help="remove store names; files no name refers to are deleted")
    rm.add_argument("names", nargs="+", metavar="NAME[:TAG]")
    rm.set_defaults(run=_run_rm)

    cp = sub.add_parser("cp", help="another name for a store model (no file is copied)")
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dst", metavar="DST")
    cp.add_argument("--force", action=Bool, default=False, help="replace DST if it exists")
    cp.set_defaults(run=_run_cp)

    ps = sub.add_parser("ps", help="what running `ortllm serve` processes hold")
    ps.set_defaults(run=_run_ps)

    for name, parser in sub.choices.items():           # --verify wherever an artifact is loaded
        if name not in ("show", "pull", "build") and any(a.dest in ARTIFACT_ARGS for a in parser._actions):
            parser.add_argument("--verify", action=Bool, default=False,
                                help="re-hash every artifact file at load (default: unchanged files are "
                                     "trusted through the hash cache)")


def resolve_artifact_args(args: argparse.Namespace) -> None:
    """Store names -> their artifact directories, in place; existing paths are left as they are."""
    if getattr(args, "verify", False) and args.verb != "show":
        os.environ["ORTLLM_VERIFY"] = "1"           # every load in this process (and its workers) re-hashes
    store = None
    args.store_names = {}                             # artifact directory -> the store name it was given as
    for attr in ARTIFACT_ARGS:
        value = getattr(args, attr, None)
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        out = []
        for v in values:
            if not Path(v).exists() and not looks_like_name(str(v)):
                from .pull import pulled_from
                store = store or Store()
                ref = pulled_from(str(v), store)          # a hub spec that was pulled: its store model
                v = str(ref) if ref is not None else v
            if not Path(v).exists() and looks_like_name(str(v)):
                if (args.verb, getattr(args, "adapters_verb", None)) in READ_ONLY_VERBS:
                    raise StoreError(f"{v} is a store model and store models are read-only; change an artifact "
                                     f"directory instead (`ortllm build ... --out DIR`, then `ortllm adapters "
                                     f"{args.adapters_verb} DIR ...`) and put it back with `ortllm pull DIR --name "
                                     f"{v} --force`")
                store = store or Store()
                name = str(store.resolve(str(v)))
                v = store.path(name)
                args.store_names[Path(v)] = name
            out.append(Path(v))
        setattr(args, attr, out if isinstance(value, list) else out[0])


def served_models(args: argparse.Namespace) -> tuple[tuple[str | None, Path], ...]:
    """`ortllm serve A B ...`: (name clients send as `model`, artifact dir) per model: the store name it was given
    as, else the artifact's recipe (or directory name)."""
    from ortllm.runtime.artifact import read_manifest

    out = []
    for path in args.artifact:
        name = args.store_names.get(Path(path))
        if name is None:
            try:
                name = read_manifest(path).recipe or Path(path).name
            except OrtllmError:
                name = Path(path).name if len(args.artifact) > 1 else None   # one model: its load says what is wrong
        out.append((name, Path(path)))
    return tuple(out)


# ---------------------------------------------------------------- verbs

def _run_pull(a, build_options) -> int:
    from .pull import pull

    opts = build_options(a)
    ref, entry, wrote = pull(a.model, opts, name=a.name, source=a.source, force=a.force,
                             progress=not a.no_progress and sys.stderr.isatty())
    store = Store()
    if wrote:
        info = store.info(ref)
        print(f"pulled {ref} ({_size(info['size'])}, {info['quant']}, KV {info['kv']}) into {store.home}")
    else:
        print(f"{ref} is in the store")
    return 0


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _age(iso: str) -> str:
    try:
        t = time.mktime(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except (ValueError, TypeError):
        return iso or "?"
    s = max(0, time.time() - t)
    for unit, n in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if s >= n:
            return f"{int(s // n)} {unit} ago"
    return "just now"


def _run_list(a) -> int:
    store = Store()
    rows = [("NAME", "ID", "SIZE", "QUANT", "KV", "ADAPTERS", "CREATED")]
    logical = 0
    for ref in store.refs():
        try:
            i = store.info(ref)
        except StoreError as e:
            rows.append((str(ref), "damaged", "", "", "", "", str(e)[:40]))
            continue
        logical += i["size"]
        rows.append((str(ref), i["entry"]["artifact"].removeprefix("sha256-")[:12], _size(i["size"]), i["quant"],
                     i["kv"], ",".join(i["adapters"]) or "-", _age(i["entry"].get("created"))))
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    if len(rows) > 1:
        print(f"\n{len(rows) - 1} names, {_size(logical)} of artifacts in {_size(store.disk_bytes())} on disk "
              f"({store.home})")
    return 0


def _run_show(a) -> int:
    from ortllm.runtime.artifact import ArtifactError, load_artifact, quality_line

    store = Store()
    ref = store.resolve(a.name)
    i = store.info(ref)
    man, entry = i["manifest"], i["entry"]
    others = [str(r) for r in store.refs() if r != ref and store.entry(r)["artifact"] == entry["artifact"]]
    print(f"name      {ref}" + (f" (also: {', '.join(others)})" if others else ""))
    print(f"id        {entry['artifact']}")
    print(f"source    {entry.get('source')}  (built from {man.source.get('desc')})")
    print(f"created   {entry.get('created')}")
    print(f"graph     {man.graph}, contract {man.contract_version}")
    b = man.build
    print(f"build     quant {man.quant}, block {b.get('block_size')}, algo {b.get('algo')}, LM head "
          f"{b.get('lm_head')}, KV {man.kv}")
    m = man.model
    print(f"model     {m.num_layers} layers, hidden {m.hidden_size}, vocab {m.vocab_size}, "
          f"context {m.max_position_embeddings}")
    print(f"files     {len(i['files'])}, {_size(i['size'])}")
    path = store.path(str(ref))
    if line := quality_line(path):
        print(f"quality   {line}")
    for name, e in sorted(man.adapters.items()):
        print(f"adapter   {name}: rank {e.get('rank')}, scale {e.get('scale', 0):g}, "
              f"targets {','.join(e.get('targets', []))}")
    if a.verify:
        try:
            load_artifact(path, verify=True, full=True)
        except ArtifactError as e:
            raise StoreError(str(e)) from None
        print("verified  every file re-hashed: matches the manifest")
    return 0


def _run_rm(a) -> int:
    store = Store()
    for name in a.names:
        ref, freed = store.remove(name)
        print(f"removed {ref}; freed {_size(freed)}")
    return 0


def _run_cp(a) -> int:
    dst = Store().copy(a.src, a.dst, force=a.force)
    print(f"{dst} -> {Store().resolve(a.src)} (same files)")
    return 0


def _run_ps(a) -> int:
    servers = Store().live_servers()
    if not servers:
        print("no running ortllm server")
        return 0
    rows = [("NAME", "SERVER", "STATE", "SIZE", "IN FLIGHT", "IDLE FOR")]
    now = time.time()
    for s in servers:
        for m in s.get("models", []):
            idle = "" if not m.get("loaded") or m.get("in_flight") else f"{now - m.get('last_used', now):.0f} s"
            rows.append((m["name"], f"{s.get('url')} (pid {s['pid']})", "loaded" if m.get("loaded") else "not loaded",
                         _size(m["bytes"]) if m.get("bytes") else "-", str(m.get("in_flight", 0)), idle))
    widths = [max(len(str(r[c])) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0
