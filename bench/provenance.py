"""Where a figure came from: the machine, the commit and the command, the same in every results.json (and
results.md) the bench writes (docs/architecture.md, Conventions: figures come with their command).

    machine()  "AMD EPYC 7B13 (2 cores available; avx2, fma), 24 GiB, Linux-..., onnxruntime 1.31.1, ops avx2"
    commit()   "cb50a05", or "cb50a05+dirty" when tracked files differ from it (the one dirty marker)
    command()  the command line as a user would type it again
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIRTY = "+dirty"


def _cpu_model() -> tuple[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU", ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                 platform.processor() or "unknown CPU")
    flags = ", ".join(f for f in ("avx2", "fma", "avx512f") if f" {f}" in text)
    return model, flags


def _runtime_versions() -> str:
    """onnxruntime's version and the ops library's ISA path (avx2 | avx512vnni | amx | scalar) and stream prefetch hint
    (t0 | nta), when they load."""
    parts = []
    try:
        import onnxruntime as ort
        parts.append(f"onnxruntime {ort.__version__}")
    except ImportError:
        pass
    try:
        from ortllm.runtime.ops_library import ops_isa, ops_prefetch
        parts.append(f"ops {ops_isa()}, prefetch {ops_prefetch()}")
    except (OSError, AttributeError):
        pass
    return ", ".join(parts)


def machine() -> str:
    model, flags = _cpu_model()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    text = f"{model} ({len(os.sched_getaffinity(0))} cores available; {flags}), {mem:.0f} GiB, {platform.platform()}"
    versions = _runtime_versions()
    return f"{text}, {versions}" if versions else text


def commit() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{rev}{DIRTY if dirty else ''}" if rev else "unknown"


def command(prog: str = "ortllm", argv: list[str] | None = None) -> str:
    """prog and the arguments (default: this process's), e.g. "python -m ortllm.bench.ops --out DIR"."""
    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


def provenance(cmd: str | None = None) -> dict:
    """{machine, commit, command}: what results.json and results.md say about how their rows were made."""
    return {"machine": machine(), "commit": commit(), "command": cmd or command()}
