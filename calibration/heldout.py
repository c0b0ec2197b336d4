"""Held-out evaluation text: three domains from sources that calibration never reads.

Every fidelity figure of the project (the in-build quality.json, `ortllm eval --suite fidelity`, the quality
gates, the bench's quality columns) scores these windows, never the calibration stream:

    domain  source (shipped by the OS or by Python itself; nothing from a hub)             calibration reads
    prose   English licence texts in /usr/share/common-licenses (Debian's base-files)     no licence text
    code    Python source files of standard-library modules outside CORPUS_MODULES        docstrings of
                                                                                          CORPUS_MODULES only
    chat    question/answer turns rendered with the model's chat template: the user asks  chat templates of
            about a topic of the Python language reference, the assistant answers with    calibration/data.py
            that topic's text (pydoc_data.topics)                                          (CHAT_INSTRUCTIONS)

Each source file is named with its sha256 in the report. Within a domain the documents are EOS-joined in a
fixed order into one token stream and the windows are cut at evenly spaced offsets across the whole stream,
so a few windows already sample many documents and more windows sample more of them.
tests/calibration/test_heldout.py checks that no calibration text appears in the held-out text.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .data import DataError, render_chat, sha256_text

DOMAINS = ("prose", "code", "chat")
LICENSES_DIR = Path("/usr/share/common-licenses")
LICENSES = ("Apache-2.0", "GPL-3", "MPL-2.0", "LGPL-2.1", "GFDL-1.3", "Artistic", "CC0-1.0", "GPL-2", "MPL-1.1")
# Modules whose source is the code domain: none is in CORPUS_MODULES (whose docstrings calibration reads)
# nor a submodule of one.
CODE_MODULES = ("fnmatch", "glob", "colorsys", "graphlib", "filecmp", "cmd", "netrc", "ftplib", "poplib",
                "smtplib", "mailbox", "trace", "tabnanny", "pyclbr", "wave", "plistlib", "configparser",
                "optparse", "getopt", "gettext", "mimetypes", "pstats", "selectors", "shelve", "timeit",
                "webbrowser", "zipapp", "codeop", "dis", "pdb", "reprlib", "runpy", "traceback", "sysconfig")
CHAT_QUESTION = "What does the Python language reference say about {topic}?"
CHAT_ANSWER_CHARS = 1600          # an answer is a topic's first paragraphs, cut near this many characters
CHAT_TURNS = 2                    # question/answer pairs per conversation


@dataclass(frozen=True)
class Source:
    name: str                     # file path, or module:object for text Python holds in memory
    sha256: str


@dataclass(frozen=True)
class Domain:
    documents: tuple[str, ...]
    sources: tuple[Source, ...]
    description: str


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@lru_cache(maxsize=1)
def prose() -> Domain:
    missing = [n for n in LICENSES if not (LICENSES_DIR / n).is_file()]
    if missing:
        raise DataError(f"the held-out prose is the licence texts in {LICENSES_DIR}, and {', '.join(missing)} "
                        "are missing; install Debian's base-files package (apt-get install --reinstall base-files)")
    texts = [_read(LICENSES_DIR / n) for n in LICENSES]
    return Domain(tuple(texts), tuple(Source(str(LICENSES_DIR / n), sha256_text(t)) for n, t in zip(LICENSES, texts)),
                  f"English licence texts ({', '.join(LICENSES)}) from {LICENSES_DIR}")


@lru_cache(maxsize=1)
def code() -> Domain:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, sources = [], []
    for name in CODE_MODULES:
        path = stdlib / f"{name}.py"
        if not path.is_file():
            raise DataError(f"the held-out code is the standard library's Python source, and {path} is not there "
                            "(a Python installed without its .py sources); use a full CPython 3.11 install")
        text = _read(path)
        texts.append(text)
        sources.append(Source(str(path), sha256_text(text)))
    return Domain(tuple(texts), tuple(sources),
                  f"Python source of {len(CODE_MODULES)} standard-library modules outside the calibration corpus")


def _answer(text: str) -> str:
    """The topic's first paragraphs, up to about CHAT_ANSWER_CHARS characters."""
    out = ""
    for para in text.strip().split("\n\n"):
        if out and len(out) + len(para) > CHAT_ANSWER_CHARS:
            break
        out += ("\n\n" if out else "") + para
    return out[:2 * CHAT_ANSWER_CHARS]


