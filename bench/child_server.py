"""A server under test in a child process: started, waited for, stopped, the same way for every system the serve
scenarios load (`ortllm serve`, `ortllm serve --ray`, llama.cpp's `llama-server`, llama-cpp-python's server).

Use a subclass as a context manager: enter starts `cmd` with stdout and stderr to `log_path` and returns once
`_wait_ready` says the server answers (it returns the base URL); exit sends SIGTERM (the server drains) and kills it
if it is still there `grace` s later. The child also gets SIGTERM if the bench dies, so no server outlives it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .errors import BenchError


class ChildServer:
    name = "server"          # in errors: "<name> exited with 1 before it was ready"

    def __init__(self, cmd: list[str], log_path: Path, start_timeout: float, grace: float):
        self.cmd, self.log_path, self.start_timeout, self.grace = cmd, Path(log_path), start_timeout, grace
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=die_with_parent())
        try:
            self.url = self._wait_until(self._ready)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _ready(self) -> str | None:
        """The base URL once the server answers, else None (polled every 0.1 s until start_timeout)."""
        raise NotImplementedError

    def _exited_message(self) -> str:
        """Why the child exited before it was ready (subclasses add the log's last line)."""
        return f"{self.name} exited with {self.proc.returncode} before it was ready (log: {self.log_path})"

    def _wait_until(self, ready) -> str:
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if url := ready():
                return url
            if self.proc.poll() is not None:
                raise BenchError(self._exited_message())
            time.sleep(0.1)
        raise BenchError(f"{self.name} was not ready within {self.start_timeout:.0f} s (log: {self.log_path})")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (for servers that cannot take --port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """preexec_fn for Linux: the child gets SIGTERM when the thread that started it dies (no orphan server).
    The libc function is looked up here, before the fork; None where prctl is not available."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGTERM))     # PR_SET_PDEATHSIG
