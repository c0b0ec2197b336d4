"""Batch invariance end to end: on fp32, int8 and int4 SmolLM2 artifacts (QLinear for the quantized ones), the
greedy tokens of each prompt are the same alone, among 16 identical prompts (prefix-cache hits) and among 16
different ones, with and without chunked prefill.

The alone runs (one sequence in the engine: 16 x 40 batch-1 steps, most of the cost) are made once per artifact and
are the reference of both configurations: each chat prompt fits in one 64-token step (asserted), so an engine that
chunks prefill at 64 tokens runs a lone prompt step for step as the roomy one does. The batched runs go through each
configuration's own engine: the mixed batch prefills all 16 prompts from nothing (in 64-token chunks in the chunked
one), and the 16 identical prompts then hit the blocks the mixed batch cached.

Before QLinear, the int4 artifact (MatMulNBits) diverged after ~20 tokens between a batch of 1 and of 16: its
kernel takes other code paths for other row counts. QLinear computes every output with the same operations
whatever the batch (custom_ops/src/kernels/qlinear.h).
"""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
             "Explain gravity to a child.", "Translate 'good morning' into Spanish.", "Why is the sky blue?",
             "Name a famous painter and one of their works.", "What is 12 times 13?",
             "Give me a short tip for learning to cook.", "Describe a cat in one sentence.",
             "What does a compiler do?", "Suggest a name for a red bicycle.", "How many legs does a spider have?",
             "What is the boiling point of water?", "Tell me a fun fact about octopuses.",
             "Summarize the plot of Cinderella in two sentences."]


def _chat(engine: Engine, question: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]))


@pytest.fixture(scope="module", params=["fp32", "int8", "int4-b32"])
def artifact(request, smollm2_engine, smollm2_quantized):
    return smollm2_engine if request.param == "fp32" else smollm2_quantized(request.param)


CHUNK = 64   # max_batch_tokens of the chunked configuration


@pytest.fixture(scope="module")
def alone_reference(artifact) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, each prompt's greedy tokens alone): the reference of both configurations (module docstring)."""
    with Engine.from_artifact(artifact, max_num_seqs=16) as engine:
        prompts = [_chat(engine, q) for q in QUESTIONS]
        assert max(map(len, prompts)) <= CHUNK, "a prompt alone would be chunked: compute its reference per config"
        return prompts, [engine.generate([p], GREEDY)[0].token_ids for p in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, {"max_batch_tokens": CHUNK}], ids=["roomy", "chunked"])
def test_same_tokens_alone_or_in_any_batch(artifact, alone_reference, overrides):
    prompts, alone = alone_reference
    with Engine.from_artifact(artifact, max_num_seqs=16, **overrides) as engine:
        mixed = [o.token_ids for o in engine.generate(prompts, GREEDY)]
        same = [o.token_ids for o in engine.generate([prompts[0]] * 16, GREEDY)]
        stats = engine.stats()
    for i, (a, m) in enumerate(zip(alone, mixed)):
        assert m == a, f"prompt {i} ({QUESTIONS[i]!r}) differs in a mixed batch of 16 from alone"
    assert all(s == alone[0] for s in same), "16 identical prompts do not all give the prompt's own tokens"
    assert stats["prefix_cache_hit_rate"] > 0, stats
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"


def test_the_graphs_argmax_is_numpys_argmax_of_the_logits(artifact, monkeypatch):
    """Every engine graph gives logits_argmax (int8 / int4: found by the LM head's QLinear; fp32: an ArgMax node),
    equal to np.argmax of the step's logits rows: what plain greedy rows take as their tokens."""
    with Engine.from_artifact(artifact, max_num_seqs=4) as engine:
        runner, seen = engine.runner, []
        execute = runner.execute

        def recording(*args, **kwargs):
            logits = execute(*args, **kwargs)
            seen.append((logits.copy(), None if runner.argmax is None else runner.argmax.copy()))
            return logits

        monkeypatch.setattr(runner, "execute", recording)
        outs = engine.generate([_chat(engine, q) for q in QUESTIONS[:4]],
                               SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in outs)
    assert seen and all(am is not None for _, am in seen)
    for logits, am in seen:
        np.testing.assert_array_equal(am, np.argmax(logits, axis=1))
