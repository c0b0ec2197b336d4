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


MAX_PATH_BYTES = 4096       # Linux PATH_MAX


def check_path_text(text: str, param: str) -> None:
    """A 400 naming `param` for text no file system can hold (a NUL byte, nothing, past PATH_MAX), before any
    system call sees it (os.stat raises ValueError on a NUL byte: a 500 otherwise)."""
    why = ("is empty" if not text else "contains a NUL byte" if "\x00" in text else
           f"is longer than {MAX_PATH_BYTES} bytes" if len(text.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES
           else None)
    if why is not None:
        raise APIError(400, f"{param}: the path {why}; send the path of a file or directory on the server",
                       param=param, code="invalid_path")


def server_path(text: str, param: str) -> Path:
    """The resolved path text names: a 400 if it cannot be a path, a 403 naming `param` if it is outside every
    allowed root."""
    check_path_text(text, param)
    path = Path(text).resolve()
    roots = allowed_roots()
    if any(path == root or path.is_relative_to(root) for root in roots):
        return path
    shown = ", ".join(str(r) for r in roots)
    raise APIError(403, f"{param}: {text!r} is outside the directories this server reads from ({shown}); start it "
                   f"with --allowed-path DIR to let requests name files under DIR", type="permission_error",
                   param=param, code="path_not_allowed")
