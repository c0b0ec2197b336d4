"""o200k_harmony (gpt-oss's tokenizer) as pipeline/tiktoken_vocab.py writes it from the offline o200k_base ranks,
against tiktoken's own o200k_harmony over the same ranks and against openai-harmony's encoding (its own pattern
and special tokens, in Rust): the same ids token for token on a varied text set (tests/reference/tokenizer_corpus.py,
the held-out prose, code and chat of calibration/heldout.py), special tokens matched in text as tiktoken's
allowed_special="all" does, and decode round trips, whole and streamed."""
from __future__ import annotations

import pytest

from ortllm.calibration import heldout
from ortllm.pipeline.tiktoken_vocab import (HARMONY_EOS, HARMONY_SPECIALS, HARMONY_VOCAB_SIZE, O200K_PATTERN,
                                            default_tokenizer, write_harmony_tokenizer)
from ortllm.pipeline.tokenizer import TokenizerError
from ortllm.runtime.detokenizer import IncrementalDetokenizer
from ortllm.runtime.tokenizer import HARMONY_MARKERS, Tokenizer
from tests.reference.harmony_ref import tiktoken_o200k_harmony
from tests.reference.tokenizer_corpus import corpus

SPECIALS_IN_TEXT = [
    "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>ok<|end|>",
    "a<|return|>b <|call|> c<|constrain|>json <|endoftext|><|startoftext|> <|reserved_200100|>x",
    "<|start <|end| |message|> <|channel|x <||> <|reserved_2000|>",      # near misses are text
]


@pytest.fixture(scope="module")
def tok(harmony_tokenizer_dir):
    return Tokenizer.from_dir(harmony_tokenizer_dir)


@pytest.fixture(scope="module")
def tiktoken_enc():
    return tiktoken_o200k_harmony()


@pytest.fixture(scope="module")
def texts(tok):
    """Every text the ids are compared on: the quick corpus with specials in text, and the held-out domains (the
    licences and stdlib modules cut into 4000-character pieces, the chat conversations rendered in harmony)."""
    out = corpus(list(HARMONY_MARKERS) + ["<|return|>", "<|call|>", "<|endoftext|>"]) + SPECIALS_IN_TEXT
    for d in (heldout.prose(), heldout.code(), heldout.chat(tok)):
        for doc in d.documents:
            out += [doc[i:i + 4000] for i in range(0, min(len(doc), 40000), 4000)]
    return out


def test_the_tables_are_tiktokens(tiktoken_enc):
    """The pattern is tiktoken's o200k one; the specials its o200k_harmony's, one string an id (tiktoken names id
    200018 twice: <|endofprompt|> and <|reserved_200018|>; tokenizer.json keeps the first)."""
    _, spec = tiktoken_enc
    assert spec["pat_str"] == O200K_PATTERN
    theirs = {t: i for t, i in spec["special_tokens"].items() if t != "<|reserved_200018|>"}
    assert theirs == HARMONY_SPECIALS
    assert sorted(HARMONY_SPECIALS.values()) == list(range(199998, HARMONY_VOCAB_SIZE))


def test_ids_equal_tiktoken_and_openai_harmony(tok, tiktoken_enc, harmony_encoding, texts):
    enc, _ = tiktoken_enc
    assert len(texts) > 150
    n_tokens = 0
    for text in texts:
        ours = tok.encode(text)
        assert ours == enc.encode(text, allowed_special="all"), text[:80]
        assert ours == harmony_encoding.encode(text, allowed_special="all"), text[:80]
        n_tokens += len(ours)
    assert n_tokens > 100_000


def test_special_tokens_in_text(tok, tiktoken_enc):
    """Written in text, a special token is that token (as tiktoken with allowed_special="all" and transformers' fast
    tokenizers): tiktoken's default refuses such text, its encode_ordinary reads it as characters."""
    enc, _ = tiktoken_enc
    ids = tok.encode(SPECIALS_IN_TEXT[0])
    assert [i for i in ids if i >= 199998] == [200006, 200008, 200007, 200006, 200005, 200008, 200007]
    with pytest.raises(ValueError, match="disallowed special token"):
        enc.encode(SPECIALS_IN_TEXT[0])
    ordinary = enc.encode_ordinary(SPECIALS_IN_TEXT[0])
    assert max(ordinary) < 199998 and ordinary != ids
    assert tok.encode(SPECIALS_IN_TEXT[2]) == enc.encode(SPECIALS_IN_TEXT[2], allowed_special="all")
    assert [tok.token_to_id(t) for t in ("<|return|>", "<|call|>", "<|endoftext|>")] == list(
        (HARMONY_EOS[0], HARMONY_EOS[2], HARMONY_EOS[1]))


