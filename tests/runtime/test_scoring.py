"""runtime/scoring.py: a window's logits through a session of its own equal those through an idle engine's session
(Engine.scorer, what calibration's HumanEval NLL uses instead of reaching engine.runner), chunked or not."""
from __future__ import annotations

import numpy as np

from ortllm.runtime.artifact import load_artifact
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.runtime.scoring import WindowScorer


def test_own_session_and_engine_session_score_alike(tiny_engine):
    ids = list(range(3, 43))
    own = np.concatenate(list(WindowScorer.from_artifact(load_artifact(tiny_engine), len(ids)).logits(ids)))
    with Engine.from_artifact(tiny_engine, num_blocks=16) as engine:
        chunked = np.concatenate(list(engine.scorer().logits(ids, chunk=16)))
        greedy = engine.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))[0].token_ids
    assert own.shape == (len(ids), engine.vocab_size)
    np.testing.assert_allclose(chunked, own, rtol=1e-5, atol=1e-5)
    assert int(np.argmax(own[-1])) == greedy[0]              # the last row predicts what the engine generates
