"""Sampling as small pure functions over batched logits (docs/architecture.md, Conventions; as vLLM's Sampler
and gpt-fast's logits_to_probs).

Pipeline for one step, logits: [B, V] float32, one row per sequence that needs a token:

    logit_bias (added) and the structured-output mask (disallowed tokens -> -inf)
      -> penalties (repetition / frequency / presence)
      -> greedy rows: argmax                                   (all-greedy batch: nothing else runs)
      -> sampled rows: temperature -> top-k -> top-p -> min-p -> probs -> one uniform draw per row
    logprobs: log_softmax of the processed logits (after penalties, temperature and the masks: the
    distribution that was actually sampled), chosen token + top-n.

Each row draws from its own np.random.Generator exactly once per step, so a seeded request gets the same
tokens whatever else is in the batch and in whatever order. Speculative decoding gives a sequence several
consecutive rows, one per drafted position (RowState.draft): they draw in order and stop drawing at the
first row whose token differs from its draft, so the generator advances once per token kept, as in plain
decoding (runtime/speculative.py: this is the rejection rule for a point-mass draft).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .sampling_params import SAMPLING_EPS, SamplingParams, has_penalty

NEG_INF = np.float32(-np.inf)
# top-p first tries the nucleus within the top _TOP_P_CANDIDATES tokens (a partial sort); exact either way.
_TOP_P_CANDIDATES = 256


def request_generator(seed: int | None, entropy: np.random.SeedSequence | None = None) -> np.random.Generator:
    """Per-request generator: Philox keyed by the request seed, else spawned from the engine's SeedSequence."""
    if seed is not None:
        return np.random.Generator(np.random.Philox(seed))
    child = (entropy or np.random.SeedSequence()).spawn(1)[0]
    return np.random.Generator(np.random.Philox(child))


# ---- penalties -------------------------------------------------------------------------------------------

def apply_penalties(logits: np.ndarray, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]],
                    repetition: np.ndarray, frequency: np.ndarray, presence: np.ndarray) -> np.ndarray:
    """OpenAI / vLLM penalties, in place on logits: [B, V].

    prompt_ids, output_ids: per row, the prompt's and the generated token ids; repetition, frequency,
    presence: [B]. Repetition covers prompt and output tokens (logit > 0: / r, else * r); frequency and
    presence cover output tokens only (logit -= f * count + p * (count > 0)). Works on the unique seen
    ids of each row, not on dense [B, V] counts.
    """
    for b in range(logits.shape[0]):
        out_ids, counts = np.unique(np.asarray(output_ids[b], dtype=np.int64), return_counts=True)
        row = logits[b]
        if repetition[b] != 1.0:
            seen = np.union1d(np.asarray(prompt_ids[b], dtype=np.int64), out_ids)
            v = row[seen]
            row[seen] = np.where(v > 0, v / repetition[b], v * repetition[b])
        if out_ids.size and (frequency[b] != 0.0 or presence[b] != 0.0):
            row[out_ids] -= (frequency[b] * counts + presence[b]).astype(np.float32)
    return logits


# ---- temperature and truncation -----------------------------------------------------------------------

