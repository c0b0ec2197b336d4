"""Adapter prefetch: a queued request's adapter is read from disk into host RAM while it waits, on real sessions
(the tiny engine artifact), so the step that admits it does not read the file."""
from __future__ import annotations

import time

import numpy as np

from ortllm.bench.synthetic_adapters import link_copy, write_peft_lora
from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams


def _greedy(n, adapter=None):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, adapter=adapter)


def test_queued_requests_adapter_is_read_before_its_turn(tiny_engine, tmp_path):
    art = link_copy(tiny_engine, tmp_path / "art")
    model = read_manifest(art).model
    for k in range(2):
        add_adapter(art, write_peft_lora(tmp_path / f"peft{k}", model, 8, seed=k, b_scale=0.2), f"a{k}")
    rng = np.random.default_rng(0)
    busy, prompt = rng.integers(3, 512, 20).tolist(), rng.integers(3, 512, 24).tolist()
    with Engine.from_artifact(art, max_num_seqs=1, enable_prefix_cache=False, spec_max_tokens=0) as engine:
        reg = engine.adapters
        reads = []
        read = reg._load                      # the registry's real file read, counted

        def counted(name):
            reads.append(name)
            return read(name)
        reg._load = counted
        assert reg.state("a0") == "disk"
        first = engine.submit(busy, _greedy(400))          # holds the only seat for 400 steps
        while first.first_token_time is None:
            time.sleep(0.001)
        queued = engine.submit(prompt, _greedy(8, "a0"))
        deadline = time.monotonic() + 10
        while reg.state("a0") != "host":
            assert time.monotonic() < deadline, f"a0 is still {reg.state('a0')} after 10 s"
            time.sleep(0.0005)
        assert queued.scheduled_time is None, "the request ran before its adapter was prefetched"
        assert len(first.token_times) < 400, "the seat came free before the prefetch ended: the test proves nothing"
        got = queued.result().token_ids
        assert reads == ["a0"], f"the adapter file was read {len(reads)} times: {reads}"
        assert reg.state("a0") == "slot"
        first.cancel()
        first.result()
        assert engine.generate([prompt], _greedy(8, "a0"))[0].token_ids == got      # as alone
        assert engine.generate([prompt], _greedy(8))[0].token_ids != got            # the adapter acts


def test_activation_waits_for_a_prefetch_under_way(tiny_engine, tmp_path):
    """At idle the request is scheduled at once while the prefetch started at submit still reads the file: the
    step waits for that read instead of reading the file a second time."""
    art = link_copy(tiny_engine, tmp_path / "art")
    add_adapter(art, write_peft_lora(tmp_path / "peft", read_manifest(art).model, 8, seed=3), "a")
    with Engine.from_artifact(art, enable_prefix_cache=False, spec_max_tokens=0) as engine:
        reg = engine.adapters
        reads = []
        read = reg._load

        def slow(name):                      # a slow disk: the engine thread reaches activate() mid-read
            reads.append(name)
            time.sleep(0.2)
            return read(name)
        reg._load = slow
        out = engine.generate([[5, 6, 7, 8]], _greedy(4, "a"))[0]
        assert len(out.token_ids) == 4 and reads == ["a"]
