import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ortllm.runtime.errors import InvalidSamplingParams
from ortllm.runtime.sampler import (RowState, Sampler, apply_min_p, apply_penalties, apply_temperature,
                                    apply_top_k, apply_top_p, log_softmax, request_generator,
                                    sample_from_probs, softmax)
from ortllm.runtime.sampling_params import SamplingParams

NEG = -np.inf


def kept(row):
    return set(np.flatnonzero(np.isfinite(row)).tolist())


def test_penalties_hand_computed():
    logits = np.array([[2.0, -2.0, 1.0, 0.5]], dtype=np.float32)
    apply_penalties(logits, [[0]], [[1, 2, 2]], np.array([2.0]), np.array([0.5]), np.array([0.25]))
    # token 0: prompt only -> 2/2; token 1: -2*2 - 0.5*1 - 0.25; token 2: 1/2 - 0.5*2 - 0.25; token 3 untouched
    np.testing.assert_allclose(logits, [[1.0, -4.75, -0.75, 0.5]])


def test_neutral_penalties_change_nothing():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 10)).astype(np.float32)
    ref = logits.copy()
    ids = [list(range(10))] * 3
    apply_penalties(logits, ids, ids, np.ones(3), np.zeros(3), np.zeros(3))
    np.testing.assert_array_equal(logits, ref)


def test_penalties_per_row_and_empty_output():
    logits = np.array([[1.0, 1.0, -1.0], [1.0, 1.0, -1.0]], dtype=np.float32)
    apply_penalties(logits, [[2], []], [[], [0, 0]], np.array([2.0, 1.0]), np.array([0.0, 1.0]),
                    np.array([1.0, 0.0]))
    np.testing.assert_allclose(logits, [[1.0, 1.0, -2.0], [-1.0, 1.0, -1.0]])


def test_temperature_skips_greedy_rows():
    logits = np.array([[2.0, 4.0], [2.0, 4.0]], dtype=np.float32)
    apply_temperature(logits, np.array([0.5, 0.0]))
    np.testing.assert_allclose(logits, [[4.0, 8.0], [2.0, 4.0]])


def test_top_k():
    logits = np.array([[1, 5, 3, 4, 2], [1, 5, 3, 4, 2], [1, 1, 1, 0, 0]], dtype=np.float32)
    apply_top_k(logits, np.array([2, 0, 2]))
    assert kept(logits[0]) == {1, 3}
    assert kept(logits[1]) == {0, 1, 2, 3, 4}
    assert kept(logits[2]) == {0, 1, 2}          # ties with the k-th value are kept


def test_top_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(np.stack([probs] * 4)).astype(np.float32)
    apply_top_p(logits, np.array([0.5, 0.75, 0.81, 1.0]))
    assert kept(logits[0]) == {0}                # 0.5 reaches 0.5
    assert kept(logits[1]) == {0, 1}             # 0.8 >= 0.75
    assert kept(logits[2]) == {0, 1, 2}          # 0.8 < 0.81
    assert kept(logits[3]) == {0, 1, 2, 3}


def test_top_p_large_vocab_matches_full_sort():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 5000)).astype(np.float32) * 3
    for p in (0.1, 0.9, 0.999):
        got = apply_top_p(logits.copy(), np.array([p, p]))
        for b in range(2):
            pr = softmax(logits[b:b + 1])[0]
            order = np.argsort(-pr)
            excl = np.cumsum(pr[order], dtype=np.float64) - pr[order]
            assert kept(got[b]) == set(order[excl < p].tolist())


def test_min_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(np.stack([probs] * 2)).astype(np.float32)
    apply_min_p(logits, np.array([0.35, 0.0]))   # threshold 0.175
    assert kept(logits[0]) == {0, 1} and kept(logits[1]) == {0, 1, 2, 3}


