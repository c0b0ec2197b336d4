"""Locate, check and register libortllm_ops.so (ORT custom ops, domain ``ortllm``).

Importable with numpy/onnxruntime only (never torch). A missing library, or one built from other
sources (its ``OrtllmOpsAbiVersion()`` differs from ``OPS_ABI_VERSION``), raises OpsLibraryError
naming the command that builds it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .errors import OrtllmError

# Must equal ORTLLM_OPS_ABI_VERSION in custom_ops/src/ops/register.cc; bump both together whenever
# an op's inputs, outputs or attributes change.
OPS_ABI_VERSION = 14
ENV_OVERRIDE = "ORTLLM_OPS_LIBRARY"
BUILD_COMMAND = "make ops"


class OpsLibraryError(OrtllmError, RuntimeError):
    """The custom-ops library is missing or stale; the message says how to build it."""


def ops_library_path() -> Path:
    """Path of libortllm_ops.so: $ORTLLM_OPS_LIBRARY if set, else <this package>/lib/."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        return Path(override)
    return Path(__file__).parent / "lib" / "libortllm_ops.so"


def ops_abi_version(path: Path) -> int:
    """OrtllmOpsAbiVersion() of the library at path (loaded with ctypes, no ORT needed)."""
    lib = ctypes.CDLL(str(path))
    fn = lib.OrtllmOpsAbiVersion
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return int(fn())


def ops_isa(path: Path | None = None) -> str:
    """OrtllmOpsIsa() of the library (default: ops_library_path()): the kernel path this CPU takes, "scalar",
    "avx2" or "avx512vnni"."""
    fn = ctypes.CDLL(str(path or ops_library_path())).OrtllmOpsIsa
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn().decode()


def check_ops_library(path: Path | None = None) -> Path:
    """Return the library path after checking that it exists and matches OPS_ABI_VERSION."""
    path = Path(path) if path is not None else ops_library_path()
    if not path.is_file():
        raise OpsLibraryError(f"ortllm custom ops library not found at {path}; build it with `{BUILD_COMMAND}`")
    try:
        version = ops_abi_version(path)
    except (OSError, AttributeError) as exc:
        raise OpsLibraryError(
            f"{path} is not a loadable ortllm ops library ({exc}); rebuild it with `{BUILD_COMMAND}`"
        ) from exc
    if version != OPS_ABI_VERSION:
        raise OpsLibraryError(
            f"{path} has ops ABI version {version}, this ortllm needs {OPS_ABI_VERSION}; "
            f"rebuild it with `{BUILD_COMMAND}`"
        )
    return path


def register_ops(sess_options, path: Path | None = None) -> Path:
    """Register the ortllm ops on an onnxruntime.SessionOptions; returns the library path."""
    path = check_ops_library(path)
    sess_options.register_custom_ops_library(str(path))
    return path
