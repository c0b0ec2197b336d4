"""Tasks for LoRA adapters, generated here (no data set download): seeded, with disjoint train/eval splits.

  add    "What is 47 + 38? Reply with only the number."  -> "85"
  upper  "Repeat in capital letters: the red fox"         -> "THE RED FOX"

Each example is a chat turn (system-less user message); the answer is what the assistant must produce,
scored by exact match after stripping whitespace. The split is by hashing the prompt, so a prompt never
appears in both.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

WORDS = ("red fox cat dog sun moon tree river stone bird green blue cold warm small big fast slow happy quiet "
         "house road light dark apple bread water fire cloud wind snow rain gold silver").split()


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str


def _add(rng: np.random.Generator) -> Example:
    a, b = (int(x) for x in rng.integers(10, 100, 2))
    return Example(f"What is {a} + {b}? Reply with only the number.", str(a + b))


def _upper(rng: np.random.Generator) -> Example:
    phrase = " ".join(rng.choice(WORDS, int(rng.integers(2, 5))))
    return Example(f"Repeat in capital letters: {phrase}", phrase.upper())


TASKS = {"add": _add, "upper": _upper}


def _is_eval(prompt: str, eval_fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "little")
    return h < eval_fraction * 2**32


def make_split(task: str, n: int, split: str, seed: int = 0, eval_fraction: float = 0.2) -> list[Example]:
    """n distinct examples of `task` from the train or eval split."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    rng = np.random.default_rng([seed, sorted(TASKS).index(task)])
    out, seen = [], set()
    for _ in range(200 * n):
        ex = TASKS[task](rng)
        if ex.prompt in seen or _is_eval(ex.prompt, eval_fraction) != (split == "eval"):
            continue
        seen.add(ex.prompt)
        out.append(ex)
        if len(out) == n:
            return out
    raise ValueError(f"task {task!r} has fewer than {n} distinct {split} examples")


def score(answer: str, expected: str) -> bool:
    return answer.strip() == expected


def chat_prompt(tokenizer, ex: Example) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": ex.prompt}], add_generation_prompt=True)
