"""A process' memory as /proc/PID/status reports it: the memory scenario's and the peer runs' one reader."""
from __future__ import annotations

MIB = 2**20


def status_bytes(field: str = "VmHWM", pid: int | str = "self") -> int | None:
    """A `kB` field of /proc/PID/status in bytes (VmHWM: peak resident set; VmRSS: now); None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
