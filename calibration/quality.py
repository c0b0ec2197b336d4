"""quality.json of a quantized build: per-tensor quantization error plus a short paired fidelity check.

`ortllm build` calls `in_build_quality` with the artifact directory being assembled and the same weights
built in fp32 (fp32 KV) beside it. The token stream is the head of the fidelity stream (calibration/data.py)
when the artifact has a tokenizer, else seeded random ids; one window of `opts.quality_tokens` tokens.
The full-size numbers come from `ortllm eval` (docs/quality.md).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from .fidelity import draft_artifact, make_scorer, score_pair

QUALITY_VERSION = 1


def _tokens(art_dir: Path, n: int, vocab: int) -> tuple[list[int], dict, str]:
    from ortllm.runtime.tokenizer import Tokenizer

    from .data import fidelity_windows

    try:
        tok = Tokenizer.from_dir(art_dir)
    except Exception:   # noqa: BLE001 - artifacts without a tokenizer (random test models) score random ids
        tok = None
    if tok is not None:
        eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
        w = fidelity_windows(tok, n - 1, n, eos)
        return w.windows[0], w.sha256, w.sources
    ids = np.random.default_rng(0).integers(0, vocab, n).tolist()
    return ids, {}, "seeded random token ids (numpy default_rng(0); the artifact has no tokenizer)"


def tensor_summary(report: dict) -> dict:
    if not report:
        return {}
    rms = [v["rms_rel"] for v in report.values()]
    worst = max(report, key=lambda k: report[k]["rms_rel"])
    return {"tensors": len(report), "rms_rel_mean": float(np.mean(rms)), "rms_rel_max": float(max(rms)),
            "max_rel_max": float(max(v["max_rel"] for v in report.values())), "worst_tensor": worst}


def in_build_quality(weights, art_dir: Path, ref_dir: Path, opts, ref_opts, tensor_report: dict) -> dict:
    cfg = weights.config.to_dict()
    n = opts.quality_tokens
    ids, sha, sources = _tokens(art_dir, n, cfg["vocab_size"])
    cand = make_scorer(draft_artifact(art_dir, {"graph": opts.graph, "model": cfg, "build": asdict(opts)}), n)
    ref = make_scorer(draft_artifact(ref_dir, {"graph": opts.graph, "model": cfg, "build": asdict(ref_opts)}), n)
    fidelity = score_pair(cand, ref, [ids]).summary()
    return {
        "version": QUALITY_VERSION,
        "reference": "the same weights built in fp32 with an fp32 KV cache (same graph kind), in the build",
        "build": asdict(opts),
        "fidelity": fidelity,
        "data": {"sources": sources, "sha256": sha, "windows": 1, "ctx": n},
        "tensors": tensor_report,
        "tensor_summary": tensor_summary(tensor_report),
        "command": "ortllm eval ARTIFACT --reference FP32_ARTIFACT --suite fidelity for the full-size figures",
    }
