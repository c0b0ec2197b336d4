"""Calibration data: produced from installed packages, deterministic, identified by sha256."""
from __future__ import annotations

from ortllm.calibration import data


def test_humaneval_ships_with_the_package():
    problems = data.humaneval_problems()
    assert len(problems) == 164
    p = problems[0]
    assert p.task_id == "HumanEval/0" and p.entry_point in p.prompt and "def check" in p.test


def test_corpus_and_chat_are_deterministic():
    docs = data.corpus_documents()
    assert len(docs) > 200 and sum(map(len, docs)) > 200_000
    _, sha1 = data.fidelity_documents()
    data.corpus_documents.cache_clear()
    _, sha2 = data.fidelity_documents()
    assert sha1 == sha2 and set(sha1) == {"corpus", "chat", "humaneval"}
    assert data.chat_conversations(3) == data.chat_conversations(3)
    assert data.chat_conversations(3)[0][0]["role"] == "system"


class _Chars:
    """A stand-in tokenizer: one id per character."""
    chat_template = None

    def encode(self, text):
        return [ord(c) % 1000 for c in text]


def test_windows_cover_the_token_count():
    w = data.fidelity_windows(_Chars(), tokens=1000, ctx=128, eos_id=0)
    assert all(len(x) == 128 for x in w.windows)
    assert len(w.windows) * 127 >= 1000
    assert w.windows == data.fidelity_windows(_Chars(), tokens=1000, ctx=128, eos_id=0).windows
