"""Batch invariance and speculative decoding at long context, end to end on the real SmolLM2.

A grounded prompt of ~1300 tokens (six of PagedAttention's 256-key parts, and past the 1024 keys from which it
used to split a lone row's keys across the pool): its greedy tokens and their logprobs are the same with
speculative decoding off and on (verified rows are rows of a multi-token tile), alone and in a batch of 8
(a lone row's keys are split across the pool, a batch's are not), with the prompt prefilled in chunks of
max_batch_tokens. Before the keys of every row were cut at the same fixed boundaries
(custom_ops/README.md, "Batch invariance"), these paths reduced a long row's softmax in different orders.
"""
from __future__ import annotations

import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

CITIES = ["Busan", "Lisbon", "Oslo", "Quito", "Lagos", "Hanoi", "Perth", "Tunis", "Porto", "Cusco"]
PLANS = ["free", "pro", "team"]
RECORDS = "\n".join(f"id {i}: {CITIES[i * 7 % 10]}, plan {PLANS[i % 3]}, {100 + i * 37 % 900} credits"
                    for i in range(110))
LONG_PROMPT = f"Here are the account records:\n\n{RECORDS}\n\nRepeat the last twelve records exactly, one per line."
SHORT = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
         "Why is the sky blue?", "What is 12 times 13?", "Describe a cat in one sentence.",
         "What does a compiler do?"]


def _chat(engine: Engine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def _greedy(**kw):
    return SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, logprobs=1, **kw)


def _seen(out):
    return out.token_ids, [x.logprob for x in out.logprobs]


@pytest.fixture(scope="module", params=["fp32", "int4-b32", "kv-fp16", "kv-int8", "kv-int4"])
def artifact(request, smollm2_engine, smollm2_quantized):
    return smollm2_engine if request.param == "fp32" else smollm2_quantized(request.param)


@pytest.mark.slow
def test_long_prompt_same_tokens_and_logprobs_alone_in_a_batch_and_speculative(artifact):
    with Engine.from_artifact(artifact, max_num_seqs=8, spec_max_tokens=8) as engine:
        prompt = _chat(engine, LONG_PROMPT)
        assert len(prompt) > 1100, len(prompt)
        plain = engine.generate([prompt], _greedy(speculative=False))[0]
        spec = engine.generate([prompt], _greedy())[0]
        drafted = engine.stats()["spec_drafted"]
        others = [_chat(engine, q) for q in SHORT]
        batch = engine.generate(others[:4] + [prompt] + others[4:], _greedy(speculative=False))
        stats = engine.stats()
    assert drafted > 0, "no draft was verified: the speculative path was not exercised"
    assert _seen(spec) == _seen(plain), "speculative decoding changed the long prompt's tokens or logprobs"
    assert _seen(batch[4]) == _seen(plain), "the long prompt in a batch of 8 differs from alone"
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"
