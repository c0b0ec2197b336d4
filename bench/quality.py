"""Held-out quality beside speed: every system of a bench run scored on the same held-out windows against the fp32
reference, the way `ortllm eval --suite fidelity` scores an artifact (calibration/fidelity.py, heldout.py).

    --reference FP32 (ortllm fp32 artifact) --make_scorer--> logits, chunk by chunk (computed once per window)
    ARTIFACT (ortllm)                       --make_scorer--> logits
    each --peers system (its driver process) --{"logits": ids, "out": F.npy}--> every position's logits of the
                                               window, float32 [ctx, vocab] (one window at a time, deleted after)
    -> PairedStats per system and domain -> rows of scenario "quality": metric kld_mean, top1_agreement, ppl_ratio,
       domain "all" (prose, code and chat together) or one of them; median = the figure, min/max = +- one standard
       error of the mean (PPL ratio: delta method), "tokens" = scored positions

Every system reads the same token ids (the reference's tokenizer; the peers' models are built from the same
weights and vocabulary), each window from its first token with an empty cache, so the comparison is like for like:
llama.cpp's F32 of SmolLM2 against our fp32 artifact gives KLD 0.00000 and top-1 99.95%.
beside() then copies each system's all-domain figures onto its speed rows ("quality"), which the results table
prints as columns and the plots put beside the speed; peer_runner.best_peers names the best peer by speed and by
speed at quality.
"""
from __future__ import annotations

import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from .errors import BenchError
from .peer_runner import SCENARIO_SHAPES, _start, available, system_info
from .results import row

QUALITY_METRICS = {"kld_mean": "nats", "top1_agreement": "fraction", "ppl_ratio": "ratio"}
QUALITY_CTX = 512          # tokens per held-out window
DEFAULT_TOKENS = 4096      # scored positions asked for, all domains together (heldout_windows rounds up)
SCENARIO = "quality"


def check_reference(artifact: Path, reference: Path):
    """(candidate, reference) Artifacts, or a BenchError saying what to build: the reference must be an fp32 build
    (weights, head and KV) of the same recipe as ARTIFACT."""
    from ortllm.runtime.artifact import load_artifact
    from ortllm.runtime.errors import OrtllmError

    try:
        cand, ref = load_artifact(Path(artifact)), load_artifact(Path(reference))
    except OrtllmError as e:
        raise BenchError(f"--reference: {e}") from None
    a, b = cand.manifest, ref.manifest
    hint = "ortllm build RECIPE --quant fp32 --kv fp32 --out FP32 (RECIPE: the one ARTIFACT was built from)"
    if a.source_sha256 != b.source_sha256 or a.model != b.model:
        raise BenchError(f"--reference {ref.path} is another model (recipe {b.recipe}) than {cand.path} "
                         f"(recipe {a.recipe}); build the reference with: {hint}")
    if b.quant != "fp32" or b.kv != "fp32" or b.build.get("lm_head") != "fp32":
        raise BenchError(f"--reference {ref.path} is itself quantized (quant {b.quant}, lm_head "
                         f"{b.build.get('lm_head')}, kv {b.kv}); give an fp32 build: {hint}")
    return cand, ref


class PeerFailed(BenchError):
    def __init__(self, system: str, error: Exception):
        super().__init__(f"{system}: {error}")
        self.system = system


class PeerScorer:
    """A peer driver as a fidelity scorer: the window's logits come whole from the driver (one .npy per window,
    memory-mapped, yielded chunk by chunk like ortllm's scorers, deleted when the window is done)."""

    def __init__(self, proc, tmp: Path, vocab: int):
        self.proc, self.vocab = proc, vocab
        self.path = Path(tmp) / f"{proc.spec.system}.npy"

    def logits(self, ids: list[int], chunk: int = 512):
        try:
            self.proc.logits(ids, self.path)
            arr = np.load(self.path, mmap_mode="r")
        except (RuntimeError, OSError, ValueError) as e:
            self.path.unlink(missing_ok=True)
            raise PeerFailed(self.proc.spec.system, e) from e
        try:
            if arr.shape != (len(ids), self.vocab):
                raise PeerFailed(self.proc.spec.system, RuntimeError(
                    f"logits of shape {arr.shape}, wanted ({len(ids)}, {self.vocab}): not the same vocabulary"))
            for s in range(0, len(ids), chunk):
                yield np.asarray(arr[s:s + chunk])
        finally:
            del arr
            self.path.unlink(missing_ok=True)


