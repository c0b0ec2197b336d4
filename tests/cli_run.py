"""`ortllm ARGS` for the tests: in this process through ortllm.cli.main (no interpreter start, no re-import of
numpy/onnxruntime, session artifacts already loaded), or as a process where a test needs one (a signal, a fresh
process's environment, the entry point itself).

Both return a subprocess.CompletedProcess (returncode, stdout, stderr), so a test reads them the same way."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys


def ortllm(*args, env: dict[str, str] | None = None, stdin: str = "",
           timeout: float | None = None) -> subprocess.CompletedProcess:
    """main(ARGS) as `python -m ortllm ARGS` runs it: its stdout and stderr captured, argparse's exit (SystemExit)
    as the status; env: variables set for this call only (os.environ is restored after it, with anything the verb
    set, e.g. `ortllm verify`'s ORTLLM_VERIFY); stdin: what the verb reads from standard input. timeout: a call
    that must end within a bound (long benches and builds) runs as a process of its own with it (ortllm_process),
    since a call in this process cannot be stopped."""
    if timeout is not None:
        return ortllm_process(*args, env=env, timeout=timeout, input=stdin)
    from ortllm.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    saved_stdin = sys.stdin
    os.environ.update(env or {})
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:           # argparse: --help (0), a usage error (2)
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdin = saved_stdin
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["ortllm", *argv], rc, out.getvalue(), err.getvalue())


def ortllm_process(*args, env: dict[str, str] | None = None, unset: tuple[str, ...] = (), timeout: float = 300,
                   **kw) -> subprocess.CompletedProcess:
    """`python -m ortllm ARGS` as a process of its own: its environment this process's, with `env` added and the
    names in `unset` removed; kw: subprocess.run's (input=...)."""
    child = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    return subprocess.run([sys.executable, "-m", "ortllm", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=child, **kw)
