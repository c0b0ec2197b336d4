"""Paths on the server that a request names (POST /api/pull of a GGUF file, an HF or artifact directory; POST
/v1/adapters' PEFT directory): each is read only if it lies under an allowed root (`ortllm serve --allowed-path
DIR`, repeatable; none given: the store, $ORTLLM_HOME), after symlinks and `..` are resolved, so a request cannot
make the server read, copy or serve any other file its user can read. A path outside is a 403 whether or not it
exists (the answer tells nothing about the rest of the disk)."""
from __future__ import annotations

from pathlib import Path

from flask import current_app

from ortllm.runtime.store import ortllm_home

from .errors import APIError


def allowed_roots() -> list[Path]:
    roots = current_app.config["ORTLLM"].allowed_paths or (ortllm_home(),)
    return [Path(r).expanduser().resolve() for r in roots]


def server_path(text: str, param: str) -> Path:
    """The resolved path text names, or a 403 naming `param` if it is outside every allowed root."""
    path = Path(text).resolve()
    roots = allowed_roots()
    if any(path == root or path.is_relative_to(root) for root in roots):
        return path
    shown = ", ".join(str(r) for r in roots)
    raise APIError(403, f"{param}: {text!r} is outside the directories this server reads from ({shown}); start it "
                   f"with --allowed-path DIR to let requests name files under DIR", type="permission_error",
                   param=param, code="path_not_allowed")
