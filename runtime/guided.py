"""Structured output: a Guide (JSON schema, any JSON object, regex, choice list, Lark) -> per-step token masks.

llguidance does the work (a Rust wheel, no torch; the library onnxruntime-genai and vLLM use): a grammar
compiles once into an LLMatcher per request; each step the matcher gives a bitmask of the tokens that keep the
output inside the grammar, [ceil(V / 32)] int32, bit t of word t // 32 set = token t allowed; the sampled
token is then consumed. The engine computes the masks of a step's constrained rows on a helper thread while
the model runs (both release the GIL), and the sampler sets the disallowed logits to -inf.

    Guide --compile()--> LLMatcher (a cached pristine copy per grammar, deep-copied per request)
    per step: fill_masks(matchers, drafts) -> [rows, W] int32 -> unpack_mask(row) -> bool [V] -> Sampler
              consume(matcher, token) -> False: the grammar is complete (only EOS may follow)
              forced_tokens(matcher) -> the tokens the grammar forces next (llguidance's fast-forward tokens)

Forced tokens cost no model step of their own: the engine hands them to the scheduler, which feeds them in the
next step as drafts of the row (speculative decoding's verification: extra query tokens, one logits row each,
masked like any other row). A draft the model would not have sampled is rejected and rolled back, so the
tokens are exactly those of one step per token. Along a JSON key the grammar's masks allow one token per
position, so the drafts are accepted and a key of k tokens costs one step instead of k.

JSON is generated compact (no free whitespace): a small model otherwise may pad with spaces until
max_tokens and never close the object.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import InvalidGrammar
from .sampling_params import Guide

_JSON_OPTIONS = {"whitespace_flexible": False}
_CACHE_SIZE = 64


def grammar_text(guide: Guide) -> str:
    """The llguidance grammar for a Guide; raises InvalidGrammar naming guide.param for malformed specs."""
    import llguidance

    m = llguidance.LLMatcher
    try:
        if guide.kind == "json_object":
            return m.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        if guide.kind == "json_schema":
            return m.grammar_from_json_schema(guide.spec, defaults=_JSON_OPTIONS)
        if guide.kind == "regex":
            return m.grammar_from_regex(guide.spec)
        if guide.kind == "choice":
            return m.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in guide.spec))
        if guide.kind == "lark":
            return m.grammar_from_lark(guide.spec)
    except (ValueError, TypeError) as e:
        raise InvalidGrammar(f"{guide.param or guide.kind} cannot be compiled: {e}", guide.param) from None
    raise InvalidGrammar(f"unknown guide kind {guide.kind!r}", guide.param)


class GuidedDecoding:
    """One per engine: the llguidance tokenizer (built on first use, ~1 s), compiled grammars, the mask pool."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_token_ids: Sequence[int]):
        self.tokenizer_json, self.vocab_size, self.eos_token_ids = tokenizer_json, vocab_size, list(eos_token_ids)
        self.words = (vocab_size + 31) // 32       # int32 words per mask row
        self._lock = threading.Lock()
        self._tok = None
        self._executor = None
        self._compiled: OrderedDict[str, object] = OrderedDict()   # grammar text -> pristine LLMatcher

    def _tokenizer(self):
        with self._lock:
            if self._tok is None:
                import llguidance

                self._tok = llguidance.LLTokenizer(self.tokenizer_json.read_text(encoding="utf-8"),
                                                   n_vocab=self.vocab_size, eos_token=self.eos_token_ids)
                self._executor = llguidance.LLExecutor()
            return self._tok

    def compile(self, guide: Guide):
        """A fresh LLMatcher for one request; raises InvalidGrammar (a 400 naming guide.param)."""
        import llguidance

        text = grammar_text(guide)
        tok = self._tokenizer()
        with self._lock:
            pristine = self._compiled.get(text)
            if pristine is not None:
                self._compiled.move_to_end(text)
                return pristine.deep_copy()
        err = llguidance.LLMatcher.validate_grammar(text, tok)
        if err and not err.startswith("WARNING"):
            raise InvalidGrammar(f"{guide.param or guide.kind} is not supported: {err}", guide.param)
        matcher = llguidance.LLMatcher(tok, text, log_level=0)
        if matcher.is_error():
            raise InvalidGrammar(f"{guide.param or guide.kind} is not supported: {matcher.get_error()}", guide.param)
        with self._lock:
            self._compiled[text] = matcher.deep_copy()
            while len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        return matcher

    def fill_masks(self, matchers: Sequence, drafts: Sequence[Sequence[int]] = ()) -> np.ndarray:
        """[sum(len(drafts[i]) + 1), words] int32: for each matcher in order, the mask for its next token and,
        for each of its drafts, the mask after it (the matchers are left where they were). In parallel, GIL
        released."""
        from llguidance.numpy import fill_next_token_bitmask_par, fill_next_token_bitmask_par_with_draft_tokens

        drafts = list(drafts) or [()] * len(matchers)
        starts = np.cumsum([0] + [len(d) + 1 for d in drafts])
        masks = np.zeros((int(starts[-1]), self.words), dtype=np.int32)
        if matchers:
            self._tokenizer()
            plain = [(m, int(o)) for m, o, d in zip(matchers, starts, drafts) if not d]
            drafted = [(m, int(o), list(d)) for m, o, d in zip(matchers, starts, drafts) if d]
            if plain:
                fill_next_token_bitmask_par(self._executor, plain, masks)
            if drafted:      # (llguidance refuses an empty draft list, hence two calls)
                fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, masks)
        return masks


def unpack_mask(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """[W] int32 bitmask -> [vocab_size] bool (True: allowed)."""
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


def consume(matcher, token_id: int) -> bool:
    """Advance the matcher by the sampled token; True while more tokens may follow (False: complete or stuck)."""
    matcher.consume_token(int(token_id))
    return not (matcher.is_stopped() or matcher.is_error())


def forced_tokens(matcher) -> list[int]:
    """The tokens the grammar forces from here (llguidance's fast-forward tokens: it stops before a token that
    what follows could still extend). The engine verifies them as drafts; see the module docstring."""
    return list(matcher.compute_ff_tokens())
