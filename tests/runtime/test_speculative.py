"""Speculative decoding (prompt-lookup drafts) on the real SmolLM2: the same tokens as plain decoding.

Greedy: verified tokens equal plain decoding token for token, on fp32 and int4 (QLinear) artifacts, alone and
in a mixed batch; this needs batch invariance (a row verified with k + 1 query tokens gives the logits it gives
alone). Sampling: a draw per kept token from the request's generator, so a seeded request gets the same tokens
with speculation as without. Stop strings, logprobs, max_tokens, streaming, n > 1, adapters, guided rows.
"""
from __future__ import annotations


import numpy as np
import pytest

from ortllm.bench.speculative import GROUNDED, OPEN
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampler import sample_from_probs
from ortllm.runtime.sampling_params import Guide, SamplingParams
from tests.artifact_copies import linked_copy

pytestmark = pytest.mark.isa_paths   # on every path tests/conftest.py isa_paths() names


def _chat(engine: Engine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def _greedy(n=96, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


@pytest.fixture(scope="module", params=["fp32", "int4-b32"])
def artifact(request, smollm2_engine, smollm2_quantized):
    return smollm2_engine if request.param == "fp32" else smollm2_quantized(request.param)


@pytest.mark.slow
def test_greedy_tokens_equal_plain_decoding(artifact):
    """Plain decoding runs the prompts as one batch: a row's greedy tokens are the same alone or in any batch
    (tests/runtime/test_batch_invariance.py, on these builds), and one batch of 8 is ~8x fewer steps than 8 prompts one
    by one on the fp32 build, whose steps read 540 MB of weights each."""
    with Engine.from_artifact(artifact, max_num_seqs=8, spec_max_tokens=8, spec_max_batch=8) as engine:
        prompts = [_chat(engine, t) for t in GROUNDED + OPEN]
        plain = engine.generate(prompts, _greedy(speculative=False))
        assert engine.stats()["spec_drafted"] == 0, "speculative=False still drafted"
        alone = [engine.generate([p], _greedy())[0] for p in prompts]
        mixed = engine.generate(prompts, _greedy())
        stats = engine.stats()
    for i, (p, a, m) in enumerate(zip(plain, alone, mixed)):
        assert a.token_ids == p.token_ids, f"prompt {i}: speculative decoding alone changed the greedy tokens"
        assert m.token_ids == p.token_ids, f"prompt {i}: speculative decoding in a batch changed the greedy tokens"
        assert a.text == p.text and a.finish_reason == p.finish_reason
    assert stats["spec_accepted"] > 0.5 * stats["spec_drafted"] > 0, stats
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"


@pytest.mark.slow
def test_sampled_tokens_equal_with_the_same_seed(smollm2_engine):
    params = dict(max_tokens=64, temperature=0.8, top_p=0.95, seed=11, logprobs=2, frequency_penalty=0.3)
    with Engine.from_artifact(smollm2_engine, spec_max_tokens=8) as engine:
        prompts = [_chat(engine, t) for t in GROUNDED[:3]]
        off = engine.generate(prompts, SamplingParams(**params, speculative=False))
        on = engine.generate(prompts, SamplingParams(**params))
        again = engine.generate(prompts, SamplingParams(**params))
        assert engine.stats()["spec_accepted"] > 0
    for a, b, c in zip(off, on, again):
        assert a.token_ids == b.token_ids == c.token_ids
        assert [x.token_id for x in b.logprobs] == [x.token_id for x in a.logprobs]
        assert np.allclose([x.logprob for x in a.logprobs], [x.logprob for x in b.logprobs], atol=1e-5)


def test_drafted_rows_draw_like_plain_rows():
    """sample_from_probs with drafts: rows after a rejected draft draw nothing, so the generator is where
    plain decoding leaves it after the kept tokens."""
    probs = np.random.default_rng(0).random((4, 50))
    g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
    first = int(sample_from_probs(probs[:1], [g1])[0])
    toks = sample_from_probs(probs, [g2] * 4, [first, (first + 1) % 50, 3, -1])
    assert toks[0] == first and toks[1] >= 0 and list(toks[2:]) == [-1, -1]
    assert int(sample_from_probs(probs[1:2], [g1])[0]) == toks[1]
    assert g1.random() == g2.random()


@pytest.mark.slow
def test_stop_strings_max_tokens_logprobs_streaming_n(smollm2_engine):
    with Engine.from_artifact(smollm2_engine, spec_max_tokens=8) as engine:
        prompt = _chat(engine, GROUNDED[2])
        full = engine.generate([prompt], _greedy(speculative=False))[0].text
        stop = full[len(full) // 2:len(full) // 2 + 6]
        for kw in ({"stop": [stop]}, {"max_tokens": 13}, {"logprobs": 3}, {"max_tokens": 40, "ignore_eos": True}):
            p = {**dict(max_tokens=96, temperature=0.0), **kw}
            off = engine.generate([prompt], SamplingParams(**p, speculative=False))[0]
            on = engine.generate([prompt], SamplingParams(**p))[0]
            assert (on.token_ids, on.text, on.finish_reason) == (off.token_ids, off.text, off.finish_reason), kw
            if "logprobs" in kw:
                assert [x.token_id for x in on.logprobs] == [x.token_id for x in off.logprobs]
                assert np.allclose([x.logprob for x in on.logprobs], [x.logprob for x in off.logprobs], atol=1e-5)
        h = engine.submit(prompt, _greedy())
        deltas = list(h)
        assert "".join(deltas) == h.result().text == full
        assert len(deltas) < len(h.result().token_ids), "no delta carried several tokens"
        hs = engine.submit_n(prompt, _greedy(), n=3)
        assert all(x.result().text == full for x in hs)
        stats = engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.slow
def test_adapter_and_guided_rows(smollm2_engine, tmp_path):
    from ortllm.runtime.adapter_files import add_adapter
    from ortllm.pipeline.sources import load_model
    from tests.reference.peft_lora import make_peft_lora

    art = linked_copy(smollm2_engine, tmp_path / "art")       # 0.5 GB of weights: links, not a copy
    make_peft_lora(load_model("smollm2-135m-instruct")[1], tmp_path / "lora", seed=1, r=8,
                   targets=["q_proj", "v_proj"])
    add_adapter(art, tmp_path / "lora", "ad")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "rooms": {"type": "integer"}},
              "required": ["name", "rooms"]}
    with Engine.from_artifact(art, spec_max_tokens=8) as engine:
        prompts = [_chat(engine, t) for t in GROUNDED[:2]]
        for kw in ({"adapter": "ad"}, {"guide": Guide("json_schema", schema)}):
            off = engine.generate(prompts, _greedy(64, speculative=False, **kw))
            before = engine.stats()
            on = engine.generate(prompts, _greedy(64, **kw))
            drafted, forced = (engine.stats()[k] - before[k] for k in ("spec_drafted", "forced_drafted"))
            assert [o.token_ids for o in on] == [o.token_ids for o in off], kw
            # adapter rows get prompt-lookup drafts; guided rows only their grammar's forced tokens (test_guided)
            assert (drafted > 0, forced > 0) == (("adapter" in kw), ("guide" in kw)), kw