def test_softmax_logsoftmax_and_inverse_cdf():
    x = np.array([[0.0, np.log(3.0), NEG]], dtype=np.float32)
    np.testing.assert_allclose(softmax(x), [[0.25, 0.75, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(log_softmax(x)[0, :2], np.log([0.25, 0.75]), rtol=1e-6)

    class Fixed:
        def __init__(self, u):
            self.u = u

        def random(self):
            return self.u
    probs = np.array([[0.25, 0.75, 0.0]] * 3)
    assert sample_from_probs(probs, [Fixed(0.0), Fixed(0.2499), Fixed(0.9999)]).tolist() == [0, 0, 1]
    assert sample_from_probs(np.array([[0.0, 0.0, 1.0]]), [Fixed(0.0)]).tolist() == [2]


def test_greedy_equals_argmax():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(5, 50)).astype(np.float32)
    out = Sampler().sample(logits, [RowState(SamplingParams(temperature=0.0))] * 5)
    assert out.token_ids.tolist() == np.argmax(logits, axis=1).tolist()
    assert out.logprobs == [None] * 5
    # greedy rows in a mixed batch, with logprobs requested, still argmax
    rows = [RowState(SamplingParams(temperature=0.0, logprobs=2)),
            RowState(SamplingParams(temperature=1.0, seed=1), request_generator(1))] * 2
    out = Sampler().sample(logits[:4], rows)
    assert out.token_ids[0] == np.argmax(logits[0]) and out.token_ids[2] == np.argmax(logits[2])


def test_greedy_with_penalty_avoids_repeat():
    logits = np.array([[3.0, 2.9, 0.0]], dtype=np.float32)
    row = RowState(SamplingParams(temperature=0, repetition_penalty=1.5), output_token_ids=[0])
    assert Sampler().sample(logits, [row]).token_ids.tolist() == [1]
    row = RowState(SamplingParams(temperature=0, presence_penalty=0.2), output_token_ids=[0])
    assert Sampler().sample(logits, [row]).token_ids.tolist() == [1]


def test_logprobs_chosen_and_top_n():
    logits = np.log(np.array([[0.1, 0.6, 0.3]])).astype(np.float32)
    out = Sampler().sample(logits, [RowState(SamplingParams(temperature=0, logprobs=2))])
    lp = out.logprobs[0]
    assert lp.token_id == 1 and lp.top_ids == [1, 2]
    np.testing.assert_allclose(lp.logprob, np.log(0.6), rtol=1e-5)
    np.testing.assert_allclose(lp.top_logprobs, np.log([0.6, 0.3]), rtol=1e-5)
    # logprobs follow the sampled distribution: top_k=1 leaves one token with logprob 0
    out = Sampler().sample(logits, [RowState(SamplingParams(top_k=1, logprobs=1, seed=0), request_generator(0))])
    assert out.logprobs[0].logprob == 0.0 and out.logprobs[0].top_ids == [1]


def test_sampling_respects_masks_and_distribution():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 400)).astype(np.float32)
    gen = request_generator(123)
    rows = [RowState(SamplingParams(top_p=0.75), gen)] * 400
    toks = Sampler().sample(logits, rows).token_ids
    assert set(toks.tolist()) == {0, 1}
    assert 0.55 < np.mean(toks == 0) < 0.70      # 0.5 / 0.8 = 0.625


def _row(seed, **kw):
    return RowState(SamplingParams(seed=seed, **kw), request_generator(seed))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(0, 50), min_size=0, max_size=6), st.randoms())
def test_same_seed_same_tokens_whatever_the_batch(seed, others, rnd):
    """A seeded row's tokens depend only on its own logits and seed, not on the rest of the batch."""
    rng = np.random.default_rng(seed % 1000)
    mine = rng.normal(size=(1, 64)).astype(np.float32) * 2
    kw = dict(temperature=0.8, top_k=20, top_p=0.9)

    def run(extra_seeds, pos):
        rows = [_row(s, temperature=rnd.choice([0.0, 0.7, 1.3]), min_p=0.05) for s in extra_seeds]
        me = _row(seed, **kw)
        rows.insert(pos, me)
        toks = []
        for step in range(4):
            logits = np.random.default_rng(step + 100 * len(rows)).normal(size=(len(rows), 64)).astype(np.float32)
            logits[pos] = mine[0] + step
            toks.append(int(Sampler().sample(logits, rows).token_ids[pos]))
        return toks

    alone = run([], 0)
    assert run(others, rnd.randint(0, len(others))) == alone


def test_logits_not_modified_and_unseeded_generators_follow_engine_seed():
    logits = np.random.default_rng(3).normal(size=(3, 40)).astype(np.float32)
    ref = logits.copy()

    def run(entropy):
        rows = [RowState(SamplingParams(top_k=5, logprobs=1, repetition_penalty=1.2), request_generator(None, entropy),
                         [1, 2]), RowState(SamplingParams(temperature=0.5), request_generator(None, entropy)),
                RowState(SamplingParams(temperature=0))]
        return [Sampler().sample(logits, rows).token_ids.tolist() for _ in range(5)]

    assert run(np.random.SeedSequence(7)) == run(np.random.SeedSequence(7))
    np.testing.assert_array_equal(logits, ref)


def test_sampled_row_needs_generator():
    with pytest.raises(ValueError, match="generator"):
        Sampler().sample(np.zeros((1, 3), np.float32), [RowState(SamplingParams())])


@pytest.mark.parametrize("kw, msg", [
    (dict(max_tokens=0), "max_tokens must be an integer >= 1; got 0"),
    (dict(temperature=-1), "temperature must be >= 0"),
    (dict(top_k=-1), r"top_k must be an integer >= 0 \(0 = off\)"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(min_p=2), r"min_p must be in \[0, 1\]"),
    (dict(repetition_penalty=0), r"repetition_penalty must be in \[0.01, 100\]"),
    (dict(repetition_penalty=1e-300), "repetition_penalty must be in"),   # near 0 made NaN logits
    (dict(frequency_penalty=3), r"frequency_penalty must be in \[-2, 2\]"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(seed=-1), "seed must be an integer"),
    (dict(stop=[""]), "stop must be a list of non-empty strings"),
    (dict(stop_token_ids=[-3]), "stop_token_ids"),
    (dict(logprobs=21), r"logprobs must be an integer in \[0, 20\]"),
    (dict(adapter=""), "adapter must be a non-empty name"),
    (dict(deadline_s=0), "deadline_s must be > 0"),
    (dict(max_tokens=True), "max_tokens"),
])
def test_sampling_params_validation(kw, msg):
    with pytest.raises(InvalidSamplingParams, match=msg):
        SamplingParams(**kw).validate()


def test_sampling_params_normalize_and_valid():
    p = SamplingParams(stop="###", stop_token_ids=(2,)).validate()
    assert p.stop == ["###"] and p.stop_token_ids == [2] and not p.greedy
    assert SamplingParams(temperature=0).greedy
    assert isinstance(InvalidSamplingParams("x"), ValueError)
