"""What memory this process may still take: read by the engine's memory plan (runtime/memory_plan.py) and by the
build, which runs a model's fp32 copy one layer at a time where it would not fit (pipeline/layer_reference.py)."""
from __future__ import annotations

from pathlib import Path


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, capped by the cgroup's memory limit; None if unknown."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            room = int(limit) - used
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail
