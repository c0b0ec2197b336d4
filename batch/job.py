"""`ortllm batch`: the whole job on this machine (or on Ray with ray=True): resume, progress bar, summary.

Ctrl-C stops submitting, cancels what runs (those requests are lost: a rerun does them) and closes the
output cleanly; a second Ctrl-C raises KeyboardInterrupt at once. A kill loses the in-flight requests; the
next run truncates a torn last line, if any, and skips every custom_id already answered.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .output import BatchFileError, ResultWriter, repair_and_scan
from .runner import EngineFeeder, Stats, tick
from .source import Counts, count_lines, read_items


@dataclass
class BatchOptions:
    max_num_seqs: int | None = None
    threads: int | None = None              # engine intra-op threads (default: physical cores)
    model_name: str | None = None           # the base model's `model` (default: the artifact's recipe)
    engine_overrides: dict = field(default_factory=dict)
    progress: bool = True
    ray: bool = False
    num_workers: int = 2
    address: str | None = None              # Ray cluster address (None: start or join a local one)

    def overrides(self) -> dict:
        o = dict(self.engine_overrides)
        if self.max_num_seqs is not None:
            o["max_num_seqs"] = self.max_num_seqs
        if self.threads is not None:
            o["threads"] = self.threads
        return o


@dataclass
class Summary:
    lines: int                   # non-blank input lines
    skipped: int                 # answered by an earlier run
    ok: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float               # wall time, engine load included
    load_s: float = 0.0          # engine load (local runs; on Ray it is inside `seconds` only)
    interrupted: bool = False

    def line(self, output: Path) -> str:
        s = max(self.seconds - self.load_s, 1e-9)
        done = self.ok + self.errors
        head = "interrupted" if self.interrupted else "done"
        load = f" + {self.load_s:.1f} s engine load" if self.load_s else ""
        return (f"batch {head}: {done} lines written ({self.ok} ok, {self.errors} errors), {self.skipped} skipped "
                f"as already in {output}, of {self.lines}; {s:.1f} s{load}; {done / s:.2f} req/s, "
                f"{self.completion_tokens / s:.1f} generated tok/s, {self.prompt_tokens / s:.1f} prompt tok/s"
                + ("; rerun the same command to resume" if self.interrupted else ""))


def run_batch(artifact: Path, input_path: Path, output_path: Path, options: BatchOptions | None = None) -> Summary:
    options = options or BatchOptions()
    input_path, output_path = Path(input_path), Path(output_path)
    if not input_path.is_file():
        raise BatchFileError(f"--input {input_path} is not a file")
    if output_path.resolve() == input_path.resolve():
        raise BatchFileError("--output must differ from --input")
    done = repair_and_scan(output_path)
    counts = Counts()
    items = read_items(input_path, done, counts)
    bar = _progress(count_lines(input_path) - done.lines, options.progress)
    t0 = time.perf_counter()
    with ResultWriter(output_path) as writer:
        if options.ray:
            from .ray_job import run_on_ray
            stats, interrupted = run_on_ray(artifact, items, writer, options, bar)
            load_s = 0.0
        else:
            stats, interrupted, load_s = _run_local(artifact, items, writer, options, bar)
    if bar is not None:
        bar.close()
    summary = Summary(counts.lines, counts.skipped, stats.ok, stats.errors, stats.prompt_tokens,
                      stats.completion_tokens, time.perf_counter() - t0, load_s, interrupted)
    print(summary.line(output_path), file=sys.stderr)
    return summary


def _run_local(artifact: Path, items, writer: ResultWriter, options: BatchOptions, bar) -> tuple[Stats, bool, float]:
    from ortllm.runtime.engine import Engine

    from .protocol import model_name_of

    t0 = time.perf_counter()
    with Engine.from_artifact(artifact, **options.overrides()) as engine:
        load_s = time.perf_counter() - t0
        if bar is not None:
            bar.reset(total=bar.total)          # rate and ETA from the first request, not from the load
        feeder = EngineFeeder(engine, model_name_of(engine, options.model_name))
        with _stop_on_sigint(feeder):
            for line in feeder.run(items):
                writer.write(line)
                tick(bar, feeder.stats)
        return feeder.stats, feeder.stop, load_s


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=max(total, 0), unit="req", file=sys.stderr, dynamic_ncols=True, smoothing=0.1,
                desc="batch")


class _stop_on_sigint:
    """First Ctrl-C: feeder.stop (graceful, no torn line); second: the default KeyboardInterrupt."""

    def __init__(self, feeder):
        self.feeder, self.previous = feeder, None

    def _handle(self, signum, frame):
        if self.feeder.stop:
            raise KeyboardInterrupt
        self.feeder.stop = True
        print("\nbatch: stopping (Ctrl-C again to abort at once); in-flight requests are left for a rerun",
              file=sys.stderr)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
