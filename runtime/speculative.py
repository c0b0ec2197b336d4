"""Speculative decoding with prompt-lookup (n-gram) drafts: proposal, adaptive k, acceptance.

A decoding sequence whose last n tokens (n = ngram_max down to ngram_min) occurred earlier in its own prompt
or output gets the tokens that followed that occurrence as drafts: up to k extra query tokens of its decode
row in the next step. The graph returns logits for the last row and every drafted row (logits_indices), and
the target's token for row j is compared with draft j:

    fed:      [last, d1, d2, d3]          positions p .. p+3 (the KV of all four is written this step)
    target:   [t0,   t1, t2, t3]          t_j = the target's token after row j
    accepted: d1 .. dm while t_{j-1} == d_j, then t_m (the target's own next token): m + 1 tokens
    rollback: num_computed_tokens = p + 1 + m; blocks past it are freed (their KV is simply overwritten later)

Greedy: t_j is the argmax, so the output is the plain decode's token for token. Sampling: t_j is drawn from
the target's processed distribution with the row's own generator, in order, and drawing stops at the first
t_j != d_j. That is the standard rejection rule (Leviathan et al. 2023) for a point-mass draft q = 1[d]:
accept d with probability min(1, p(d) / q(d)) = p(d), else draw from norm(max(p - q, 0)) = p without d —
exactly the law of a draw x ~ p conditioned on x != d. Using one draw for both keeps a seeded request's
random stream where plain decoding has it: with the same logits (the graph is batch-invariant), speculation
changes no token, sampled or greedy.

k adapts per sequence (AdaptiveK): it grows while whole drafts are accepted and shrinks when they fail; after
`MISSES_TO_PAUSE` drafts in a row with nothing accepted it pauses (k = 0) for a cool-down that doubles each
time the probe after it fails again, so open-ended text that rarely repeats itself pays almost nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MISSES_TO_PAUSE = 2          # drafts in a row with none accepted before k goes to 0
PAUSE_STEPS = 8              # first cool-down, in steps; doubles on every failed probe ...
MAX_PAUSE_STEPS = 512        # ... up to this


class NgramIndex:
    """Incremental prompt-lookup index of one sequence: n-gram -> end position of its latest occurrence.

    Covers the n-grams that end before the last token (those with a known successor), updated from where
    it left off, so proposing costs O(new tokens) per step, not O(sequence)."""

    def __init__(self, ngram_min: int, ngram_max: int):
        self.sizes = range(ngram_max, ngram_min - 1, -1)      # longest match first
        self._last: dict[tuple[int, ...], int] = {}
        self._upto = 0                                        # n-grams ending at e < _upto are indexed

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        n_tok = len(tokens)
        for e in range(max(self._upto, 1), n_tok):
            for n in self.sizes:
                if e >= n:
                    self._last[tuple(tokens[e - n:e])] = e
        self._upto = max(self._upto, n_tok)
        if k <= 0:
            return []
        for n in self.sizes:
            if n_tok > n:
                e = self._last.get(tuple(tokens[n_tok - n:]))
                if e is not None:
                    return list(tokens[e:min(e + k, n_tok)])
        return []


@dataclass
class AdaptiveK:
    """Draft length of one sequence from its acceptance history (see the module docstring)."""
    k_max: int
    k: int = 0
    misses: int = 0                 # consecutive verified drafts with nothing accepted
    pause: int = 0                  # steps left with k = 0
    next_pause: int = PAUSE_STEPS   # the cool-down after the next failure streak

    def __post_init__(self) -> None:
        self.k = min(4, self.k_max) if self.k == 0 else self.k

    def current(self) -> int:
        """k for this step (counts a paused step down)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.k

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        if accepted == drafted:
            self.k = min(self.k_max, self.k + 2)
        else:
            self.k = max(1, min(self.k - 1, accepted + 1))
        if accepted:
            self.misses, self.next_pause = 0, PAUSE_STEPS
            return
        self.misses += 1
        if self.misses >= MISSES_TO_PAUSE:
            self.pause, self.misses, self.k = self.next_pause, MISSES_TO_PAUSE - 1, 1   # probe with 1 after it
            self.next_pause = min(MAX_PAUSE_STEPS, 2 * self.next_pause)


@dataclass
class SpecState:
    """Per-request drafting state, kept on the scheduler's Request."""
    index: NgramIndex
    k: AdaptiveK
    drafted: int = 0                # totals for this request
    accepted: int = 0

    @classmethod
    def create(cls, ngram_min: int, ngram_max: int, k_max: int) -> SpecState:
        return cls(NgramIndex(ngram_min, ngram_max), AdaptiveK(k_max))

    def propose(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Drafts for the next step: at most min(current k, limit) tokens (limit: budget, max_tokens, blocks)."""
        return self.index.propose(tokens, min(self.k.current(), limit))

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.k.record(drafted, accepted)


def accept(drafts: Sequence[int], target: Sequence[int]) -> list[int]:
    """The tokens a step adds: drafts while the target agrees, then the target's own token.

    target: [len(drafts) + 1] the target's token after each fed row (the sampler leaves -1 after a mismatch)."""
    out = []
    for j, t in enumerate(target):
        out.append(int(t))
        if j >= len(drafts) or t != drafts[j]:
            break
    return out
