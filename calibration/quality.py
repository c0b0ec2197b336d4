"""quality.json of a quantized build: per-tensor quantization error plus a paired fidelity check on held-out text.

`ortllm build` calls `in_build_quality` with the artifact directory being assembled and the same weights
built in fp32 (fp32 KV) beside it. The text is the held-out evaluation text (calibration/heldout.py: prose,
code and chat, from sources calibration never reads), `opts.quality_tokens` scored positions split evenly over
the three domains in windows of QUALITY_CTX tokens; each domain is reported on its own and all together, with
the PPL ratio's standard error. Artifacts without a tokenizer score seeded random ids.
The figures hold for the ops library's kernel path of the building process, named as "isa".
The full-size numbers come from `ortllm eval` (docs/quality.md).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from .fidelity import domain_summary, draft_artifact, make_scorer, score_domains

QUALITY_VERSION = 2
QUALITY_CTX = 512                # tokens per window of the in-build check


def _windows(art_dir: Path, tokens: int, cfg: dict) -> tuple[dict[str, list[list[int]]], dict]:
    """domain -> windows, and the report's data section."""
    from ortllm.runtime.tokenizer import Tokenizer

    from .heldout import heldout_windows

    ctx = min(QUALITY_CTX, tokens + 1, cfg["max_position_embeddings"])
    try:
        tok = Tokenizer.from_dir(art_dir)
    except Exception:   # noqa: BLE001 - artifacts without a tokenizer (random test models) score random ids
        tok = None
    if tok is not None:
        eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
        held = heldout_windows(tok, tokens, ctx, eos)
        return held.windows, held.report()
    n = -(-tokens // (ctx - 1))
    ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], n * ctx).tolist()
    windows = [ids[i * ctx:(i + 1) * ctx] for i in range(n)]
    return {"random": windows}, {"random": {
        "description": "seeded random token ids (numpy default_rng(0); the artifact has no tokenizer)",
        "windows": n, "ctx": ctx}}


def tensor_summary(report: dict) -> dict:
    if not report:
        return {}
    rms = [v["rms_rel"] for v in report.values()]
    worst = max(report, key=lambda k: report[k]["rms_rel"])
    return {"tensors": len(report), "rms_rel_mean": float(np.mean(rms)), "rms_rel_max": float(max(rms)),
            "max_rel_max": float(max(v["max_rel"] for v in report.values())), "worst_tensor": worst}


def in_build_quality(weights, art_dir: Path, ref_dir: Path, opts, ref_opts, tensor_report: dict) -> dict:
    from ortllm.runtime.ops_library import ops_isa

    cfg = weights.config.to_dict()
    windows, data = _windows(art_dir, opts.quality_tokens, cfg)
    ctx = max(len(w) for ws in windows.values() for w in ws)
    cand = make_scorer(draft_artifact(art_dir, {"graph": opts.graph, "model": cfg, "build": asdict(opts)}), ctx)
    ref = make_scorer(draft_artifact(ref_dir, {"graph": opts.graph, "model": cfg, "build": asdict(ref_opts)}), ctx)
    isa = ops_isa() if opts.graph == "engine" else None
    fidelity = {**domain_summary(score_domains([cand], ref, windows)[0]), "isa": isa}
    return {
        "version": QUALITY_VERSION,
        "reference": "the same weights built in fp32 with an fp32 KV cache (same graph kind), in the build",
        "build": asdict(opts),
        "isa": isa,
        "fidelity": fidelity,
        "data": data,
        "tensors": tensor_report,
        "tensor_summary": tensor_summary(tensor_report),
        "command": "ortllm eval ARTIFACT --reference FP32_ARTIFACT --suite fidelity for the full-size figures",
    }
