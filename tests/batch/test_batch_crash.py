"""A batch job stopped by Ctrl-C, then killed (SIGKILL), then rerun: every custom_id exactly once, each with the
result an uninterrupted run gives, and never a torn line."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from ortllm.batch import BatchOptions, run_batch
from tests.batch.conftest import BAD, assert_same, comparable, mixed_lines, read_output, write_lines
from tests.cli_run import ortllm

N = 600          # long enough at 2 sequences a step that both interruptions land mid-run


def _start(artifact: Path, src: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ortllm", "batch", str(artifact), "--input", str(src),
                             "--output", str(out), "--max-num-seqs", "2", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(out: Path) -> int:
    return out.read_bytes().count(b"\n") if out.exists() else 0


def _interrupt_after(proc: subprocess.Popen, out: Path, more_than: int, sig: int) -> tuple[int, str]:
    deadline = time.monotonic() + 60
    while _lines(out) <= more_than and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the job ended before it could be interrupted: " + proc.communicate()[1]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_ctrl_c_then_kill_then_rerun(batch_artifact, tmp_path):
    src = write_lines(tmp_path / "in.jsonl", mixed_lines(N, seed=2))
    out = tmp_path / "out.jsonl"

    rc, err = _interrupt_after(_start(batch_artifact, src, out), out, 40, signal.SIGINT)
    assert rc == 130, err
    assert "interrupted" in err and "rerun" in err
    first = read_output(out)                      # complete lines only (read_output checks the tail)
    assert 40 < len(first) < N

    rc, err = _interrupt_after(_start(batch_artifact, src, out), out, len(first) + 40, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    killed = out.read_bytes()
    assert len(first) < killed.count(b"\n") < N

    done = ortllm("batch", batch_artifact, "--input", src, "--output", out, "--no-progress")   # in process
    assert done.returncode == 0, done.stderr
    got = read_output(out)
    ids = [x["id"] for x in got]
    assert len(ids) == len(set(ids)) == N
    own = [x["custom_id"] for x in got if x["custom_id"] is not None and x["error"] is None]
    assert len(own) == len(set(own)) == N - sum(1 for i in BAD if i < N)

    ref = tmp_path / "ref.jsonl"
    run_batch(batch_artifact, src, ref, BatchOptions(progress=False))
    assert_same({x["id"]: comparable(x) for x in got}, {x["id"]: comparable(x) for x in read_output(ref)})
