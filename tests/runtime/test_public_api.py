"""The Python interface of docs/architecture.md (Interfaces), used as a user would, on the real SmolLM2 artifact."""
from __future__ import annotations

import threading


def test_engine_api_from_the_package(smollm2_engine):
    from ortllm.runtime import Engine, SamplingParams

    with Engine.from_artifact(smollm2_engine, max_num_seqs=8) as engine:
        outs = engine.generate(["The capital of France is", "1, 2, 3,"], SamplingParams(max_tokens=8, temperature=0))
        assert [o.finish_reason for o in outs] == ["length", "length"] and "Paris" in outs[0].text
        streamed = "".join(engine.stream("The capital of France is", SamplingParams(max_tokens=8, temperature=0)))
        assert streamed == outs[0].text
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            engine.submit("1, 2, 3,", SamplingParams(max_tokens=8, temperature=0)).result(60).text)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [outs[1].text] * 4
        stats = engine.stats()
        assert stats["tokens_generated"] >= 48 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
