"""Locate, check and register libortllm_ops.so (ORT custom ops, domain ``ortllm``), and read its ops' tables.

Importable with numpy/onnxruntime only (never torch). A missing library, or one built from other
sources (its ``OrtllmOpsAbiVersion()`` differs from ``OPS_ABI_VERSION``), raises OpsLibraryError
naming the command that builds it. ``op_schema(name)`` is an op's inputs and attributes as the library declares
them (``OrtllmOpsSchema()``, custom_ops/src/ops/op_schema.h): the graph builder names a node's inputs by it.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from .errors import OrtllmError

# The one ops ABI version: custom_ops/CMakeLists.txt reads this line and builds it into the library's
# OrtllmOpsAbiVersion(). Bump it whenever an op's inputs, outputs or attributes change.
OPS_ABI_VERSION = 18
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


# The kernel path of sessions registered without one in this context (sessions_on); None: the library's default.
_SESSIONS_ISA: ContextVar[str | None] = ContextVar("ortllm_sessions_isa", default=None)


@contextmanager
def sessions_on(isa: str | None):
    """Sessions registered inside this block (this thread, this context) without a path of their own take isa, one
    of ops_isas() (None: the default): the tests run the same graphs and engines on every path in one process."""
    token = _SESSIONS_ISA.set(isa)
    try:
        yield
    finally:
        _SESSIONS_ISA.reset(token)


def sessions_isa() -> str | None:
    """The path sessions_on() set for this context (None: the default), e.g. a key for a cache of sessions."""
    return _SESSIONS_ISA.get()


def _library_string(path: Path | None, symbol: str) -> str:
    """symbol(), a `const char*` export of the library (default: ops_library_path()), decoded; AttributeError if the
    library does not export it."""
    fn = getattr(ctypes.CDLL(str(path or ops_library_path())), symbol)
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn().decode()


def ops_isa(path: Path | None = None) -> str:
    """The kernel path a session registered now without one takes: what sessions_on() set in this context, else
    OrtllmOpsIsa() of the library (default: ops_library_path()), the best this CPU runs or what ORTLLM_OPS_ISA names:
    "scalar", "avx2", "avx512vnni" or "amx" (VNNI's table with QLinear's multi-token dots on the AMX tile unit)."""
    return _SESSIONS_ISA.get() or _library_string(path, "OrtllmOpsIsa")


def ops_isas(path: Path | None = None) -> tuple[str, ...]:
    """OrtllmOpsIsas() of the library: every kernel path this CPU and build run, best first, "scalar" last (on an
    AVX2-only CPU ("avx2", "scalar")). A session takes any of them (register_ops(isa=...)); they give the same bits."""
    return tuple(name.strip() for name in _library_string(path, "OrtllmOpsIsas").split(","))


def ops_prefetch(path: Path | None = None) -> str:
    """OrtllmOpsPrefetch() of the library: the hint its decode kernels prefetch the weights and the KV stream with,
    "t0" (Intel CPUs) or "nta" (others); ORTLLM_OPS_PREFETCH=t0|nta forces one (custom_ops/src/kernels/
    stream_prefetch.h says why)."""
    return _library_string(path, "OrtllmOpsPrefetch")


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


# The session config entry naming a session's kernel path (custom_ops/src/kernels/isa.h kSessionIsaKey).
SESSION_ISA_KEY = "ortllm.ops_isa"
def register_ops(sess_options, path: Path | None = None, isa: str | None = None) -> Path:
    """Register the ortllm ops on an onnxruntime.SessionOptions; returns the library path. isa: the kernel path of
    this session's ops (one of ops_isas()); None: the default (ops_isa()). One process may hold sessions on
    every path at once."""
    path = check_ops_library(path)
    isa = isa if isa is not None else _SESSIONS_ISA.get()
    if isa is not None:
        choices = ops_isas(path)
        if isa not in choices:
            raise OpsLibraryError(f"ops_isa {isa!r} is not a kernel path of this CPU and build; choose one of "
                                  f"{', '.join(choices)} (or leave it unset for {ops_isa(path)})")
        sess_options.add_session_config_entry(SESSION_ISA_KEY, isa)
    sess_options.register_custom_ops_library(str(path))
    return path


@dataclass(frozen=True)
class OpInput:
    """One input of an op's table: its element types (several: one per registered variant), its dims by symbol
    ("T, K"; "A | B": either form; a leading "[n_layers,]" with the op's stack attribute), whether it may be left
    out ("" in a node), and a one-line doc."""
    name: str
    types: tuple[str, ...]
    shape: str
    optional: bool
    doc: str


@dataclass(frozen=True)
class OpAttribute:
    name: str
    type: str               # "int", "float", "string" or "ints"
    default: str | None     # None: required
    doc: str


@dataclass(frozen=True)
class OpSchema:
    """An op's inputs (in their positions) and attributes, as the library declares and checks them."""
    name: str
    doc: str
    stack_attr: str | None
    inputs: tuple[OpInput, ...]
    attributes: tuple[OpAttribute, ...]

    def index(self, input_name: str) -> int:
        """The position of an input in the node's input list."""
        for i, inp in enumerate(self.inputs):
            if inp.name == input_name:
                return i
        raise KeyError(f"{self.name} has no input {input_name!r}; its inputs: {[i.name for i in self.inputs]}")

    def node_inputs(self, named: dict[str, str]) -> list[str]:
        """A node's input list from {input name: value name}: each at its position, "" for the inputs left out
        (only optional ones may be), trailing ones dropped."""
        ins = [""] * len(self.inputs)
        for name, value in named.items():
            ins[self.index(name)] = value or ""
        missing = [i.name for i, v in zip(self.inputs, ins) if not v and not i.optional]
        if missing:
            raise KeyError(f"{self.name} needs inputs {missing}")
        while ins and ins[-1] == "":
            ins.pop()
        return ins

    def markdown(self) -> str:
        """The inputs and attributes as Markdown tables (custom_ops/README.md carries them, checked by a test)."""
        def shape(inp: OpInput) -> str:
            stacked = inp.shape.startswith("[n_layers,]")
            forms = " or ".join(f"`[{f.strip()}]`" for f in inp.shape.removeprefix("[n_layers,]").split("|"))
            return forms + (f" (`[n_layers, ...]` with {self.stack_attr})" if stacked else "")
        rows = ["| # | input | shape | type | |", "|---|---|---|---|---|"]
        rows += [f"| {i} | {inp.name}{' (optional)' if inp.optional else ''} | {shape(inp)} | "
                 f"{' / '.join(inp.types)} | {inp.doc} |" for i, inp in enumerate(self.inputs)]
        rows += ["", "| attribute | type | default | |", "|---|---|---|---|"]
        rows += [f"| {a.name} | {a.type} | {'required' if a.default is None else a.default} | {a.doc} |"
                 for a in self.attributes]
        return "\n".join(rows)


def ops_schema_json(path: Path | None = None) -> dict:
    """OrtllmOpsSchema() of the library (default: ops_library_path()), parsed: {"abi_version", "ops": [...]}."""
    path = check_ops_library(path)
    try:
        text = _library_string(path, "OrtllmOpsSchema")
    except AttributeError as exc:
        raise OpsLibraryError(f"{path} does not export its ops' tables ({exc}); rebuild it with `{BUILD_COMMAND}`") \
            from exc
    return json.loads(text)


@functools.cache
def _schemas(path: Path) -> dict[str, OpSchema]:
    return {op["name"]: OpSchema(op["name"], op["doc"], op["stack_attr"],
                                 tuple(OpInput(i["name"], tuple(i["types"]), i["shape"], i["optional"], i["doc"])
                                       for i in op["inputs"]),
                                 tuple(OpAttribute(a["name"], a["type"], a["default"], a["doc"])
                                       for a in op["attributes"]))
            for op in ops_schema_json(path)["ops"]}


def op_schema(name: str, path: Path | None = None) -> OpSchema:
    """The table of op `name` ("QLinear", "PagedAttention", "MultiLoRA") as the library at `path` (default:
    ops_library_path()) declares it."""
    schemas = _schemas(Path(path) if path is not None else ops_library_path())
    if name not in schemas:
        raise KeyError(f"the ops library has no op {name!r}; it has {sorted(schemas)}")
    return schemas[name]


if __name__ == "__main__":  # python -m ortllm.runtime.ops_library: every op's tables, as custom_ops/README.md has them
    for op in ops_schema_json()["ops"]:
        print(f"## {op['name']}\n\n{op_schema(op['name']).markdown()}\n")