def test_where_openai_harmony_differs(tok, harmony_encoding):
    """openai-harmony's table names id 200018 <|reserved_200018|> (not o200k_base's <|endofprompt|>) and adds
    <|reserved_201088|>, past gpt-oss's 201088 rows: the one text on which its ids differ from tiktoken's and ours."""
    names = harmony_encoding.special_tokens_set
    assert names - set(HARMONY_SPECIALS) == {"<|reserved_200018|>", "<|reserved_201088|>"}
    assert set(HARMONY_SPECIALS) - names == {"<|endofprompt|>"}
    assert tok.encode("<|endofprompt|>") == [200018]
    assert harmony_encoding.encode("<|endofprompt|>", allowed_special="all") == tok.encode("<|endofprompt|>"[:2]) + \
        tok.encode("endofprompt|>")


def test_decode_round_trips(tok, tiktoken_enc, texts):
    """decode(encode(text)) is the text (tiktoken's decode too); decode skips the special tokens but harmony's markers;
    the streaming detokenizer, token by token, gives what decode gives."""
    enc, _ = tiktoken_enc
    for text in texts[:120]:
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special_tokens=False) == text == enc.decode(ids)
        shown = tok.decode(ids)
        assert shown == enc.decode([i for i in ids if i < 199998 or i in (200003, 200005, 200006, 200007, 200008)])
        detok = IncrementalDetokenizer(tok.decode, [], stream=tok.decode_stream)
        streamed = "".join(detok.step([i]) for i in ids) + detok.flush()
        assert streamed == shown, text[:80]


def test_tokenizer_config(tok, harmony_tokenizer_dir):
    assert tok.harmony and tok.vocab_size == HARMONY_VOCAB_SIZE
    assert tok.eos_token_ids[0] == HARMONY_SPECIALS["<|return|>"]
    assert tok.bos_token_id == HARMONY_SPECIALS["<|startoftext|>"] and tok.pad_token_id == 199999
    assert tok.chat_template and "<|start|>system<|message|>" in tok.chat_template


def test_models_without_harmonys_rows(tmp_path):
    """A gpt-oss model with fewer embedding rows than o200k_harmony's ids cannot carry it: refused when asked for,
    the byte tokenizer when the source has none (tiny random models)."""
    with pytest.raises(TokenizerError, match="o200k_harmony has 201088 ids but the model has 512"):
        write_harmony_tokenizer(tmp_path / "a", 512)
    info = default_tokenizer(tmp_path / "b", "gpt_oss", 512)
    assert info.vocab_size == 512 and not Tokenizer.from_dir(tmp_path / "b").harmony


def test_no_onnx_tokenizer_graphs(harmony_tokenizer_dir, tmp_path):
    """Builds skip both graphs for o200k_harmony, saying why, and remove stale ones. The reasons were measured with
    onnxruntime-extensions 0.15 (pipeline/tokenizer_graphs.py HARMONY_SKIPPED; an ORT session over this vocabulary
    takes ~25 s to make, too slow to re-check here): HfJsonTokenizer encodes "</" as [60] where o200k has the token
    808, and BpeDecoder drops harmony's markers with the other special tokens."""
    import shutil

    from ortllm.pipeline import tokenizer_graphs as tg
    art = tmp_path / "art"
    shutil.copytree(harmony_tokenizer_dir, art)
    (art / tg.TOKENIZER_ONNX).write_bytes(b"stale")
    assert tg.write_tokenizer_graphs(art) == tg.HARMONY_SKIPPED
    assert not (art / tg.TOKENIZER_ONNX).exists()
    assert all(r.startswith("skipped: ") for r in tg.HARMONY_SKIPPED.values())