@lru_cache(maxsize=1)
def _topics() -> tuple[tuple[str, str], ...]:
    from pydoc_data.topics import topics
    return tuple(sorted(topics.items()))


def chat_conversations() -> list[list[dict]]:
    """Conversations of CHAT_TURNS question/answer pairs over the reference's topics, in sorted topic order."""
    items = _topics()
    convs = []
    for i in range(0, len(items) - CHAT_TURNS + 1, CHAT_TURNS):
        conv = []
        for topic, text in items[i:i + CHAT_TURNS]:
            conv.append({"role": "user", "content": CHAT_QUESTION.format(topic=topic.replace("-", " "))})
            conv.append({"role": "assistant", "content": _answer(text)})
        convs.append(conv)
    return convs


def chat(tokenizer) -> Domain:
    import pydoc_data.topics as mod
    convs = chat_conversations()
    texts = [render_chat(tokenizer, c, add_generation_prompt=False) for c in convs]
    how = ("rendered with the model's chat template" if getattr(tokenizer, "chat_template", None)
           else "as 'role: text' lines (the model has no chat template)")
    raw = "\0".join(f"{t}\n{x}" for t, x in _topics())
    return Domain(tuple(texts), (Source(f"{mod.__file__} (pydoc_data.topics)", sha256_text(raw)),),
                  f"{len(convs)} conversations of {CHAT_TURNS} question/answer turns over the Python language "
                  f"reference's topics, {how}")


def domains(tokenizer) -> dict[str, Domain]:
    return {"prose": prose(), "code": code(), "chat": chat(tokenizer)}


@dataclass(frozen=True)
class HeldOut:
    windows: dict[str, list[list[int]]]   # domain -> token windows of ctx tokens, scored independently
    sources: dict[str, list[dict]]         # domain -> [{name, sha256}] of the files the text came from
    description: dict[str, str]            # domain -> how its text was made
    ctx: int

    def report(self) -> dict:
        """The data section of a report: per domain its sources, sha256s, window count and tokens' sha256."""
        out = {}
        for d, ws in self.windows.items():
            tok = hashlib.sha256(str(ws).encode()).hexdigest()
            out[d] = {"description": self.description[d], "sources": self.sources[d], "windows": len(ws),
                      "ctx": self.ctx, "tokens_sha256": tok}
        return out


def heldout_windows(tokenizer, tokens: int, ctx: int, eos_id: int | None) -> HeldOut:
    """Windows of `ctx` tokens per domain, whose scored positions (ctx - 1 each) add up to >= tokens / 3 per
    domain, at evenly spaced offsets of each domain's EOS-joined stream."""
    per = -(-tokens // len(DOMAINS))
    n = -(-per // (ctx - 1))
    windows, sources, desc = {}, {}, {}
    for name, dom in domains(tokenizer).items():
        stream: list[int] = []
        for doc in dom.documents:
            stream += tokenizer.encode(doc) + ([eos_id] if eos_id is not None else [])
        if len(stream) < n * ctx:
            raise DataError(f"the held-out {name} text holds {len(stream)} tokens; {n} windows of {ctx} were asked "
                            "for: lower --tokens or --ctx")
        step = (len(stream) - ctx) // max(n - 1, 1)
        windows[name] = [stream[i * step:i * step + ctx] for i in range(n)]
        sources[name] = [{"name": s.name, "sha256": s.sha256} for s in dom.sources]
        desc[name] = dom.description
    return HeldOut(windows, sources, desc, ctx)


def calibration_overlap(calibration_texts, heldout_texts, width: int = 64) -> list[str]:
    """Pieces of `width` characters (whitespace-normalized, from lines at least that long) found in both."""
    def pieces(texts):
        out = set()
        for t in texts:
            for line in t.splitlines():
                line = " ".join(line.split())
                if len(line) >= width:
                    out.add(line[:width])
        return out
    return sorted(pieces(calibration_texts) & pieces(heldout_texts))

