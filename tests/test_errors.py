"""One error tree: every exception a product module defines is an OrtllmError (runtime/errors.py), so the CLI
prints it as one `ortllm: error: ...` line and the service answers it with its envelope."""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from ortllm.runtime.errors import OrtllmError

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "pipeline", "service", "protocol", "calibration", "batch", "bench", "cli")
# Exceptions that never reach a user, each with the reason.
INTERNAL = {
    "ortllm.runtime.block_pool.NoFreeBlocks",    # the scheduler catches it and preempts (runtime/scheduler.py)
}


def _modules():
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            rel = f.relative_to(REPO).with_suffix("")
            if "peers" in rel.parts:       # the peers' drivers run in their own venv and import nothing of ours
                continue
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield "ortllm." + ".".join(parts)


def test_every_defined_exception_is_an_ortllm_error():
    outside = []
    for name in _modules():
        try:
            mod = importlib.import_module(name)
        except ImportError as e:        # an optional extra (ray) not installed: its module cannot define errors here
            if "ray" in str(e):
                continue
            raise
        for cls_name, cls in inspect.getmembers(mod, inspect.isclass):
            qual = f"{cls.__module__}.{cls_name}"
            if (cls.__module__ == name and issubclass(cls, BaseException) and not issubclass(cls, OrtllmError)
                    and qual not in INTERNAL):
                outside.append(qual)
    assert not outside, f"exceptions outside the OrtllmError tree (runtime/errors.py): {outside}"


@pytest.mark.parametrize("mapping", ["ortllm.protocol.errors", "ortllm.service.errors"])
def test_any_ortllm_error_gets_the_envelope(mapping):
    from ortllm.runtime.ops_library import OpsLibraryError
    to_api_error = importlib.import_module(mapping).to_api_error
    err = to_api_error(OpsLibraryError("ortllm custom ops library not found at /x; build it with `make ops`"))
    assert err is not None and err.status == 500
    assert err.body()["error"] == {"message": "ortllm custom ops library not found at /x; build it with `make ops`",
                                   "type": "server_error", "param": None, "code": "ops_library_error"}
    assert to_api_error(RuntimeError("a bug")) is None     # a bug stays a logged 500 "internal error"
