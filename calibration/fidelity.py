"""Paired fidelity of a quantized artifact against its fp32 reference on the same token streams.

Both models score the same windows position by position (row i of a window predicts token i + 1), as
llama.cpp's `perplexity --kl-divergence` does, and per position we keep
    kld  = sum_v p_ref(v) * (log p_ref(v) - log p_q(v))
    top1 = argmax p_q == argmax p_ref
    d    = nll_q(next) - nll_ref(next)            (ln of the PPL ratio, per token)
The report gives mean and p99 KLD, top-1 agreement, and PPL ratio = exp(mean d) with the standard
error of the mean of d carried through exp (delta method), like llama.cpp's "ln(PPL(Q)/PPL(base))".

Scorers stream logits chunk by chunk ([chunk, V] at a time), so 2048-token windows of a 49k vocabulary
never sit in memory whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ortllm.runtime.artifact import Artifact, Manifest


def log_softmax(x: np.ndarray) -> np.ndarray:
    return _log_softmax_exp(x)[0]


def _log_softmax_exp(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp64 log_softmax of logits [n, V], with exp(x - max) [n, V] and its row sums [n, 1] (the probabilities'
    numerator and denominator, so a caller needs no second exp). In place on one fp64 copy: at Gemma's 262k vocabulary
    a 128-row chunk is 268 MB an array."""
    x = x.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    e = np.exp(x)
    s = e.sum(-1, keepdims=True)
    x -= np.log(s)
    return x, e, s


