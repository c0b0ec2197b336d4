"""Embeddings: pooled final hidden states (the graph's hidden_states output) as prefill-only rows of the same
continuous batches as generation.

- the scheduler (no model): an embedding request runs its prompt in chunks, never samples, finishes "stop" after
  its last chunk with its KV blocks freed; mean pooling takes no prefix-cache hits, last-token pooling may;
- the engine on real artifacts: the same vector bit for bit alone, in a batch of other embeddings, beside
  generation and with chunked prefill (fp32, int8 and int4 SmolLM2 builds); the fp32 build against transformers'
  mean-pooled (and last-token) final hidden states; paraphrases closer than unrelated sentences.
"""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.errors import EmptyPrompt, InvalidSamplingParams, PromptTooLong
from ortllm.runtime.pooling import normalize, pool
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.runtime.scheduler import ModelRunnerOutput

from .test_scheduler import fake_runner, make

EMBED = SamplingParams(max_tokens=1, pooling="mean")


# ---------------------------------------------------------------- scheduler, no model

def run_to_end(sched, limit=200):
    """Step until nothing is left; returns every (SchedulerOutput, updates)."""
    steps = []
    while sched.has_unfinished_requests() and len(steps) < limit:
        out = sched.schedule()
        steps.append((out, sched.update_from_output(out, fake_runner(out))))
    assert not sched.has_unfinished_requests()
    return steps


