"""Held-out evaluation text (calibration/heldout.py): three domains, named sources, and never calibration's text."""
from __future__ import annotations

import pytest

from ortllm.calibration import data, heldout
from ortllm.pipeline.calib_activations import calibration_data


class _Chars:
    """A stand-in tokenizer: one id per character."""
    chat_template = None

    def encode(self, text):
        return [ord(c) % 1000 for c in text]


def test_three_domains_with_sources_and_sha256s():
    doms = heldout.domains(None)
    assert list(doms) == list(heldout.DOMAINS) == ["prose", "code", "chat"]
    for name, dom in doms.items():
        assert len(dom.documents) >= 9 and sum(map(len, dom.documents)) > 40_000, name
        assert all(len(s.sha256) == 64 for s in dom.sources) and dom.description
    assert [s.sha256 for s in heldout.code().sources] == [data.sha256_text(t) for t in heldout.code().documents]
    # chat turns: user questions and assistant answers, alternating
    conv = heldout.chat_conversations()[0]
    assert [m["role"] for m in conv] == ["user", "assistant"] * heldout.CHAT_TURNS


def test_calibration_never_reads_the_heldout_sources():
    """Other sources, not only other documents of one source: no module whose source is held-out code is in the
    corpus whose docstrings calibration reads, and no line of the calibration text appears in held-out text."""
    corpus = set(data.CORPUS_MODULES)
    assert not {m for m in heldout.CODE_MODULES if m in corpus or any(c.startswith(m + ".") for c in corpus)}
    calib = list(data.corpus_documents()) + [m["content"] for c in data.chat_conversations(64, data.CORPUS_SEED + 1)
                                             for m in c]
    held = [d for dom in heldout.domains(None).values() for d in dom.documents]
    assert heldout.calibration_overlap(calib, held) == []
    # the check itself sees a shared line
    planted = "x" * 10 + " the same line of at least sixty-four characters in both texts, planted"
    assert heldout.calibration_overlap([*calib, planted], [*held, planted]) == [planted[:64]]


def test_calibration_stream_comes_from_its_own_sources():
    """What the quantizers calibrate on is the corpus and calibration chats, never a held-out source."""
    tok = _Chars()
    tok.eos_token_ids = (0,)
    cal = calibration_data(tok, 2048, 256, 1000)
    assert set(cal.sha256) == {"corpus", "chat", "tokens"}
    assert "corpus" in cal.sources and "licence" not in cal.sources


def test_windows_are_spread_and_deterministic():
    w = heldout.heldout_windows(_Chars(), tokens=3000, ctx=128, eos_id=0)
    assert set(w.windows) == {"prose", "code", "chat"}
    for name, ws in w.windows.items():
        assert len(ws) * 127 >= 1000 and all(len(x) == 128 for x in ws), name
    assert w.windows == heldout.heldout_windows(_Chars(), tokens=3000, ctx=128, eos_id=0).windows
    rep = w.report()
    assert rep["code"]["windows"] == len(w.windows["code"])
    assert rep["prose"]["sources"][0]["name"].endswith("Apache-2.0")
    # the windows of a domain start far apart (evenly spaced over the stream), not back to back
    stream = "".join(heldout.prose().documents)
    heads = ["".join(chr(c) for c in ws[:40]) for ws in w.windows["prose"] if all(c < 128 for c in ws[:40])]
    starts = [stream.find(h) for h in heads]
    assert len(starts) >= 2 and min(b - a for a, b in zip(starts, starts[1:])) > 128 * 4


def test_too_many_tokens_is_a_clear_error():
    with pytest.raises(data.DataError, match="lower --tokens"):
        heldout.heldout_windows(_Chars(), tokens=10_000_000, ctx=128, eos_id=0)
