import pytest
from hypothesis import given, settings, strategies as st

from ortllm.runtime.detokenizer import IncrementalDetokenizer
from ortllm.runtime.tokenizer import RustDecodeStream

tokenizers = pytest.importorskip("tokenizers")


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokenizer(merges=()):
    """ByteLevel BPE whose base vocabulary is the 256 bytes (token id = byte value), plus optional merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


TOK = byte_tokenizer()
# "世" is e4 b8 96: merging its first two bytes makes a token that ends mid-character
b2u = _bytes_to_unicode()
MERGED = byte_tokenizer([(b2u[0xE4], b2u[0xB8]), (b2u[0xB8], b2u[0x96]), ("h", "i")])


def decode(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


@pytest.fixture(params=["windows", "rust"])
def rust(request):
    """Every test runs on both ways to the text: decode windows in Python, and tokenizers' DecodeStream."""
    return request.param == "rust"


def new(tok, rust, prompt_ids=(), **kw):
    stream_of = (lambda ctx: RustDecodeStream(tok, ctx)) if rust else None
    return IncrementalDetokenizer(decode(tok), prompt_ids, stream=stream_of, **kw)


def stream(tok, text, rust, prompt="", one_by_one=True, **kw):
    ids = tok.encode(text).ids
    d = new(tok, rust, tok.encode(prompt).ids if prompt else (), **kw)
    deltas = [d.step([t]) for t in ids] if one_by_one else [d.step(ids)]
    deltas.append(d.flush())
    return d, deltas


TEXTS = ["hello world", "héllo 😀 世界!", "😀😀👍🏽 mixed 中文字符 and ascii", "e\u0301 combining", "世界hi世"]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("tok", [TOK, MERGED], ids=["bytes", "merges"])
def test_streamed_deltas_concatenate_to_full_decode(tok, text, rust):
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    d, deltas = stream(tok, text, rust, prompt="context: ")
    assert "".join(deltas) == text == d.text
    assert all("\ufffd" not in x for x in deltas)   # never half a character
    assert d.finish_reason is None


def test_multibyte_char_waits_for_its_last_byte(rust):
    d = new(TOK, rust)
    emoji = list("😀".encode())
    assert len(emoji) == 4
    assert [d.step([b]) for b in emoji] == ["", "", "", "😀"]


def test_stop_string_spanning_tokens_is_cut_and_held_back(rust):
    d, deltas = stream(TOK, "abc STOP def", rust, stop=["STOP"])
    assert "".join(deltas) == "abc " and d.text == "abc "
    assert d.finish_reason == "stop" and d.stop_reason == "STOP"
    # "S", "T", "O" were held back, not emitted and then retracted
    assert "S" not in "".join(deltas)


def test_stop_string_with_multibyte_chars_and_false_start(rust):
    d, deltas = stream(TOK, "x 世 世界 y", rust, stop=["世界"])
    assert "".join(deltas) == "x 世 " and d.stop_reason == "世界"
    # a partial match that does not complete is released
    d, deltas = stream(TOK, "ab STO and more", rust, stop=["STOP"])
    assert "".join(deltas) == "ab STO and more" and d.finish_reason is None


def test_held_back_prefix_released_at_flush(rust):
    d = new(TOK, rust, stop=["</s>"])
    out = d.step(TOK.encode("answer </").ids)
    assert out == "answer "
    assert d.flush() == "</" and d.text == "answer </"


def test_first_completed_stop_string_wins_and_tokens_after_stop_ignored(rust):
    d = new(TOK, rust, stop=["cd", "bcde"])
    assert d.step(TOK.encode("abcdef").ids) == "ab"
    assert d.stop_reason == "cd"
    assert d.step(TOK.encode("zz").ids) == "" and d.text == "ab"


def test_stop_token_id_adds_no_text_and_flushes(rust):
    eos = 0
    d = new(TOK, rust, stop_token_ids=[eos], stop=["zzz"])
    assert d.step(TOK.encode("hi z").ids) == "hi "
    assert d.step([eos, 65]) == "z"
    assert d.finish_reason == "stop" and d.stop_reason == eos and d.text == "hi z"
    assert d.output_token_ids == TOK.encode("hi z").ids


def test_incomplete_tail_at_end_is_flushed(rust):
    d = new(TOK, rust)
    assert d.step(list("a😀".encode())[:3]) == "a"
    assert d.flush() == "\ufffd" and d.text == "a\ufffd"   # the incomplete bytes, shown as U+FFFD


@pytest.mark.parametrize("rust", [False, True], ids=["windows", "rust"])   # not the fixture: hypothesis reruns
@settings(max_examples=30, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab 世界😀é\n")), max_size=20),
       st.lists(st.text(alphabet=st.sampled_from(list("ab世😀")), min_size=1, max_size=3), max_size=2))
def test_streaming_equals_offline_stop_handling(rust, text, stops):
    """Streaming with stop strings, token by token or all at once, gives what cutting the full text at
    the first stop string to complete gives."""
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    expected = text[:min(hits)[1]] if hits else text
    d, deltas = stream(MERGED, text, rust, stop=stops, one_by_one=False)
    assert "".join(deltas) == expected == d.text
    d, deltas = stream(MERGED, text, rust, stop=stops)
    assert "".join(deltas) == expected == d.text
    assert (d.finish_reason == "stop") == bool(hits)
