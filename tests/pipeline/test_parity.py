"""Parity of the built graph with transformers fp32 (and with optimum-onnx's export of the same weights).

Gate (foundation issue): a 32-token prompt, then 16 greedy steps through the KV cache: every step's logits
within 1e-3 x max|logit| of the reference, and the greedy tokens identical.
"""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.runtime.artifact import load_artifact
from ortllm.runtime.portable_model import PortableModel
from tests.reference.hf_llama import hf_greedy_logits, hf_model_from_weights

PROMPT_LEN, STEPS = 32, 16


def _assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    err = np.abs(got - ref).max()
    bound = 1e-3 * np.abs(ref).max()
    assert err <= bound, f"{what}: max |dlogit| {err:.3g} > {bound:.3g} (1e-3 x max|logit|)"


def _prompt(vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, PROMPT_LEN).tolist()


def _ours(artifact_dir, prompt):
    art = load_artifact(artifact_dir)
    return PortableModel.from_artifact(art).greedy_logits(prompt, STEPS)


def _optimum(artifact_dir, prompt):
    art = load_artifact(artifact_dir)
    return PortableModel(art.file("optimum/model.onnx"), art.model).greedy_logits(prompt, STEPS)


def test_tiny_random_matches_transformers(tiny_artifact):
    from ortllm.pipeline.sources import load_model
    _, weights = load_model("llama-tiny-random")
    prompt = _prompt(weights.config.vocab_size)
    ref_tokens, ref_logits = hf_greedy_logits(hf_model_from_weights(weights), prompt, STEPS)
    tokens, logits = _ours(tiny_artifact, prompt)
    _assert_close(logits, ref_logits, "llama-tiny-random vs transformers")
    assert tokens == ref_tokens


def test_tiny_random_matches_optimum_export(tiny_artifact):
    prompt = _prompt(512, seed=1)
    ref_tokens, ref_logits = _optimum(tiny_artifact, prompt)
    tokens, logits = _ours(tiny_artifact, prompt)
    _assert_close(logits, ref_logits, "llama-tiny-random vs optimum export")
    assert tokens == ref_tokens


@pytest.fixture(scope="module")
def smollm2_prompt(smollm2_artifact):
    from ortllm.runtime.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(smollm2_artifact)
    text = ("The history of the Roman Empire spans many centuries, from the founding of the city to the fall of "
            "Constantinople in 1453. Historians often divide it into the Principate, the Crisis of the Third "
            "Century and the Dominate, and they argue about")
    ids = tok.encode(text)
    assert len(ids) >= PROMPT_LEN, len(ids)
    return ids[:PROMPT_LEN]


def test_smollm2_matches_transformers(smollm2_artifact, smollm2_hf, smollm2_prompt):
    ref_tokens, ref_logits = hf_greedy_logits(smollm2_hf, smollm2_prompt, STEPS)
    tokens, logits = _ours(smollm2_artifact, smollm2_prompt)
    _assert_close(logits, ref_logits, "smollm2 vs transformers (GGUF loader)")
    assert tokens == ref_tokens


def test_smollm2_matches_optimum_export(smollm2_artifact, smollm2_prompt):
    ref_tokens, ref_logits = _optimum(smollm2_artifact, smollm2_prompt)
    tokens, logits = _ours(smollm2_artifact, smollm2_prompt)
    _assert_close(logits, ref_logits, "smollm2 vs optimum export")
    assert tokens == ref_tokens
