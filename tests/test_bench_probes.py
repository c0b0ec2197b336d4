"""The development probes in bench/probes/ stay runnable by path, as their docstrings say: each parses its options
(`--help`) with its imports resolved, from any working directory, and names its own path in its usage line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBES = sorted((REPO / "bench" / "probes").glob("*.py"))


def test_the_probes_are_there():
    assert len(PROBES) >= 10 and (REPO / "bench" / "probes" / "read_bandwidth.cc").is_file()


@pytest.mark.parametrize("probe", PROBES, ids=[p.stem for p in PROBES])
def test_probe_runs_by_path(probe, tmp_path):
    p = subprocess.run([sys.executable, str(probe), "--help"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage:"), p.stderr[-2000:]
    assert f"bench/probes/{probe.name}" in probe.read_text(), "the docstring's command names another path"
