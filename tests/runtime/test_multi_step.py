"""Multi-step decoding (SchedulerConfig.decode_steps) on the real SmolLM2: the tokens of single steps.

Each chained step is the graph run a single decode step makes, its input ids the previous step's logits_argmax
(the first maximum of the same logits), so greedy tokens equal single steps' token for token, on fp32 and int4
artifacts, alone and in a batch whose requests end at different steps; stop token ids, stop strings, max_tokens
and EOS end them where single steps do; streamed text is the same text; every block comes back.
"""
from __future__ import annotations

import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

TEXTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
         "Explain what a CPU cache is in one sentence."]


def _chat(engine: Engine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


@pytest.fixture(scope="module", params=["fp32", "int4-b32"])
def artifact(request, smollm2_engine, smollm2_quantized):
    return smollm2_engine if request.param == "fp32" else smollm2_quantized(request.param)


@pytest.mark.slow
def test_greedy_tokens_equal_single_steps(artifact):
    kw = dict(max_num_seqs=8, spec_max_tokens=0)
    with Engine.from_artifact(artifact, decode_steps=1, **kw) as one:
        prompts = [_chat(one, t) for t in TEXTS]
        full = [one.generate([p], SamplingParams(max_tokens=60, temperature=0.0))[0] for p in prompts]
        ids = full[0].token_ids
        first = next(i for i in range(5, len(ids)) if ids[i] not in ids[:i])   # new at index >= 5: stops there
        # per request: a stop token id from its own output, a stop string from its text, max_tokens ending
        # inside a window of 4 steps, and EOS (the plain run)
        params = [SamplingParams(max_tokens=60, temperature=0.0, stop_token_ids=[ids[first]]),
                  SamplingParams(max_tokens=60, temperature=0.0, stop=[full[1].text[20:26]]),
                  SamplingParams(max_tokens=13, temperature=0.0),
                  SamplingParams(max_tokens=60, temperature=0.0)]
        single = [one.generate([p], q)[0] for p, q in zip(prompts, params)]
        assert one.stats()["chained_steps"] == 0
    with Engine.from_artifact(artifact, decode_steps=4, **kw) as multi:
        alone = [multi.generate([p], q)[0] for p, q in zip(prompts, params)]
        batch = multi.generate(prompts, params)
        handle = multi.submit(prompts[3], params[3])
        streamed = "".join(handle)
        stats = multi.stats()
    for i, (s, a, b) in enumerate(zip(single, alone, batch)):
        assert a.token_ids == s.token_ids and b.token_ids == s.token_ids, f"request {i}: tokens changed"
        assert a.text == s.text == b.text and a.finish_reason == s.finish_reason == b.finish_reason, i
    assert [s.finish_reason for s in single] == ["stop", "stop", "length", full[3].finish_reason]
    assert len(single[0].token_ids) == first and len(single[2].token_ids) == 13
    assert streamed == single[3].text == handle.result().text
    assert stats["chained_steps"] > 0.5 * stats["steps"], stats      # most decode steps were chained
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"
