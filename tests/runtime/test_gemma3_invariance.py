"""SmolLM2's serving invariances on the real Gemma 3 270M (recipe gemma3-270m): sliding-window layers, the 262k
head, GELU-tanh MLP and the output norms change nothing of what the engine promises.

- batch invariance: each prompt's greedy tokens alone equal its tokens in a mixed batch of 8 and among 8 identical
  prompts longer than a KV block (prefix-cache hits), with and without chunked prefill, on the fp32 and the
  default int8 (QLinear) builds;
- prefix caching past the 512-token window: requests sharing a 600-token prefix reuse its blocks and give the
  tokens they give with the cache off;
- speculative decoding (prompt-lookup drafts): greedy tokens equal plain decoding, alone and batched;
- mixed adapters: three PEFT LoRAs (random, every target) and the base in one batch equal each request alone.

The base model has no chat template: prompts are plain text after <bos>. The builds are the session's (tests/conftest.py
gemma3_engine, shared with tests/pipeline/test_gemma3.py, and gemma3_int8).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams
from tests.conftest import shared_dir

pytestmark = [pytest.mark.slow, pytest.mark.isa_paths]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "import numpy as np\n\nx = np.", "Water boils at",
           "The first president of the United States was", "To make a cup of tea, first"]
# longer than a KV block (16 tokens): identical prompts share its full blocks
LONG = ["apples, pears, cherries, grapes, lemons, oranges, bananas, mangoes.\n"
            "The same list again: apples, pears, cherries,",
            "def total(items):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price\n"
            "    return subtotal\n\n\ndef total_with_tax(items, rate):\n    subtotal = 0\n    for item in items:\n"]


def _greedy(n: int = 24, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def _ids(engine: Engine, text: str) -> list[int]:
    tok = engine.tokenizer
    return ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok.encode(text)


@pytest.fixture(scope="module")
def artifact(gemma3_engine):
    return gemma3_engine


@pytest.fixture(scope="module", params=["fp32", "int8"])
def any_build(request, gemma3_engine, gemma3_int8):
    return gemma3_engine if request.param == "fp32" else gemma3_int8


CHUNK = 32   # max_batch_tokens of the chunked configuration


@pytest.fixture(scope="module")
def alone_reference(any_build) -> tuple[list[list[int]], list[list[int]]]:
    """(PROMPTS' ids, each one's greedy tokens alone), once per build for both configurations below: 8 x 24 steps of
    one row through the 262k head, the bulk of their cost. Each prompt fits in one 32-token step (asserted), so the
    chunked engine runs a lone prompt step for step as the roomy one does."""
    with Engine.from_artifact(any_build, max_num_seqs=8) as engine:
        prompts = [_ids(engine, p) for p in PROMPTS]
        assert max(map(len, prompts)) <= CHUNK, "a prompt alone would be chunked: compute its reference per config"
        return prompts, [engine.generate([p], _greedy())[0].token_ids for p in prompts]


@pytest.mark.parametrize("overrides", [{}, {"max_batch_tokens": CHUNK}], ids=["roomy", "chunked"])
def test_same_tokens_alone_or_in_any_batch(any_build, alone_reference, overrides):
    """The mixed batch prefills its 8 prompts from nothing; the long prompt alone runs in this configuration's own
    engine, and its 8 copies hit the blocks it cached."""
    prompts, alone = alone_reference
    with Engine.from_artifact(any_build, max_num_seqs=8, **overrides) as engine:
        mixed = [o.token_ids for o in engine.generate(prompts, _greedy())]
        long = _ids(engine, LONG[0])
        long_alone = engine.generate([long], _greedy())[0].token_ids
        same = [o.token_ids for o in engine.generate([long] * 8, _greedy())]
        stats = engine.stats()
    for i, (a, m) in enumerate(zip(alone, mixed)):
        assert m == a, f"prompt {i} ({PROMPTS[i]!r}) differs in a mixed batch of 8 from alone"
    assert all(s == long_alone for s in same), "8 identical prompts do not all give the prompt's own tokens"
    assert stats["prefix_cache_hit_rate"] > 0, stats
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"


def test_prefix_cache_past_the_window(gemma3_engine):
    """A shared prefix longer than the sliding window (512): cached blocks hold keys the sliding layers no longer
    read and the global layers still do; outputs equal those with the cache off."""
    rng = np.random.default_rng(5)
    shared = [2] + rng.integers(300, 200000, 599).tolist()
    prompts = [shared + rng.integers(300, 200000, n).tolist() for n in (3, 20, 41)]
    outs = {}
    for cached in (True, False):
        with Engine.from_artifact(gemma3_engine, num_blocks=256, enable_prefix_cache=cached) as engine:
            outs[cached] = [engine.generate([p], _greedy(12))[0].token_ids for p in prompts]
            rate = engine.stats()["prefix_cache_hit_rate"]
        assert (rate > 0.5) if cached else (rate == 0.0), rate
    assert outs[True] == outs[False]


def test_speculative_greedy_equals_plain(artifact):
    with Engine.from_artifact(artifact, max_num_seqs=8, spec_max_tokens=8, spec_max_batch=8) as engine:
        prompts = [_ids(engine, t) for t in LONG + PROMPTS[:3]]
        plain = [engine.generate([p], _greedy(48, speculative=False))[0] for p in prompts]
        alone = [engine.generate([p], _greedy(48))[0] for p in prompts]
        mixed = engine.generate(prompts, _greedy(48))
        stats = engine.stats()
    for i, (p, a, m) in enumerate(zip(plain, alone, mixed)):
        assert a.token_ids == p.token_ids, f"prompt {i}: speculative decoding alone changed the greedy tokens"
        assert m.token_ids == p.token_ids, f"prompt {i}: speculative decoding in a batch changed the greedy tokens"
    assert stats["spec_accepted"] > 0, stats
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"


@pytest.fixture(scope="module")
def adapted(gemma3_engine, tmp_path_factory):
    """A copy of the fp32 Gemma 3 build with three PEFT LoRAs on every target (ranks 4, 8, 16): made once for both
    ops paths under make test (the adapters' files do not depend on the path)."""
    def make(art: Path):
        from ortllm.pipeline.sources import load_model
        from ortllm.runtime.adapter_files import add_adapter
        from tests.reference.peft_lora import make_peft_lora
        peft = tmp_path_factory.mktemp("gemma3-peft")
        shutil.copytree(gemma3_engine, art)
        weights = load_model("gemma3-270m")[1]
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        for k, r in enumerate((4, 8, 16)):
            make_peft_lora(weights, peft / f"ad{k}", seed=40 + k, r=r, targets=targets)
            add_adapter(art, peft / f"ad{k}", f"ad{k}")
    return shared_dir(tmp_path_factory, "gemma3-270m-adapted-ad0-ad2", make)


def test_mixed_adapter_batch_equals_alone(adapted):
    names = [None, "ad0", "ad1", "ad2"]
    jobs = [(p, names[i % len(names)]) for i, p in enumerate(PROMPTS)]
    with Engine.from_artifact(adapted, max_num_seqs=8, max_adapters_per_batch=3) as engine:
        ids = [_ids(engine, p) for p, _ in jobs]
        alone = [engine.generate([p], _greedy(16, adapter=a))[0].token_ids for p, (_, a) in zip(ids, jobs)]
        mixed = engine.generate(ids, [_greedy(16, adapter=a) for _, a in jobs])
        base = [o.token_ids for o in engine.generate(ids, _greedy(16))]
    assert [m.token_ids for m in mixed] == alone
    assert any(a != b for (_, name), a, b in zip(jobs, alone, base) if name is not None), \
        "the adapters should change the outputs"
