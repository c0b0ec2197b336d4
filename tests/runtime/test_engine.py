"""The engine on real artifacts: batched == alone == transformers, seeds, bad input, fault isolation."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.errors import (EmptyPrompt, InvalidSamplingParams, InvalidTokenIds, PromptTooLong,
                                   UnknownAdapter)
from ortllm.runtime.sampling_params import SamplingParams, fit_max_tokens
from tests.reference.hf_llama import hf_greedy_logits

GREEDY16 = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
PROMPT_LENS = (5, 17, 33, 64, 9, 100, 3, 48)


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(3, vocab, n).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_hf, smollm2_engine):
    """transformers greedy continuations of the 8 prompts (fp32)."""
    prompts = _prompts(49152)
    return prompts, [hf_greedy_logits(smollm2_hf, p, 16)[0] for p in prompts]


@pytest.mark.parametrize("overrides", [
    {},                                                             # plenty of room: all 8 at once
    {"max_batch_tokens": 32, "max_num_seqs": 8},                    # chunked prefill
    {"max_batch_tokens": 64, "num_blocks": 14, "max_num_seqs": 8},  # pool too small for all: preemption
], ids=["roomy", "chunked", "preempting"])
def test_concurrent_equals_alone_equals_transformers(smollm2_engine, smollm2_reference, overrides):
    prompts, ref = smollm2_reference
    with Engine.from_artifact(smollm2_engine, **overrides) as engine:
        batched = engine.generate(prompts, GREEDY16)
        stats = engine.stats()
        alone = [engine.generate([p], GREEDY16)[0] for p in prompts[:3]]
    for i, (out, want) in enumerate(zip(batched, ref)):
        assert out.token_ids == want, f"prompt {i} ({len(prompts[i])} tokens) differs from transformers"
    for out, single in zip(batched, alone):
        assert out.token_ids == single.token_ids
    if "num_blocks" in overrides:
        assert stats["preemptions"] > 0, "the small pool was meant to force a preemption"
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"


def test_same_seed_same_text_whatever_the_batch(tiny_engine):
    sampled = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    prompts = _prompts(512)
    with Engine.from_artifact(tiny_engine, num_blocks=128) as engine:
        alone = engine.generate([prompts[0]], sampled)[0]
        crowd = engine.generate([prompts[3], prompts[0], prompts[5]],
                                [SamplingParams(max_tokens=20, temperature=1.0, seed=9), sampled,
                                 SamplingParams(max_tokens=5, temperature=0.0)])
    assert crowd[1].token_ids == alone.token_ids
    assert crowd[1].text == alone.text


def test_streamed_equals_non_streamed(tiny_engine):
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        whole = engine.generate(["hello world"], GREEDY16)[0].text
        streamed = "".join(engine.stream("hello world", GREEDY16))
    assert streamed == whole


def test_many_threads_identical_greedy(tiny_engine):
    results: list[str] = []
    with Engine.from_artifact(tiny_engine, num_blocks=128) as engine:
        def worker():
            results.append(engine.generate(["the same prompt"], GREEDY16)[0].text)
        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(results) == 6 and len(set(results)) == 1


def test_fit_max_tokens_is_the_one_rule():
    assert fit_max_tokens(10, 100, 64) == 54            # capped to the room left
    assert fit_max_tokens(10, 8, 64) == 8               # fits: unchanged
    assert fit_max_tokens(10, None, 64) == 54           # not given: all of the room
    assert fit_max_tokens(63, 100, 64) == 1
    with pytest.raises(PromptTooLong, match="prompt has 64 tokens but at most 63 fit .max_model_len."):
        fit_max_tokens(64, 1, 64, "max_model_len")


def test_max_tokens_past_the_context_is_capped(tiny_engine):
    """The one rule (runtime.sampling_params.fit_max_tokens), as the service and the batch job apply it: max_tokens
    past the context is capped to the room left; a prompt that leaves no room is PromptTooLong."""
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        out = engine.generate([list(range(3, 503))], SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
        assert len(out[0].token_ids) == 12 and out[0].finish_reason == "length"
        with pytest.raises(PromptTooLong, match="512 tokens.*511"):      # ids in the vocabulary (512): checked first
            engine.submit([3 + i % 500 for i in range(512)], GREEDY16)


def test_max_tokens_past_max_model_len_is_capped(tiny_engine):
    """Regression: Engine.submit capped max_tokens to the context length only, so a smaller max_model_len
    reached the scheduler's PromptTooLong instead of the one context rule (fit_max_tokens)."""
    with Engine.from_artifact(tiny_engine, num_blocks=64, max_model_len=256) as engine:
        out = engine.generate([list(range(3, 203))], SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
        assert len(out[0].token_ids) == 56 and out[0].finish_reason == "length"


def test_bad_requests_are_typed_errors_before_scheduling(tiny_engine):
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        with pytest.raises(EmptyPrompt):
            engine.submit([], GREEDY16)
        with pytest.raises(PromptTooLong, match="600 tokens.*511"):
            engine.submit([3 + i % 500 for i in range(600)], GREEDY16)
        with pytest.raises(InvalidSamplingParams, match="max_tokens"):
            engine.submit("hi", SamplingParams(max_tokens=0))
        with pytest.raises(InvalidSamplingParams, match="top_p"):
            engine.submit("hi", SamplingParams(top_p=1.5))
        with pytest.raises(UnknownAdapter, match="nope"):
            engine.submit("hi", SamplingParams(adapter="nope"))
        with pytest.raises(InvalidTokenIds, match="512"):
            engine.submit([1, 2, 99999], GREEDY16)
        assert engine.stats()["waiting"] == 0 and engine.stats()["running"] == 0
        assert engine.generate(["still fine"], GREEDY16)[0].finish_reason == "length"


def test_failed_run_fails_only_its_step(tiny_engine):
    """A real ONNX Runtime error (a block id past the pool, caught by PagedAttention's bounds check) in one
    step: that step's requests end with "error", their blocks are freed, and the engine keeps serving."""
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        real_execute = engine.runner.execute
        armed = [True]

        def execute_with_bad_block(seqs, *a, **k):
            if armed[0]:
                armed[0] = False
                seqs[0].block_ids = [10 ** 6]
            return real_execute(seqs, *a, **k)

        engine.runner.execute = execute_with_bad_block
        failed = engine.generate(["this step fails"], GREEDY16)[0]
        assert failed.finish_reason == "error" and "block" in failed.error
        ok = engine.generate(["the next one runs"], GREEDY16)[0]
        assert ok.finish_reason == "length" and len(ok.token_ids) == 16
        stats = engine.stats()
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_stop_string_and_cancel(tiny_engine):
    with Engine.from_artifact(tiny_engine, num_blocks=64) as engine:
        free = engine.generate(["abc"], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
        assert len(free.text) > 4
        stop = free.text[2:4]
        cut = engine.generate(["abc"], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                      stop=[stop]))[0]
        assert cut.finish_reason == "stop" and cut.text == free.text[:free.text.index(stop)]
        h = engine.submit("abc", SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
        h.cancel()
        assert h.result(60).finish_reason == "cancelled"


def test_prefix_cache_shares_blocks_without_changing_outputs(tiny_engine):
    """Requests with a common 70-token prefix: later ones reuse its full KV blocks (hit rate > 0), and
    every output equals the one computed with the prefix cache off."""
    rng = np.random.default_rng(11)
    shared = rng.integers(3, 512, 70).tolist()
    prompts = [shared + rng.integers(3, 512, n).tolist() for n in (3, 9, 17)]
    outs = {}
    for cached in (True, False):
        with Engine.from_artifact(tiny_engine, num_blocks=64, enable_prefix_cache=cached) as engine:
            outs[cached] = [engine.generate([p], GREEDY16)[0].token_ids for p in prompts]
            rate = engine.stats()["prefix_cache_hit_rate"]
        assert (rate > 0.3) if cached else (rate == 0.0), rate
    assert outs[True] == outs[False]
