"""Shared helpers for the custom-op tests: the skip when the ops library is missing, the PagedAttention batch
shapes every attention test runs, and the parity tolerance check (llm.c validate_result). The graphs, sessions and
PagedAttention inputs come from bench/op_graphs.py (the op benches and probes build theirs there too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


from ortllm.runtime.ops_library import OpsLibraryError, check_ops_library, ops_isas, sessions_on

REPO = Path(__file__).resolve().parents[2]

# (context_len, new_tokens) per sequence
SCENARIOS = {
    "prefill": [(0, 37)],
    "decode": [(45, 1), (16, 1), (0, 1), (31, 1)],          # contexts on/around block edges
    "mixed": [(30, 1), (0, 20), (17, 40), (64, 1)],        # decode + prefill + chunked prefill
    "with_idle_seq": [(10, 0), (5, 3), (33, 1)],           # a sequence with no new token
}


def pytest_collection_modifyitems(config, items):
    try:
        check_ops_library()
    except OpsLibraryError as exc:  # every test here needs the library
        skip = pytest.mark.skip(reason=str(exc))
        for item in items:
            if "custom_ops" in str(item.fspath) and "test_ops_library" not in str(item.fspath):
                item.add_marker(skip)


# x86's kernel paths, best first (custom_ops/src/kernels/x86/isa_x86.cc), then the portable one every build has.
PATH_ORDER = ("amx", "avx512vnni", "avx2", "scalar")


def path_at_most(name: str) -> str:
    """The best path this CPU runs at or below name in PATH_ORDER (as ORTLLM_OPS_ISA falls back): a test that
    compares "avx512vnni" with the default on an AVX2-only CPU compares avx2 with it."""
    supported = ops_isas()
    return next(p for p in PATH_ORDER[PATH_ORDER.index(name):] if p in supported)


@pytest.fixture(autouse=True)
def ops_path(request):
    """The kernel path of the sessions a test makes (bench/op_graphs.session): "default" (the library's default path)
    unless the test is parametrized over it, @pytest.mark.parametrize("ops_path", ["default", "scalar"],
    indirect=True), to run on other paths in this process too."""
    path = getattr(request, "param", "default")
    if path == "default":
        yield path
        return
    with sessions_on(path_at_most(path)):
        yield path


def assert_close(got, ref, *, atol, rtol, what=""):
    """|got - ref| <= atol + rtol * |ref| elementwise (llm.c validate_result); reports the worst."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    tol = atol + rtol * np.abs(ref)
    bad = np.abs(got - ref) > tol
    if bad.any():
        i = np.unravel_index(np.argmax(np.abs(got - ref) - tol), got.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} elements out of tolerance; worst at {i}: "
                             f"got {got[i]:.8g}, ref {ref[i]:.8g}, tol {tol[i]:.3g}")
