"""Ollama's model management on the local store ($ORTLLM_HOME, runtime/store.py): POST /api/pull, DELETE
/api/delete, POST /api/copy, POST /api/create, and HEAD/POST /api/blobs/{digest} (the files /api/create names).
A model pulled or created here is served at once: it loads on its first request, as the models of
`ortllm serve A B ...` do (resources.ModelPool.add_model).

    pull   a store name already there -> served;  an artifact directory -> Store.put (progress per file);
           a recipe, GGUF file or HF directory -> `ortllm pull SPEC --name NAME:latest` in a child process
           (the build is the pipeline's; the service does not import it), its log lines as status lines
    create from + adapters + system + parameters + template -> runtime/model_create.py: a new artifact (the
           base's files linked, the adapter converted in, modelfile.json with the defaults, the template in
           tokenizer_config.json) -> Store.put: only the new files take space. Requests to it carry its adapter
           (every API) and, on the Ollama routes, its system message and parameters unless they send their own.

Progress is streamed as Ollama streams it: NDJSON lines {"status", "digest"?, "total"?, "completed"?}, the last
{"status": "success"}; with stream: false one JSON object, the last line. An error after the stream started is
an {"error": ...} line, as Ollama sends it."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import shutil
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Iterator

from flask import Blueprint, Response, current_app, jsonify, request, stream_with_context

from ortllm.protocol.bodies import OLLAMA_COPY, OLLAMA_CREATE, OLLAMA_DELETE, OLLAMA_PULL
from ortllm.protocol.errors import APIError, bad_request
from ortllm.runtime import contract as C
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.atomic_files import atomic_file
from ortllm.runtime.errors import AdapterFileError, OrtllmError
from ortllm.runtime.model_create import create_model
from ortllm.runtime.store import DEFAULT_TAG, ModelRef, Store, StoreError, looks_like_name

from .body import read_json_object
from .openapi import document
from .resources import current_resources
from .server_paths import check_path_text, server_path

# Who may call these (every one changes the store or what is served): auth.MANAGE, applied by auth.check_access.
bp = Blueprint("ollama_models", __name__, url_prefix="/api")

_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
_DIGEST_PARAM = {"description": "sha256:<64 hex digits>", "pattern": _DIGEST.pattern.replace("(", "").replace(")", "")}
_PROGRESS = {"type": "object", "required": ["status"], "properties": {
    "status": {"type": "string"}, "digest": {"type": "string"}, "total": {"type": "integer"},
    "completed": {"type": "integer"}}}
_MANAGE = (400, 401, 403, 404, 409, 413, 415, 503)


def _progress_ok(description: str) -> dict:
    return {"description": description, "content": {
        "application/json": {"schema": _PROGRESS},
        "application/x-ndjson": {"schema": {"type": "string", "description": "one progress object per line"}}}}


_EMPTY_OK = {"description": "done (empty body)", "content": {"application/json": {"schema": {"type": "object"}}}}


def _store() -> Store:
    return Store()


def _ref(text: str, param: str = "model") -> ModelRef:
    try:
        return ModelRef.parse(text)
    except StoreError as e:
        raise bad_request(str(e), param=param) from None


def _not_found(e: StoreError, param: str = "model") -> APIError:
    return APIError(404, str(e), type="invalid_request_error", param=param, code="model_not_found")


def _aliases(ref: ModelRef) -> tuple[str, ...]:
    return (ref.name,) if ref.tag == DEFAULT_TAG else ()


def _serve(ref: ModelRef, store: Store) -> None:
    """Route `ref` (and NAME for NAME:latest) to its store artifact from now on."""
    current_resources().add_model(str(ref), store.path(str(ref)), _aliases(ref))


# ---------------------------------------------------------------- streaming progress

def _progress_response(lines: Iterator[dict], stream: bool):
    """NDJSON progress (Ollama's stream), or the last line as one JSON object; an APIError before the first line
    is an HTTP error, after it an {"error"} line."""
    first = next(lines)          # errors found before any work (bad names, unknown bases) are HTTP errors
    if not stream:
        last = first
        for last in lines:
            pass
        return jsonify(last)

    def ndjson() -> Iterator[bytes]:
        yield json.dumps(first).encode() + b"\n"
        try:
            for line in lines:
                yield json.dumps(line).encode() + b"\n"
        except APIError as e:
            yield json.dumps({"error": e.message}).encode() + b"\n"
        except OrtllmError as e:
            yield json.dumps({"error": str(e)}).encode() + b"\n"
    return Response(stream_with_context(ndjson()), mimetype="application/x-ndjson")


# ---------------------------------------------------------------- pull

@bp.post("/pull")
@document("Ollama: put a model into the local store and serve it (stream, the default: NDJSON progress)",
          body=OLLAMA_PULL, ok=_progress_ok("the last progress line, status success"), errors=_MANAGE)
def pull():
    v = OLLAMA_PULL.read(read_json_object(request))
    check_path_text(v["model"], "model")       # a 400 before the progress stream starts
    return _progress_response(_pull_lines(v["model"]), v["stream"])


def _pull_lines(spec: str) -> Iterator[dict]:
    """A store name -> served; a recipe -> built; another name -> 404; anything else is a path on the server, read
    only under the allowed roots (server_paths.py)."""
    store = _store()
    if looks_like_name(spec):
        try:
            ref = store.resolve(spec)
        except StoreError as e:
            if spec.partition(":")[0] not in _recipes():
                raise APIError(404, f"{e}; nor is {spec!r} a recipe ({', '.join(sorted(_recipes()))}): pull a "
                               "recipe, or a GGUF file or HF directory on the server by its path", param="model",
                               code="model_not_found") from None
            ref = None
        if ref is not None:           # already in the store: serve it
            yield {"status": "pulling manifest"}
            yield {"status": "verifying sha256 digest"}
            _serve(ref, store)
            yield {"status": "success"}
            return
        yield from _build(store, spec)
        return
    path = server_path(spec, "model")
    if path.is_dir() and (path / C.MANIFEST).is_file():
        yield from _put_artifact(store, path)
        return
    yield from _build(store, str(path))


def _put_artifact(store: Store, src: Path) -> Iterator[dict]:
    """An artifact directory on the server: each file verified and stored (a line per 4 MiB written)."""
    try:
        man = read_manifest(src)
    except OrtllmError as e:
        raise bad_request(str(e), param="model") from None
    ref = _ref(f"{_store_name(man.recipe or src.resolve().name)}:{DEFAULT_TAG}")
    total = man.size_bytes + (src / C.MANIFEST).stat().st_size
    yield {"status": "pulling manifest"}
    done = [0]
    lines: list[dict] = []

    def progress(n: int) -> None:
        done[0] += n
        lines.append({"status": f"pulling {ref}", "digest": f"sha256:{man.source_sha256 or ''}",
                      "total": total, "completed": min(done[0], total)})

    store.put(src, ref, source=str(src.resolve()), force=True, progress=progress)
    yield from lines[-64:]            # Store.put reports as it writes; the client gets the last steps
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    _serve(ref, store)
    yield {"status": "success"}


def _recipes() -> set[str]:
    """The recipe names `ortllm pull` builds (the TOML files of the ortllm.models package: data, read not imported)."""
    return {p.name.removesuffix(".toml") for p in files("ortllm.models").iterdir() if p.name.endswith(".toml")}


def _store_name(text: str) -> str:
    base = re.sub(r"\.(gguf|safetensors)$", "", text.lower())
    return re.sub(r"[^a-z0-9._-]+", "-", base).strip("-._")[:100] or "model"


def _build(store: Store, spec: str) -> Iterator[dict]:
    """A recipe, or a GGUF file or HF directory (an allowed absolute path): `ortllm pull` in a child process (the
    build is the pipeline's). It runs in an empty directory, so a recipe name is never read as a relative path."""
    name = spec if looks_like_name(spec) else _store_name(Path(spec).name)
    ref = _ref(name if ":" in name else f"{name}:{DEFAULT_TAG}")
    cmd = [sys.executable, "-m", "ortllm", "pull", spec, "--name", str(ref), "--no-progress", "--force"]
    env = {**os.environ, "ORTLLM_HOME": str(store.home)}
    (store.home / "tmp").mkdir(parents=True, exist_ok=True)
    cwd = tempfile.mkdtemp(prefix="pull-cwd-", dir=store.home / "tmp")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    tail: list[str] = []
    try:
        yield {"status": "pulling manifest"}
        for raw in proc.stdout:
            line = raw.strip()
            if line:
                tail = (tail + [line])[-5:]
                yield {"status": line.removeprefix("ortllm: ")}
        proc.wait()
    finally:
        if proc.poll() is None:       # the client left: stop the build
            proc.kill()
            proc.wait()
        shutil.rmtree(cwd, ignore_errors=True)
    if proc.returncode != 0:
        err = next((t for t in reversed(tail) if "error" in t), tail[-1] if tail else "the build failed")
        raise bad_request(f"cannot pull {spec!r}: {err.removeprefix('ortllm: error: ')}", param="model")
    yield {"status": "writing manifest"}
    _serve(ref, store)
    yield {"status": "success"}


# ---------------------------------------------------------------- delete, copy

@bp.delete("/delete")
@document("Ollama: remove a model from the local store (and stop serving it)", body=OLLAMA_DELETE, ok=_EMPTY_OK,
          errors=_MANAGE)
def delete():
    v = OLLAMA_DELETE.read(read_json_object(request))
    store = _store()
    try:
        ref = store.resolve(v["model"])
    except StoreError as e:
        raise _not_found(e) from None
    pool = current_resources()
    if pool.lazy and str(ref) in pool.by_name:
        pool.remove_model(str(ref))         # and its aliases; 409 while it answers requests
    try:
        store.remove(str(ref))
    except StoreError as e:
        raise APIError(409, str(e), param="model", code="model_in_use") from None
    return jsonify({})


@bp.post("/copy")
@document("Ollama: another name for a store model (no file is copied)", body=OLLAMA_COPY, ok=_EMPTY_OK,
          errors=_MANAGE)
def copy():
    v = OLLAMA_COPY.read(read_json_object(request))
    store = _store()
    dst = _ref(v["destination"], "destination")
    try:
        store.copy(v["source"], str(dst), force=True)
    except StoreError as e:
        raise _not_found(e, "source") from None
    _serve(dst, store)
    return jsonify({})


# ---------------------------------------------------------------- blobs (the files /api/create names)

def _uploads(store: Store) -> Path:
    return store.home / "uploads"


def _digest(text: str) -> str:
    m = _DIGEST.match(text)
    if not m:
        raise bad_request(f"{text!r} is not a blob digest: send sha256:<64 hex digits>", param="digest")
    return m.group(1)


@bp.route("/blobs/<digest>", methods=["HEAD"])
@document("Ollama: whether the server has a blob", ok=_EMPTY_OK, errors=(400, 401, 403, 404),
          params={"digest": _DIGEST_PARAM})
def blob_exists(digest: str):
    if not (_uploads(_store()) / f"sha256-{_digest(digest)}").is_file():
        return Response(status=404)
    return Response(status=200)


@bp.post("/blobs/<digest>")
@document("Ollama: send a file (its sha256 checked) for POST /api/create to name", ok=_EMPTY_OK, status=201,
          errors=(400, 401, 403, 413), params={"digest": _DIGEST_PARAM})
def blob_upload(digest: str):
    sha = _digest(digest)
    request.max_content_length = current_app.config["ORTLLM"].max_upload_bytes     # 413 beyond (--max-upload-size)
    folder = _uploads(_store())
    h = hashlib.sha256()
    with atomic_file(folder / f"sha256-{sha}") as tmp:
        with open(tmp, "wb") as f:
            while chunk := request.stream.read(1 << 20):
                h.update(chunk)
                f.write(chunk)
        if h.hexdigest() != sha:
            raise bad_request(f"the body's sha256 is {h.hexdigest()}, not the {sha} the path names; send the file "
                              "again", param="digest", code="digest_mismatch")
    return Response(status=201)


# ---------------------------------------------------------------- create

@bp.post("/create")
@document("Ollama: a new store model from a base: an adapter, a system message, parameters, a template "
          "(stream, the default: NDJSON progress)", body=OLLAMA_CREATE,
          ok=_progress_ok("the last progress line, status success"), errors=_MANAGE)
def create():
    v = OLLAMA_CREATE.read(read_json_object(request))
    for unsupported, what in (("files", "pull the GGUF file's path with POST /api/pull instead"),
                              ("quantize", "pull the recipe with the quantization wanted instead"),
                              ("messages", "send the conversation with each request")):
        if v[unsupported]:
            raise bad_request(f"{unsupported} is not supported here: {what}", param=unsupported)
    if v["template"] is not None:
        _check_template(v["template"])
    ref = _ref(v["model"])
    base, base_name = _base(v["from"])
    return _progress_response(_create_lines(v, ref, base, base_name), v["stream"])


def _base(name: str) -> tuple[Path, str]:
    """`from`: a store name, else a model this server serves; (its artifact directory, its name)."""
    store = _store()
    try:
        ref = store.resolve(name)
        return store.path(str(ref)), str(ref)
    except StoreError as store_error:
        pool = current_resources()
        res = pool.by_name.get(name) or (pool.default if name == pool.default.model_name else None)
        if res is None:
            raise _not_found(store_error, "from") from None
        path = res.path if res.path is not None else res.require_engine().artifact.path
        return Path(path), res.model_name


def _check_template(template: str) -> None:
    import jinja2
    if "{{ ." in template or "{{." in template:
        raise bad_request("template looks like a Go template (Ollama's); send a Jinja chat template, as in "
                          "tokenizer_config.json's chat_template", param="template")
    try:
        jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError as e:
        raise bad_request(f"template is not a valid Jinja template: {e}", param="template") from None


def _create_lines(v: dict, ref: ModelRef, base: Path, base_name: str) -> Iterator[dict]:
    """runtime/model_create.py's progress as Ollama's lines; the uploaded blobs it names checked first."""
    store = _store()
    files = _adapter_blobs(store, v["adapters"] or {})
    try:
        for status in create_model(store, ref, base, base_name, adapter_files=files, system=v["system"],
                                   parameters=v["parameters"], template=v["template"], license=v["license"]):
            yield {"status": status}
    except AdapterFileError as e:
        raise bad_request(str(e), param="adapters") from None
    _serve(ref, store)
    yield {"status": "success"}


def _adapter_blobs(store: Store, adapters: dict[str, str]) -> dict[str, Path]:
    """The uploaded files `adapters` names (file name -> digest), by file name."""
    out = {}
    for name, digest in adapters.items():
        blob = _uploads(store) / f"sha256-{_digest(digest)}"
        if not blob.is_file():
            raise bad_request(f"adapters: no blob {digest} for {name}; send the file with POST /api/blobs/{digest} "
                              "first (ollama's client: create_blob)", param="adapters")
        if Path(name).name != name:
            raise bad_request(f"adapters: {name!r} must be a file name, not a path", param="adapters")
        out[name] = blob
    return out
