"""Processes of other ortllm commands: whether the one that left a file behind still runs.

Used wherever a file names its writer's pid: leftovers of killed builds and pulls (pipeline/build.py,
runtime/store.py), and server states of `ortllm ps` (runtime/store.py).
"""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process exists (leftovers of dead builds and pulls, stale server states)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
