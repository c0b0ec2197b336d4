"""gpt-oss's chat template (pipeline/harmony_template.py) rendered by ortllm's Tokenizer and encoded with
o200k_harmony: the same ids as openai-harmony's render_conversation_for_completion for the same conversation
(system content by default: identity, knowledge cutoff, the reasoning effort, the valid channels; developer
instructions; user turns; assistant history whose analysis harmony drops once answered), and the build writes it
for a gpt-oss source without tokenizer files or without a template."""
from __future__ import annotations

import json
import shutil

import pytest

from ortllm.pipeline.harmony_template import HARMONY_TEMPLATE
from ortllm.pipeline.tiktoken_vocab import hf_dir_tokenizer
from ortllm.runtime.tokenizer import Tokenizer
from tests.reference.harmony_ref import harmony_prompt_ids


@pytest.fixture(scope="module")
def tok(harmony_tokenizer_dir):
    return Tokenizer.from_dir(harmony_tokenizer_dir)


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Answer in French, briefly."}, {"role": "user", "content": "Capital of Japan?"}],
    [{"role": "developer", "content": "You are terse.\nNever use lists."},
     {"role": "user", "content": "Name a prime."},
     {"role": "assistant", "content": "7", "reasoning": "The user wants any prime. 7 is prime."},
     {"role": "user", "content": "Another, please 🙂 — and 日本語 too."},
     {"role": "assistant", "content": "11 (十一)", "reasoning": "Pick 11; write it in Japanese as well."},
     {"role": "user", "content": "  spaces\n\n and\ttabs  "}],
]


@pytest.mark.parametrize("effort", [None, "low", "medium", "high"])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_rendered_ids_equal_openai_harmony(tok, harmony_encoding, conv, effort):
    """The same ids; an answered turn's reasoning is not rendered (harmony's rule: the analysis of a turn that ended
    in a final message is dropped), so openai-harmony is given it where its auto_drop_analysis drops it (before
    the first final message) and not after (see test_openai_harmonys_drop_rule)."""
    messages = CONVERSATIONS[conv]
    ours = tok.encode(tok.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                              add_generation_prompt=True, reasoning_effort=effort))
    answered = sum(m["role"] == "assistant" for m in messages)
    assert ours == harmony_prompt_ids(harmony_encoding, messages, effort, reasoning=answered <= 1)
    assert ours == harmony_prompt_ids(harmony_encoding, messages, effort, reasoning=False)


def test_openai_harmonys_drop_rule(harmony_encoding):
    """openai-harmony 0.0.8 drops analysis only before the conversation's first final message (openai/harmony#96,
    open): a later answered turn's analysis stays in its rendering. The HF template of gpt-oss and the harmony
    guide drop every answered turn's; so does ours. If this fails, openai-harmony changed its rule: compare again."""
    messages = CONVERSATIONS[2]
    kept = harmony_encoding.decode(harmony_prompt_ids(harmony_encoding, messages, None))
    assert messages[2]["reasoning"] not in kept and messages[4]["reasoning"] in kept


def test_refusals(tok):
    with pytest.raises(Exception, match="reasoning_effort must be low, medium or high; got max"):
        tok.apply_chat_template([{"role": "user", "content": "x"}], reasoning_effort="max")
    with pytest.raises(Exception, match="a tool message has no harmony rendering here"):
        tok.apply_chat_template([{"role": "user", "content": "x"}, {"role": "tool", "content": "{}"}])
    assert not tok.template_takes_tools          # the service describes tools in the system message


def test_written_for_gpt_oss_sources(harmony_tokenizer_dir, tmp_path):
    """A gpt-oss directory without tokenizer files gets o200k_harmony with the template; one with a harmony
    tokenizer but no template gets the template; another family's directory without them is refused as before."""
    assert Tokenizer.from_dir(harmony_tokenizer_dir).chat_template == HARMONY_TEMPLATE   # made from an empty dir
    empty = tmp_path / "empty"
    empty.mkdir()
    no_template = tmp_path / "no_template"
    shutil.copytree(harmony_tokenizer_dir, no_template)
    cfg = json.loads((no_template / "tokenizer_config.json").read_text())
    (no_template / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items()
                                                                   if k != "chat_template"}))
    info = hf_dir_tokenizer(no_template, tmp_path / "b", "gpt_oss", 201088)
    assert info.chat_template == HARMONY_TEMPLATE and "chat_template.jinja" in info.files
    assert Tokenizer.from_dir(tmp_path / "b").chat_template == HARMONY_TEMPLATE
    from ortllm.pipeline.tokenizer import TokenizerError
    with pytest.raises(TokenizerError, match="lacks tokenizer.json and tokenizer_config.json"):
        hf_dir_tokenizer(empty, tmp_path / "c", "llama", 201088)