def apply_temperature(logits: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """logits: [B, V] / temperature: [B], in place; rows with temperature < SAMPLING_EPS (greedy) unchanged."""
    t = np.where(temperature < SAMPLING_EPS, 1.0, temperature).astype(np.float32)
    logits /= t[:, None]
    return logits


def apply_top_k(logits: np.ndarray, top_k: np.ndarray) -> np.ndarray:
    """Keep each row's k largest logits (ties with the k-th kept), -inf elsewhere; k <= 0 or k >= V: off."""
    vocab = logits.shape[1]
    for b, k in enumerate(top_k):
        if 0 < k < vocab:
            row = logits[b]
            kth = np.partition(row, vocab - k)[vocab - k]
            row[row < kth] = NEG_INF
    return logits


def apply_top_p(logits: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Nucleus: keep the smallest set of most likely tokens whose mass reaches p (the top token always).

    A token is kept when the mass of the tokens strictly more likely than it is < p; ties with the last
    kept token are kept too. p >= 1: off.
    """
    vocab = logits.shape[1]
    for b, p in enumerate(top_p):
        if p >= 1.0:
            continue
        row = logits[b]
        probs = softmax(row[None, :])[0]
        m = min(vocab, _TOP_P_CANDIDATES)
        cand = probs[np.argpartition(-probs, m - 1)[:m]] if m < vocab else probs
        top = np.sort(cand)[::-1]
        if m < vocab and top.sum(dtype=np.float64) < p:
            top = np.sort(probs)[::-1]
        exclusive = np.cumsum(top, dtype=np.float64) - top
        keep = max(1, int(np.count_nonzero(exclusive < p)))
        row[probs < top[keep - 1]] = NEG_INF
    return logits


def apply_min_p(logits: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """Drop tokens with p < min_p * p_max (the top token always stays); min_p = 0: off."""
    rows = np.flatnonzero(min_p > 0)
    if rows.size:
        sub = logits[rows]
        probs = softmax(sub)
        thresh = min_p[rows, None].astype(np.float32) * probs.max(axis=1, keepdims=True)
        sub[probs < thresh] = NEG_INF
        logits[rows] = sub
    return logits


def _shifted_exp(logits: np.ndarray) -> np.ndarray:
    """exp(logits - row max): [B, V] unnormalized probabilities in (0, 1], -inf -> 0."""
    z = logits - logits.max(axis=1, keepdims=True)
    return np.exp(z, out=z)


def softmax(logits: np.ndarray) -> np.ndarray:
    """[B, V] -> probabilities over the last axis; -inf -> 0."""
    e = _shifted_exp(logits)
    e /= e.sum(axis=1, keepdims=True)
    return e


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def sample_from_probs(probs: np.ndarray, generators: Sequence[np.random.Generator],
                      drafts: Sequence[int] | None = None) -> np.ndarray:
    """Inverse-CDF sampling, one uniform per row from that row's generator. probs: [B, V] non-negative
    weights (need not sum to 1) -> [B] int64. drafts[b] >= 0: row b + 1 continues row b's sequence and is
    drawn only if row b's token equals drafts[b]; rows not drawn get -1 and consume no randomness."""
    out = np.empty(len(probs), dtype=np.int64)
    skip = False
    for b, gen in enumerate(generators):
        d = -1 if drafts is None else drafts[b]
        if skip:
            out[b] = -1
            skip = d >= 0
            continue
        cdf = np.cumsum(probs[b], dtype=np.float64)
        u = gen.random() * cdf[-1]
        out[b] = min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)
        skip = d >= 0 and out[b] != d
    return out


# ---- the batch sampler --------------------------------------------------------------------------------

@dataclass
class RowState:
    """What the sampler needs to know about one row's request."""
    params: SamplingParams
    generator: np.random.Generator | None = None         # required unless params are greedy
    output_token_ids: Sequence[int] = ()                  # generated so far (frequency/presence/repetition)
    prompt_token_ids: Sequence[int] = ()                  # for the repetition penalty
    mask: np.ndarray | None = None                        # [V] bool, True = allowed (structured output)
    draft: int = -1                                       # >= 0: the next row is this sequence's next drafted
                                                          # position, valid only if this row samples `draft`


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top_ids: list[int] = field(default_factory=list)      # [n], most likely first
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class SampleOutput:
    token_ids: np.ndarray                                 # [B] int64
    logprobs: list[TokenLogprobs | None]                  # [B]; None where the request asked for none


def apply_bias_and_masks(logits: np.ndarray, rows: Sequence[RowState]) -> None:
    """In place on logits [B, V]: + each row's logit_bias, -inf where its mask forbids. A mask that allows
    nothing (cannot happen with a consistent grammar) is ignored rather than sampling from all -inf."""
    for b, r in enumerate(rows):
        bias = r.params.logit_bias
        if bias:
            ids = np.fromiter(bias.keys(), np.int64, len(bias))
            ok = ids < logits.shape[1]
            logits[b, ids[ok]] += np.fromiter(bias.values(), np.float32, len(bias))[ok]
        if r.mask is not None and r.mask.any():
            logits[b, ~r.mask[:logits.shape[1]]] = NEG_INF


def _plain_greedy(r: RowState) -> bool:
    """Greedy with nothing that changes the logits or asks for more than the token: argmax of the raw row."""
    return r.mask is None and r.params.raw_argmax


class Sampler:
    """Stateless; `sample` takes the logits rows in the same order as `rows`."""

    def sample(self, logits: np.ndarray, rows: Sequence[RowState], argmax: np.ndarray | None = None) -> SampleOutput:
        """argmax: np.argmax(logits, axis=1) when the caller has it already (the engine graph's logits_argmax)."""
        if logits.ndim != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [B, V] with B = len(rows) = {len(rows)}; got {logits.shape}")
        if all(_plain_greedy(r) for r in rows):   # the common decode step: one argmax, nothing copied
            return SampleOutput(np.argmax(logits, axis=1) if argmax is None else argmax, [None] * len(rows))
        params = [r.params for r in rows]
        want_logprobs = any(p.logprobs is not None for p in params)
        biased = any(r.mask is not None or r.params.logit_bias for r in rows)

        # written to only for bias/masks, penalties and logprobs; everything else works on fancy-indexed copies
        writes = want_logprobs or biased or any(has_penalty(p) for p in params)
        x = np.array(logits, dtype=np.float32, copy=True) if writes else np.asarray(logits, dtype=np.float32)
        if biased:
            apply_bias_and_masks(x, rows)
        self._penalize(x, rows)
        greedy = np.array([p.greedy for p in params])
        tokens = np.empty(len(rows), dtype=np.int64)
        if greedy.any():
            tokens[greedy] = np.argmax(x[greedy], axis=1)
        sampled = np.flatnonzero(~greedy)
        if sampled.size:
            sub = x[sampled]
            sp = [params[i] for i in sampled]
            apply_temperature(sub, np.array([p.temperature for p in sp], dtype=np.float32))
            apply_top_k(sub, np.array([p.top_k for p in sp]))
            apply_top_p(sub, np.array([p.top_p for p in sp]))
            apply_min_p(sub, np.array([p.min_p for p in sp], dtype=np.float32))
            gens = []
            for i in sampled:
                if rows[i].generator is None:
                    raise ValueError("a sampled (temperature > 0) row needs a generator; see request_generator()")
                gens.append(rows[i].generator)
            if want_logprobs:
                x[sampled] = sub
            tokens[sampled] = sample_from_probs(_shifted_exp(sub), gens, [rows[i].draft for i in sampled])
        return SampleOutput(tokens, self._logprobs(x, tokens, params) if want_logprobs else [None] * len(rows))

    @staticmethod
    def _penalize(x: np.ndarray, rows: Sequence[RowState]) -> None:
        idx = [i for i, r in enumerate(rows) if has_penalty(r.params)]
        if not idx:
            return
        sub = x[idx]
        ps = [rows[i].params for i in idx]
        apply_penalties(sub, [rows[i].prompt_token_ids for i in idx], [rows[i].output_token_ids for i in idx],
                        np.array([p.repetition_penalty for p in ps], dtype=np.float32),
                        np.array([p.frequency_penalty for p in ps], dtype=np.float32),
                        np.array([p.presence_penalty for p in ps], dtype=np.float32))
        x[idx] = sub

    @staticmethod
    def _logprobs(x: np.ndarray, tokens: np.ndarray, params: list[SamplingParams]) -> list[TokenLogprobs | None]:
        out: list[TokenLogprobs | None] = [None] * len(params)
        idx = [i for i, p in enumerate(params) if p.logprobs is not None]
        lp = log_softmax(x[idx])
        for j, i in enumerate(idx):
            if tokens[i] < 0:           # a drafted row after a rejection: not drawn, not reported
                continue
            n = params[i].logprobs
            row = lp[j]
            top = np.argpartition(-row, n)[:n] if 0 < n < row.size else np.arange(row.size if n else 0)
            top = top[np.argsort(-row[top], kind="stable")]
            out[i] = TokenLogprobs(int(tokens[i]), float(row[tokens[i]]), top.tolist(), row[top].tolist())
        return out
