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
    data.corpus_documents.cache_clear()
    assert data.corpus_documents() == docs
    assert data.chat_conversations(3) == data.chat_conversations(3)
    assert data.chat_conversations(3)[0][0]["role"] == "system"
