"""Several artifacts within one memory budget; unload really releases the session and its buffers."""
from __future__ import annotations

import weakref

import pytest

from ortllm.runtime.session_manager import MemoryBudgetExceeded, SessionManager, estimate_bytes
from ortllm.runtime.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def test_side_by_side_within_budget_and_unload_frees(tiny_engine):
    one = estimate_bytes(tiny_engine, num_blocks=256)
    manager = SessionManager(memory_budget_bytes=int(2.5 * one))
    a = manager.load("a", tiny_engine, num_blocks=256)
    b = manager.load("b", tiny_engine, num_blocks=256)
    assert a.generate(["x"], GREEDY)[0].token_ids == b.generate(["x"], GREEDY)[0].token_ids
    with pytest.raises(MemoryBudgetExceeded, match="MiB"):
        manager.load("c", tiny_engine, num_blocks=256)
    assert manager.names() == ["a", "b"]

    pool = weakref.ref(a.runner._arrays["key_cache"])
    session = weakref.ref(a.runner.session)
    del a
    manager.unload("a")         # released by the unload itself, not by a later collection
    assert pool() is None and session() is None, "unload must drop the KV pool and the session"
    assert manager.used_bytes() == pytest.approx(one)
    c = manager.load("c", tiny_engine, num_blocks=256)     # fits again
    assert c.generate(["x"], GREEDY)[0].finish_reason == "length"
    manager.close()
    assert manager.names() == []
