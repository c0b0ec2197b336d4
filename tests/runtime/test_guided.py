"""Structured output in the engine (runtime/guided.py) on the real SmolLM2: the masks of drafted rows, and the
grammar's forced tokens verified as drafts — the same tokens and logprobs as one step per token, in fewer steps."""
from __future__ import annotations

import json
import time

import jsonschema
import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.guided import GuidedDecoding, forced_tokens, unpack_mask
from ortllm.runtime.sampling_params import Guide, SamplingParams

# long fixed keys and an enum: most of the output is forced by the grammar
ORDER = {"type": "object", "additionalProperties": False,
         "required": ["customer_full_name", "customer_shipping_address", "order_priority_level"],
         "properties": {
             "customer_full_name": {"type": "string", "maxLength": 20},
             "customer_shipping_address": {
                 "type": "object", "additionalProperties": False,
                 "required": ["street_name_and_number", "postal_code_of_city"],
                 "properties": {"street_name_and_number": {"type": "string", "maxLength": 30},
                                "postal_code_of_city": {"type": "string", "maxLength": 8}}},
             "order_priority_level": {"enum": ["standard_delivery", "express_delivery"]}}}


def _chat(engine: Engine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


@pytest.mark.slow
def test_draft_masks_equal_step_by_step_masks(smollm2_engine):
    """fill_masks with drafts: row j of a drafted matcher is the mask after its first j drafts, rows of matchers
    without drafts stay in place, and the matchers are left where they were."""
    from ortllm.runtime.contract import TOKENIZER
    from ortllm.runtime.tokenizer import Tokenizer

    vocab = Tokenizer.from_dir(smollm2_engine).vocab_size
    gd = GuidedDecoding(smollm2_engine / TOKENIZER, vocab, [2])
    a, b = gd.compile(Guide("json_schema", ORDER)), gd.compile(Guide("regex", "[0-9]{3}"))
    drafts = forced_tokens(a)
    assert len(drafts) >= 4, "the schema's first key should be forced"
    words = gd.fill_masks([b, a], [[], drafts])
    assert words.shape == (1 + len(drafts) + 1, gd.words)
    assert forced_tokens(a) == drafts                                  # a was rolled back
    want = [gd.fill_masks([b])[0]]
    for t in drafts:
        want.append(gd.fill_masks([a])[0])
        a.consume_token(t)
    want.append(gd.fill_masks([a])[0])
    assert np.array_equal(words, np.stack(want))
    # along the forced key every mask allows exactly the forced token
    assert all(np.flatnonzero(unpack_mask(w, vocab)).tolist() == [t] for w, t in zip(words[1:], drafts))


def _idle_stats(engine: Engine, timeout: float = 5.0) -> dict:
    """Stats once the engine is idle: a request the grammar ended frees its blocks at the next schedule()."""
    end = time.monotonic() + timeout
    while engine.scheduler.has_unfinished_requests() and time.monotonic() < end:
        time.sleep(0.01)
    return engine.stats()


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_p=0.95, seed=5)],
                         ids=["greedy", "seeded"])
def test_forced_tokens_cost_no_steps_and_change_nothing(smollm2_engine, sampling):
    """speculative=False: one model step per token. On: the forced tokens ride along as drafts of the next step.
    Same tokens, text, finish and logprobs, alone and two guided rows beside an unguided one in one batch;
    far fewer steps."""
    with Engine.from_artifact(smollm2_engine) as engine:
        prompts = [_chat(engine, "Make up an order as JSON."), _chat(engine, "An express order for Ann, JSON.")]
        free = _chat(engine, "Say hello.")

        def params(guided: bool, on: bool) -> SamplingParams:
            return SamplingParams(max_tokens=120, logprobs=2, speculative=on, **sampling,
                                  guide=Guide("json_schema", ORDER) if guided else None)

        def steps_of(fn):
            before = engine.stats()["steps"]
            return fn(), engine.stats()["steps"] - before

        off, steps_off = steps_of(lambda: [engine.generate([p], params(True, False))[0] for p in prompts])
        on, steps_on = steps_of(lambda: [engine.generate([p], params(True, True))[0] for p in prompts])
        batch = engine.generate(prompts + [free], [params(True, True)] * 2 + [params(False, True)])
        stats = _idle_stats(engine)
    for a, b, c in zip(off, on, batch):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.text == b.text == c.text and a.finish_reason == b.finish_reason == c.finish_reason == "stop"
        jsonschema.validate(json.loads(b.text), ORDER)
        for x in (b, c):
            assert [e.token_id for e in x.logprobs] == [e.token_id for e in a.logprobs]
            assert np.allclose([e.logprob for e in x.logprobs], [e.logprob for e in a.logprobs], atol=1e-5)
    tokens = sum(len(o.token_ids) for o in off)
    assert steps_off == tokens, "one step per token without drafts"
    assert steps_on <= 0.6 * steps_off, (steps_on, steps_off)
    assert stats["forced_accepted"] > 0 and stats["spec_drafted"] == 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"