@dataclass
class PairedStats:
    """Accumulates per-position statistics of (candidate, reference) logits."""
    kld: list = field(default_factory=list)
    top1: list = field(default_factory=list)
    dnll: list = field(default_factory=list)
    nll_ref: list = field(default_factory=list)

    def add(self, cand: np.ndarray, ref: np.ndarray, targets: np.ndarray, rows_per_step: int = 128) -> None:
        """cand/ref logits [n, V] at positions whose next tokens are targets [n] (fp64, 128 rows at a time)."""
        for s in range(0, len(targets), rows_per_step):
            self._add(cand[s:s + rows_per_step], ref[s:s + rows_per_step], targets[s:s + rows_per_step])

    def _add(self, cand: np.ndarray, ref: np.ndarray, targets: np.ndarray) -> None:
        lq = log_softmax(cand)
        lr, p_ref, sums = _log_softmax_exp(ref)
        p_ref /= sums
        rows = np.arange(len(targets))
        nq, nr = -lq[rows, targets], -lr[rows, targets]
        np.subtract(lr, lq, out=lq)                           # lq is now log p_ref - log p_q
        self.kld.append(np.einsum("ij,ij->i", p_ref, lq))
        self.top1.append(cand.argmax(-1) == ref.argmax(-1))
        self.dnll.append(nq - nr)
        self.nll_ref.append(nr)

    def summary(self) -> dict:
        kld, top1 = np.concatenate(self.kld), np.concatenate(self.top1)
        d, nr = np.concatenate(self.dnll), np.concatenate(self.nll_ref)
        n = len(d)
        ln_ratio, ln_err = float(d.mean()), float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
        ratio = float(np.exp(ln_ratio))
        return {
            "tokens": int(n),
            "kld_mean": float(kld.mean()),
            "kld_mean_err": float(kld.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,   # standard error of the mean
            "kld_p99": float(np.percentile(kld, 99)),
            "kld_max": float(kld.max()),
            "top1_agreement": float(top1.mean()),
            "top1_agreement_err": float(np.sqrt(top1.mean() * (1 - top1.mean()) / n)),   # binomial standard error
            "ln_ppl_ratio": ln_ratio,
            "ln_ppl_ratio_err": ln_err,
            "ppl_ratio": ratio,
            "ppl_ratio_err": ratio * ln_err,
            "ppl_reference": float(np.exp(nr.mean())),
            "ppl": float(np.exp(nr.mean() + ln_ratio)),
        }

    def kld_values(self) -> np.ndarray:
        return np.concatenate(self.kld)

    @classmethod
    def merged(cls, parts: list["PairedStats"]) -> "PairedStats":
        """The statistics of all positions of `parts` together (the all-domains line of a report)."""
        out = cls()
        for p in parts:
            out.kld += p.kld
            out.top1 += p.top1
            out.dnll += p.dnll
            out.nll_ref += p.nll_ref
        return out


# ---------------------------------------------------------------- scorers

class EngineScorer:
    """Logits of one window through the engine graph and its paged KV pool (runtime/scoring.py)."""

    def __init__(self, artifact: Artifact | None, ctx: int, threads: int | None = None, engine=None):
        """A new session sized for `ctx` tokens, or an idle engine's own (Engine.scorer)."""
        if engine is not None:
            self._scorer = engine.scorer()
        else:
            from ortllm.runtime.scoring import WindowScorer
            self._scorer = WindowScorer.from_artifact(artifact, ctx, threads)

    def logits(self, ids: list[int], chunk: int = 512) -> Iterator[np.ndarray]:
        return self._scorer.logits(ids, chunk)


class PortableScorer:
    """Logits of one window through the portable graph, chunk by chunk with its plain KV cache."""

    def __init__(self, artifact: Artifact, ctx: int, threads: int | None = None):
        from ortllm.runtime.portable_model import PortableModel
        self.model = PortableModel.from_artifact(artifact, threads)

    def logits(self, ids: list[int], chunk: int = 512) -> Iterator[np.ndarray]:
        past = self.model.empty_past()
        for start in range(0, len(ids), chunk):
            part = np.asarray([ids[start:start + chunk]], np.int64)
            out, past = self.model.forward(part, past, start)
            yield out[0]


def make_scorer(artifact: Artifact, ctx: int, threads: int | None = None):
    return (EngineScorer if artifact.graph == "engine" else PortableScorer)(artifact, ctx, threads)


def draft_artifact(path: Path, manifest: dict) -> Artifact:
    """An Artifact over a directory still being built (its manifest not written yet)."""
    return Artifact(Path(path), Manifest.from_dict(manifest))


def score_pair(cand, ref, windows: list[list[int]], chunk: int = 512, progress=None) -> PairedStats:
    """Paired statistics of two scorers over token windows (every position but each window's last)."""
    return score_many([cand], ref, windows, chunk, progress)[0]


def score_domains(cands: list, ref, windows: dict[str, list[list[int]]], chunk: int = 512,
                  progress=None) -> list[dict[str, PairedStats]]:
    """score_many per domain: for each candidate, domain -> its PairedStats (reference scored once)."""
    out: list[dict[str, PairedStats]] = [{} for _ in cands]
    for name, ws in windows.items():
        for per, st in zip(out, score_many(cands, ref, ws, chunk, progress)):
            per[name] = st
    return out


def domain_summary(per_domain: dict[str, PairedStats]) -> dict:
    """A fidelity section: the summary of all domains together, with each domain's own under "domains"."""
    return {**PairedStats.merged(list(per_domain.values())).summary(),
            "domains": {name: st.summary() for name, st in per_domain.items()}}


def score_many(cands: list, ref, windows: list[list[int]], chunk: int = 512, progress=None) -> list[PairedStats]:
    """Paired statistics of several scorers against one reference: each reference chunk is computed once."""
    stats = [PairedStats() for _ in cands]
    for w in windows:
        targets = np.asarray(w[1:], np.int64)
        pos = 0
        for lr, *lcs in zip(ref.logits(w, chunk), *(c.logits(w, chunk) for c in cands)):
            n = min(len(lr), len(targets) - pos)
            if n > 0:
                for st, lc in zip(stats, lcs):
                    st.add(lc[:n], lr[:n], targets[pos:pos + n])
            pos += len(lr)
            if progress is not None:
                progress.update(len(lr))
    return stats