def test_an_embedding_request_is_prefill_only_and_frees_its_blocks():
    sched = make(max_batch_tokens=8, block_size=4, num_blocks=32)
    sched.add_request("e", list(range(1, 21)), EMBED)                        # 20 tokens: 3 chunks of <= 8
    sched.add_request("g", [5, 6, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    steps = run_to_end(sched)
    chunks = [s for out, _ in steps for s in out.seqs if s.req_id == "e"]
    assert sum(s.num_tokens for s in chunks) == 20
    assert all(not s.needs_logits and s.hidden_rows == s.num_tokens for s in chunks)   # mean: every row
    assert [s.start_pos for s in chunks] == [0, *np.cumsum([s.num_tokens for s in chunks])[:-1].tolist()]
    ends = [u for _, ups in steps for u in ups if u.req_id == "e"]
    assert [(u.new_token_ids, u.finish_reason) for u in ends] == [([], "stop")]
    gen = [t for _, ups in steps for u in ups if u.req_id == "g" for t in u.new_token_ids]
    assert len(gen) == 6                                                     # generation beside it is untouched
    assert sched.pool.num_free == sched.pool.num_usable


def test_last_token_pooling_keeps_only_the_last_row():
    sched = make(max_batch_tokens=8, block_size=4)
    sched.add_request("e", list(range(1, 13)), SamplingParams(max_tokens=1, pooling="last"))
    chunks = [s for out, _ in run_to_end(sched) for s in out.seqs]
    assert [s.hidden_rows for s in chunks] == [0, 1]
    assert not any(s.needs_logits for s in chunks)


def test_mean_pooling_takes_no_prefix_hits_last_token_pooling_does():
    prompt = list(range(1, 17))
    for pooling, hits in (("mean", 0), ("last", 12)):
        sched = make(max_batch_tokens=64, block_size=4)
        sched.add_request("warm", prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        run_to_end(sched)
        sched.add_request("e", prompt, SamplingParams(max_tokens=1, pooling=pooling))
        first = sched.schedule()
        assert first.seqs[0].start_pos == hits, pooling
        sched.update_from_output(first, ModelRunnerOutput({}))
        assert sched.pool.num_free == sched.pool.num_usable


def test_an_embedding_may_fill_the_whole_context():
    """No room for a generated token is needed: a prompt of exactly the capacity is taken, one more is not."""
    sched = make(block_size=4, num_blocks=9, prefix=False)                   # 8 usable blocks: 32 tokens
    sched.add_request("fits", list(range(1, 33)), EMBED)
    with pytest.raises(PromptTooLong):
        sched.add_request("long", list(range(1, 34)), EMBED)
    run_to_end(sched)


def test_embeddings_and_generations_under_preemption_all_finish_and_free_their_blocks():
    """A pool too small for everything at once: sequences are preempted and recomputed, embeddings included; each
    embedding still runs every prompt row before it finishes, and nothing leaks."""
    sched = make(max_batch_tokens=32, block_size=4, num_blocks=12, prefix=False)
    for i in range(4):
        sched.add_request(f"g{i}", [7 + i] * 6, SamplingParams(max_tokens=12, ignore_eos=True))
        sched.add_request(f"e{i}", list(range(1, 15 + i)), EMBED)
    steps = run_to_end(sched, limit=500)
    assert sched.num_preemptions > 0
    for i in range(4):
        rows = [s for out, _ in steps for s in out.seqs if s.req_id == f"e{i}"]
        covered = set()
        for s in rows:
            covered |= set(range(s.start_pos, s.start_pos + s.num_tokens))
        assert covered == set(range(14 + i)) and rows[-1].start_pos + rows[-1].num_tokens == 14 + i
    ended = {u.req_id: u.finish_reason for _, ups in steps for u in ups if u.finish_reason}
    assert ended == {**{f"g{i}": "length" for i in range(4)}, **{f"e{i}": "stop" for i in range(4)}}
    assert sched.pool.num_free == sched.pool.num_usable


def test_pooling_is_checked():
    with pytest.raises(InvalidSamplingParams, match="pooling must be one of mean, last"):
        SamplingParams(pooling="cls").validate()


def test_pool_and_normalize():
    h = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(pool(h, "mean"), h.mean(0))
    np.testing.assert_array_equal(pool(h, "last"), h[-1])
    v = normalize(np.array([3.0, 4.0, 12.0], np.float32))
    np.testing.assert_allclose(v, [3 / 13, 4 / 13, 12 / 13], rtol=1e-6)
    np.testing.assert_allclose(normalize(np.array([3.0, 4.0, 12.0]), 2), [0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(normalize(np.zeros(3)), np.zeros(3))


# ---------------------------------------------------------------- engine, real artifacts

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "def add(a, b):\n    return a + b",
         "Photosynthesis turns light into chemical energy.", "I would like a cup of tea, please.",
         "The stock market fell sharply on Monday."]
LONG = " ".join(TEXTS * 6)          # ~150 tokens: several chunks at max_batch_tokens=64


def test_embed_on_the_tiny_engine(tiny_engine):
    with Engine.from_artifact(tiny_engine) as engine:
        v = engine.embed(TEXTS)
        assert v.shape == (len(TEXTS), engine.runner.hidden_size) and v.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-6)
        raw = engine.embed(TEXTS[0], normalize=False)
        np.testing.assert_array_equal(normalize(raw)[0], v[0])
        ids = engine.tokenizer.encode(TEXTS[1], add_special_tokens=True)
        np.testing.assert_array_equal(engine.embed([ids])[0], v[1])          # token ids: the same as the text
        with pytest.raises(EmptyPrompt):
            engine.embed([[]])
        with pytest.raises(PromptTooLong, match="shorten the prompt"):
            engine.embed([[1] * (engine.context_length + 1)])
        handles = [engine.submit_embed([1 + i] * engine.context_length) for i in range(32)]
        for h in handles:
            h.cancel()
        outs = [h.result(timeout=60) for h in handles]
        assert "cancelled" in {o.finish_reason for o in outs}          # those still queued or running, at least
        assert all((o.finish_reason == "cancelled") == (o.embedding is None) for o in outs)
        with pytest.raises(InvalidSamplingParams):
            engine.embed("x", pooling="cls")
        stats = engine.stats()
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.fixture(scope="module", params=["fp32", "int8", "int4-b32"])
def artifact(request, smollm2_engine, smollm2_quantized):
    return smollm2_engine if request.param == "fp32" else smollm2_quantized(request.param)


def test_the_same_vector_alone_or_in_any_batch(artifact):
    """Bit for bit: each text alone; all together; each beside 8 generations; and with chunked prefill (64-token
    steps: the long text is split into other chunks, and the short ones share steps with its chunks)."""
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    texts = TEXTS + [LONG]
    with Engine.from_artifact(artifact, max_num_seqs=16) as engine:
        alone = np.stack([engine.embed(t)[0] for t in texts])
        together = engine.embed(texts)
        gens = [engine.submit(t, greedy) for t in TEXTS + TEXTS[:2]]
        beside = engine.embed(texts)
        gen_tokens = [h.result().token_ids for h in gens]
        last_alone = engine.embed(LONG, pooling="last")
        stats = engine.stats()
    with Engine.from_artifact(artifact, max_num_seqs=16, max_batch_tokens=64) as engine:
        chunked = engine.embed(texts)
        last_chunked = engine.embed(texts, pooling="last")[-1]
        gen_chunked = [o.token_ids for o in engine.generate(TEXTS + TEXTS[:2], greedy)]
    for name, got in (("together", together), ("beside generation", beside), ("chunked", chunked)):
        for i in range(len(texts)):
            np.testing.assert_array_equal(got[i], alone[i], err_msg=f"text {i} {name}")
    np.testing.assert_array_equal(last_chunked, last_alone[0])
    assert gen_tokens == gen_chunked          # the generations beside the embeddings are their own tokens
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "blocks leaked"


def test_mean_pooled_hidden_states_match_transformers(smollm2_engine, smollm2_hf):
    """fp32: the engine's pooled final hidden states (after the final norm) against transformers' on our tokens."""
    import torch

    with Engine.from_artifact(smollm2_engine) as engine:
        ids = [engine.tokenizer.encode(t, add_special_tokens=True) for t in TEXTS + [LONG]]
        mean, last = engine.embed(ids), engine.embed(ids, pooling="last")
        raw = engine.embed(ids, normalize=False)
    for i, seq in enumerate(ids):
        with torch.no_grad():
            h = smollm2_hf.model(torch.tensor([seq])).last_hidden_state[0].double().numpy()   # [n, H], normed
        ref_raw = h.mean(0)
        np.testing.assert_allclose(raw[i], ref_raw, rtol=1e-4, atol=2e-4 * np.abs(ref_raw).max())
        for got, ref in ((mean[i], ref_raw), (last[i], h[-1])):
            ref = ref / np.linalg.norm(ref)
            assert float(got @ ref) > 1 - 1e-6, (i, float(got @ ref))
            np.testing.assert_allclose(got, ref, atol=2e-5)


# a small labelled set: (anchor, paraphrase, unrelated)
TRIPLES = [
    ("The weather is lovely today.", "It is a beautiful day outside.", "The compiler reported a syntax error."),
    ("How do I reset my password?", "I forgot my password, how can I change it?", "Bananas are rich in potassium."),
    ("The cat is sleeping on the sofa.", "A cat naps on the couch.", "Interest rates rose by half a percent."),
    ("She bought a new car yesterday.", "Yesterday she purchased a new automobile.",
     "The recipe needs two cups of flour."),
    ("The meeting has been moved to Friday.", "We rescheduled the meeting for Friday.",
     "Penguins live in the Southern Hemisphere."),
    ("Python is a popular programming language.", "Many developers write code in Python.",
     "The orchestra played a symphony by Mozart."),
    ("The train to London is delayed.", "The London train is running late.", "He planted tomatoes in the garden."),
    ("I am very hungry.", "I would really like to eat something.", "The satellite orbits the Earth every 90 minutes."),
]


def test_paraphrases_are_closer_than_unrelated_sentences(smollm2_engine):
    with Engine.from_artifact(smollm2_engine) as engine:
        v = engine.embed([s for t in TRIPLES for s in t]).reshape(len(TRIPLES), 3, -1)
    para = np.einsum("th,th->t", v[:, 0], v[:, 1])
    other = np.einsum("th,th->t", v[:, 0], v[:, 2])
    # every paraphrase pair above every unrelated pair (measured: paraphrases 0.87-0.96, unrelated 0.64-0.79)
    assert para.min() > other.max(), (para.round(3).tolist(), other.round(3).tolist())
