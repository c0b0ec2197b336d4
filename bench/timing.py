"""The timing kit of the op benches (bench/ops.py, bench/qlinear.py): a pre-bound ORT session per system (its
graph and session from bench/op_graphs.py), systems alternated round by round, and the rows they report.

Every system of one comparison runs in the same process with the same thread count; `compare` interleaves
them so a change in the host's state hits all of them alike (read the ratios of one run, not absolute
figures across runs).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from .op_graphs import session
from .results import row


class Runner:
    """A session with every input and output pre-bound (IO binding); `aliases` maps an output name to
    the input whose OrtValue it shares (in-place cache update)."""

    def __init__(self, graph: onnx.ModelProto, feeds: dict, threads: int, aliases: dict | None = None,
                 library: Path | None = None, spinning: bool = False):
        # Several sessions live side by side here; spinning idle workers would steal the 2 cores from
        # whichever session is being timed. Same setting for every system (spinning=True: ORT's default, the
        # engine's setting, for the cases that measure a pool dispatch).
        self.sess = session(graph, threads, library=library, spinning=spinning)
        self.values = {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
        self.binding = self.sess.io_binding()
        for k, v in self.values.items():
            self.binding.bind_ortvalue_input(k, v)
        aliases = aliases or {}
        for out in self.sess.get_outputs():
            if out.name in aliases:
                self.binding.bind_ortvalue_output(out.name, self.values[aliases[out.name]])
            else:
                self.binding.bind_output(out.name)
        self.run()  # warm-up

    def run(self):
        self.sess.run_with_iobinding(self.binding)


def _time_block(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def compare(systems: dict, rounds: int, target_s: float) -> dict:
    """Alternate systems round by round; each sample is the mean of `reps` calls (~target_s long)."""
    reps = {}
    for name, fn in systems.items():
        fn()
        one = _time_block(fn, 3)
        reps[name] = max(1, int(target_s / max(one, 1e-7)))
    samples = {name: [] for name in systems}
    for _ in range(rounds):
        for name, fn in systems.items():
            samples[name].append(_time_block(fn, reps[name]))
    return samples


def us_row(scenario, system, batch, metric, values, unit, scale=1e6):
    """Seconds -> microseconds, 3 decimals (results.row, the one row builder)."""
    return row(scenario, system, batch, metric, values, unit, scale=scale, digits=3)


def ratio_row(scenario, system, batch, metric, num, den):
    """median(num)/median(den) with the extreme ratios as min/max."""
    num, den = np.asarray(num), np.asarray(den)
    return {"scenario": scenario, "system": system, "batch": batch, "metric": metric,
            "median": round(float(np.median(num) / np.median(den)), 3),
            "min": round(float(num.min() / den.max()), 3), "max": round(float(num.max() / den.min()), 3),
            "unit": "x"}
