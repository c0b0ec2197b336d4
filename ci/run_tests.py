"""`make test`: the whole suite. The tests that depend on the ops' numerics (marker isa_paths: quality gates, batch
invariance, speculative identity, ops parity) run on every path they take inside their own process (each session on
its own path: tests/conftest.py isa_paths, tests/custom_ops/conftest.py ops_path), so no job repeats per path.

The suite runs as jobs, one pytest process per test package or two (jobs()), two at a time. One process over
the whole suite grew to 18 GB of session state (models, tokenizers, torch) and was killed for memory on a 24 GiB
machine; a process per package starts each clean. One at a time left the second core idle half the time (a 2-core
host measured 1.15 cores busy on average over the pipeline tests), so two run at once, as long as the peaks of the
running jobs (each job's peak, measured or bounded: jobs()) stay within MEMORY_BUDGET_GB. Every job shares the
session artifacts (ORTLLM_TEST_ARTIFACTS, tests/conftest.py: built once, by whichever job needs one first, under a
lock).

Each job's output is printed whole when it ends, then every job's time. PYTEST_ARGS (environment): extra
pytest arguments for every job; ORTLLM_TEST_LANES: jobs at a time (default 2).
Exit status: 0 when every job passed (or collected nothing), else 1.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEMORY_BUDGET_GB = 21.0      # of the 24 GiB host: what the running jobs' peaks may add up to
NO_TESTS = 5                 # pytest's exit status when a job selects nothing


@dataclass
class Job:
    name: str
    paths: list[str]
    peak_gb: float                                  # the most memory its process used, measured alone
    proc: subprocess.Popen | None = None
    log: Path | None = None
    start: float = 0.0
    seconds: float = 0.0
    rc: int | None = None


def jobs() -> list[Job]:
    """The suite in the order jobs are taken: the longest first, so the two lanes end together (CI at 2d1726d, idle
    2-core host: runtime 808 s as one job, pipeline 716, service+protocol 465, calibration+batch 427, custom-ops 258,
    Gemma 3 233, cli+rest 203; the runtime tests' invariance files, about 60% of their time, are a job of their
    own), and Gemma 3's last, after the pipeline tests built its artifacts, beside the only job small enough to share
    memory with it (custom-ops). Taken first, it built them itself while no other job fitted beside it once
    custom-ops ended (02:18, 190 s of a lane idle). Peaks: tests/runtime/test_gemma3_invariance.py 16.2 GB run alone
    (Gemma 3's 262k head, fp32 and int8 engines), the pipeline tests 8.1 GB (memory in use while they ran alone,
    sampled every 10 s); the others are bounds above what was seen, not per-job measurements (the calibration and
    batch tests 4.2 GB alone; two jobs at a time never had more than 12.8 GB in use at f9a2bd3)."""
    top = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py"))
    runtime = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "runtime").glob("test_*.py"))
    gemma = "tests/runtime/test_gemma3_invariance.py"
    invariance = [f"tests/runtime/test_{m}.py" for m in ("batch_invariance", "long_context_invariance", "speculative")]
    return [
        Job("pipeline", ["tests/pipeline"], 8.5),
        Job("runtime-invariance", invariance, 8.0),
        Job("service+protocol", ["tests/service", "tests/protocol"], 6.0),
        Job("calibration+batch", ["tests/calibration", "tests/batch"], 6.0),
        Job("runtime", [p for p in runtime if p != gemma and p not in invariance], 8.0),
        Job("cli+rest", ["tests/cli", *top], 6.0),
        Job("gemma3-invariance", [gemma], 16.5),
        Job("custom-ops", ["tests/custom_ops"], 4.0),
    ]


# Two jobs share two cores: a thread that waits for work must sleep, not spin. ONNX Runtime's intra-op threads spin
# by default (the engine's sessions take ORTLLM_ORT_CONFIG's entries, runtime/model_runner.py), as do OpenMP's
# (torch's references) and OpenBLAS's (NumPy's; 2^28 cycles by default, ~0.1 s here, after every call): spinning,
# a job ran the runtime tests in over 1,660 s beside the others instead of ~860 s alone. Waiting changes no
# result: it is when a thread takes its next task, not what the task computes.
QUIET_WAITS = {"ORTLLM_ORT_CONFIG": "session.intra_op.allow_spinning=0", "OMP_WAIT_POLICY": "PASSIVE",
               "OPENBLAS_THREAD_TIMEOUT": "4"}


def start(job: Job, shared: Path, extra: list[str]) -> None:
    env = {**QUIET_WAITS, **os.environ, "ORTLLM_TEST_ARTIFACTS": str(shared)}
    # each job's 10 slowest setups and calls in its output: where the suite's time goes, run by run
    cmd = [sys.executable, "-m", "pytest", "-q", "--durations=10", *extra, *job.paths]
    job.log = shared / f"{job.name.replace(':', '-').replace('+', '-')}.log"
    with open(job.log, "w") as f:
        f.write(f"$ {' '.join(shlex.quote(c) for c in cmd)}\n")
        f.flush()
        job.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    job.start = time.monotonic()


def runnable(job: Job, done: set[str], running: list[Job]) -> bool:
    return (job.proc is None
            and sum(r.peak_gb for r in running) + job.peak_gb <= MEMORY_BUDGET_GB)


def main() -> int:
    os.chdir(REPO)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a stopped run still stops its jobs (finally below)
    best = subprocess.run([sys.executable, "-c", "from ortllm.runtime.ops_library import ops_isa; print(ops_isa())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    lanes = int(os.environ.get("ORTLLM_TEST_LANES", "2"))
    extra = shlex.split(os.environ.get("PYTEST_ARGS", ""))
    todo = jobs()
    shared = Path(tempfile.mkdtemp(prefix="ortllm-test-artifacts."))
    print(f"== make test: the suite, the ops' default path {best} (and the isa_paths tests on every path they take), "
          f"{lanes} jobs at a time ==",
          flush=True)
    t0, running, done = time.monotonic(), [], set()
    try:
        while len(done) < len(todo):
            for job in todo:
                if len(running) < lanes and runnable(job, done, running):
                    start(job, shared, extra)
                    running.append(job)
                    print(f"== {time.monotonic() - t0:6.0f} s: {job.name} started ==", flush=True)
            time.sleep(1.0)
            for job in [j for j in running if j.proc.poll() is not None]:
                running.remove(job)
                job.rc, job.seconds = job.proc.returncode, time.monotonic() - job.start
                done.add(job.name)
                print(f"== {time.monotonic() - t0:6.0f} s: {job.name} ended with exit {job.rc} after "
                      f"{job.seconds:.0f} s ==", flush=True)
                print(job.log.read_text(errors="replace"), flush=True)
    finally:
        for job in running:                          # interrupted: no pytest left behind
            try:
                os.killpg(job.proc.pid, 9)
            except ProcessLookupError:
                pass
        shutil.rmtree(shared, ignore_errors=True)
    failed = [j for j in todo if j.rc not in (0, NO_TESTS)]
    print(f"== make test: {time.monotonic() - t0:.0f} s; per job: "
          + ", ".join(f"{j.name} {j.seconds:.0f} s (exit {j.rc})" for j in todo) + " ==")
    if failed:
        print("== FAILED: " + ", ".join(j.name for j in failed) + " ==")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