class _Progress:
    """score_domains' progress hook: one stderr line per window of the reference."""

    def __init__(self, total: int, ctx: int):
        self.total, self.ctx, self.done, self.windows = total, ctx, 0, 0

    def update(self, n: int):
        self.done += n
        if self.done // self.ctx > self.windows:
            self.windows = self.done // self.ctx
            print(f"quality: {self.done}/{self.total} window tokens scored", file=sys.stderr, flush=True)


def _errors(st) -> dict:
    """Standard errors of the mean of the three figures (PairedStats st)."""
    s = st.summary()
    k = st.kld_values()
    n = len(k)
    return {"kld_mean": float(k.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
            "top1_agreement": math.sqrt(s["top1_agreement"] * (1 - s["top1_agreement"]) / n) if n else 0.0,
            "ppl_ratio": s["ppl_ratio_err"]}


def quality_rows(system: str, per_domain: dict, ctx: int, reference: Path, **extra) -> list[dict]:
    """Rows of one system: QUALITY_METRICS for "all" domains together, then for each domain alone."""
    from ortllm.calibration.fidelity import PairedStats

    out = []
    for domain, st in [("all", PairedStats.merged(list(per_domain.values()))), *per_domain.items()]:
        s, err = st.summary(), _errors(st)
        for metric, unit in QUALITY_METRICS.items():
            r = row(SCENARIO, system, 1, metric, [s[metric]], unit, domain=domain, tokens=s["tokens"], ctx=ctx,
                    err=err[metric], reference=str(reference), **extra)
            r["min"], r["max"] = s[metric] - err[metric], s[metric] + err[metric]
            if metric == "kld_mean":
                r["kld_p99"] = s["kld_p99"]
            out.append(r)
    return out


def run(artifact: Path, reference: Path, peers: list[str], tokens: int = DEFAULT_TOKENS, ctx: int = QUALITY_CTX,
        threads: int | None = None, log_dir: Path | None = None, sections: dict | None = None) -> list[dict]:
    """Quality rows of ARTIFACT ("ortllm") and of each available peer against the fp32 `reference`, on held-out
    windows of `ctx` tokens (>= tokens scored positions in all). A peer that is missing, fails to start or fails
    while scoring is a warning on stderr and has no rows. sections["quality_data"] gets the held-out text's
    sources and sha256s (results.json prints it beside the rows)."""
    from ortllm.calibration.fidelity import make_scorer, score_domains
    from ortllm.calibration.heldout import heldout_windows
    from ortllm.runtime.tokenizer import Tokenizer

    cand, ref = check_reference(artifact, reference)
    tok = Tokenizer.from_dir(ref.path)
    eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
    held = heldout_windows(tok, tokens, ctx, eos)
    if sections is not None:
        sections["quality_data"] = held.report()
    threads = threads or 2
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="ortllm-peers-"))
    procs = _start(available(peers, cand.manifest.recipe), threads, log_dir)
    tmp = Path(tempfile.mkdtemp(prefix="quality-logits-", dir=log_dir))
    try:
        scorers = {"ortllm": make_scorer(cand, ctx, threads)}
        scorers.update({s: PeerScorer(p, tmp, cand.model.vocab_size) for s, p in procs.items()})
        ref_scorer = make_scorer(ref, ctx, threads)
        total = sum(len(w) for ws in held.windows.values() for w in ws)
        while True:
            try:
                per = score_domains(list(scorers.values()), ref_scorer, held.windows, ctx, _Progress(total, ctx))
                break
            except PeerFailed as e:      # the others are scored again without it
                print(f"warning: peer {e.system} has no quality rows: {e}", file=sys.stderr)
                scorers.pop(e.system)
    finally:
        for p in procs.values():
            p.close()
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for system, per_domain in zip(scorers, per):
        extra = system_info(system) if system != "ortllm" else {"artifact": str(cand.path),
                                                                  "build": cand.manifest.build}
        rows += quality_rows(system, per_domain, ctx, ref.path, **extra)
    return rows


def figures(rows: list[dict]) -> dict[str, dict]:
    """system -> {kld_mean, top1_agreement, ppl_ratio} of its all-domain quality rows."""
    out: dict[str, dict] = {}
    for r in rows:
        if r["scenario"] == SCENARIO and r.get("domain") == "all":
            out.setdefault(r["system"], {})[r["metric"]] = r["median"]
    return out


def beside(rows: list[dict]) -> list[dict]:
    """Each speed row of the peer scenarios (decode, prefill, long-context) gets "quality": its system's
    all-domain figures, or None when the run has none for it (no --reference, or the system failed to score).
    In place; returns rows."""
    q = figures(rows)
    for r in rows:
        shape = SCENARIO_SHAPES.get(r["scenario"])
        if shape and r["metric"] == shape[2]:
            r["quality"] = q.get(r["system"])
    return rows
