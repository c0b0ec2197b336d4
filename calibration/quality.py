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

import hashlib
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


# The reference's logits of the last in-build check, for the next build of the same weights in this process (a
# test session builds SmolLM2 seven ways, each against the same fp32 reference): {"key": ..., "logits":
# {(window sha256, chunk): [chunk logits (n, vocab) float32]}}. The key holds everything the logits depend on (the
# reference graph's bytes, the ops library's bytes and kernel path, the graph kind, ctx), so a hit returns the very
# arrays a new run computes. One reference at a time: ~0.9 GB for 4.6k positions of a 49k vocabulary.
_REFERENCE_MEMO: dict = {"key": None, "logits": {}}


def _reference_key(ref_dir: Path, graph: str, ctx: int) -> str:
    from ortllm.runtime.artifact import sha256_file
    from ortllm.runtime.ops_library import ops_isa, ops_library_path

    parts = [graph, str(ctx)]
    if graph == "engine":
        parts += [ops_isa(), sha256_file(ops_library_path())]
    parts += [f"{p.relative_to(ref_dir)}={sha256_file(p)}" for p in sorted(ref_dir.rglob("*")) if p.is_file()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class _MemoReference:
    """A reference scorer that computes each window's logits once per reference (_REFERENCE_MEMO); its session
    is only made on a miss."""

    def __init__(self, make, key: str):
        if _REFERENCE_MEMO["key"] != key:
            _REFERENCE_MEMO.update(key=key, logits={})
        self._make, self._scorer, self._store = make, None, _REFERENCE_MEMO["logits"]

    def logits(self, ids: list[int], chunk: int = 512):
        k = (hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest(), chunk)
        if k not in self._store:
            if self._scorer is None:
                self._scorer = self._make()
            self._store[k] = list(self._scorer.logits(ids, chunk))
        yield from self._store[k]


WHOLE_REFERENCE = "the same weights built in fp32 with an fp32 KV cache (same graph kind), in the build"


def in_build_quality(weights, art_dir: Path, reference, opts, ref_opts, tensor_report: dict) -> dict:
    """reference: the fp32 artifact's directory (built whole beside art_dir), or the pipeline's layer-by-layer
    reference (pipeline/layer_reference.py LayerReference: scorer(windows), for models whose fp32 copy does not
    fit), run over all windows before the candidate's session is made, so the two are never in memory at once."""
    from ortllm.runtime.ops_library import ops_isa

    cfg = weights.config.to_dict()
    windows, data = _windows(art_dir, opts.quality_tokens, cfg)
    ctx = max(len(w) for ws in windows.values() for w in ws)
    if isinstance(reference, Path):
        ref_art = draft_artifact(reference, {"graph": opts.graph, "model": cfg, "build": asdict(ref_opts)})
        ref = _MemoReference(lambda: make_scorer(ref_art, ctx), _reference_key(reference, opts.graph, ctx))
        described = WHOLE_REFERENCE
    else:
        ref = reference.scorer([w for ws in windows.values() for w in ws])
        described = reference.description
    cand = make_scorer(draft_artifact(art_dir, {"graph": opts.graph, "model": cfg, "build": asdict(opts)}), ctx)
    isa = ops_isa() if opts.graph == "engine" else None
    fidelity = {**domain_summary(score_domains([cand], ref, windows)[0]), "isa": isa}
    return {
        "version": QUALITY_VERSION,
        "reference": described,
        "build": asdict(opts),
        "isa": isa,
        "fidelity": fidelity,
        "data": data,
        "tensors": tensor_report,
        "tensor_summary": tensor_summary(tensor_report),
        "command": "ortllm eval ARTIFACT --reference FP32_ARTIFACT --suite fidelity for the full-size figures",
    }
