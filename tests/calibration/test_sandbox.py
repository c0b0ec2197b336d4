"""The HumanEval sandbox: passing and failing programs, time and memory limits, no network."""
from __future__ import annotations

from ortllm.calibration.data import humaneval_problems
from ortllm.calibration.humaneval import program_of, run_sandboxed, truncate


def test_canonical_solution_passes_and_a_wrong_one_fails():
    p = humaneval_problems()[0]
    assert run_sandboxed(program_of(p, p.canonical_solution)) == (True, "passed")
    ok, reason = run_sandboxed(program_of(p, "    return None\n"))
    assert not ok and "AssertionError" in reason


def test_limits_and_network():
    assert run_sandboxed("while True: pass", timeout=2)[0] is False
    ok, reason = run_sandboxed("x = bytearray(4 << 30)")
    assert not ok and "MemoryError" in reason
    ok, reason = run_sandboxed("import socket\nsocket.create_connection(('127.0.0.1', 80))")
    assert not ok and "sandbox" in reason
    ok, reason = run_sandboxed("import os\nos.system('true')")
    assert not ok and "sandbox" in reason


def test_truncate_at_next_top_level_statement():
    assert truncate("    return 1\n\ndef other():\n    pass") == "    return 1\n"
    assert truncate("    return 1\nprint(f(2))") == "    return 1"
