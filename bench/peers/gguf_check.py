"""Logits of GGUF files under llama.cpp against transformers on the hf/ directory they were written from.

Runs inside .venv-peers (llama_cpp, transformers, torch, gguf, numpy); ci/install_peers.sh runs it on every GGUF
that gguf_export.py writes, and tests/test_bench.py on llama-tiny-random:
  .venv-peers/bin/python bench/peers/gguf_check.py HF_DIR A.gguf [B.gguf ...] [--out check.json]
  .venv-peers/bin/python bench/peers/gguf_check.py REF.npz A.gguf ...
The second form compares with given logits instead of transformers (REF.npz: `ids` [T] and `logits` [T, vocab], e.g.
ortllm's fp32 engine built from A.gguf itself, so on its own dequantized weights: tests/test_bench_gguf_weights.py
checks bench/gguf_weights.py's MoE GGUFs so, which transformers 5 cannot load), gated as a file against its own
weights below (F32/F16: max |diff|; quantized: corr).

One seeded random prompt (ids >= 3, no BOS), logits at every position: position 0 has rotation angle 0, so a
wrong q/k permutation (RoPE pairing) only shows from position 1 on. Figures: max |diff| (beside the largest
|logit|), the correlation of all logits, top-1 agreement over positions. K/V cache F32 and flash attention off
(llama.cpp's defaults are an F16 cache and, on CPU, flash attention, which rounds through F16: max |diff|
~1e-3 instead of ~1e-6 on llama-tiny-random), so an F32 GGUF is compared with no rounding between.

Gates (exit status 1 when one fails):
  F32/F16 matrices   vs transformers fp32 on hf/: max |diff| <= 1e-4 x max |ref| (F32), 1e-2 x (F16).
  quantized          vs transformers on the GGUF's own weights dequantized (the same tensors, so a wrong name,
                     layout or permutation fails): corr >= 0.999. Against fp32 the figures are reported, not
                     gated: 4-bit weights move the logits of seeded random weights a lot (Q4_1 on
                     tinyllama-1.1b-shape: corr ~0.94, top-1 ~0.4) where a trained model's keep their argmax.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from gguf_export import hf_name, unpermute  # noqa: E402

MAX_REL_DIFF = {"F32": 1e-4, "F16": 1e-2}    # of max |ref logit|, by the widest matrix type in the file
MIN_CORR_DEQUANTIZED = 0.999


def load_reference(hf: Path, threads: int):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()


def logits_of(model, ids: np.ndarray) -> np.ndarray:
    """[T, vocab] fp32 logits of a transformers model."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))[None]).logits[0].float().numpy()


def load_dequantized(model, path: Path, cfg: dict) -> None:
    """Overwrite the transformers model's weights with the GGUF's, dequantized and un-permuted, one at a time."""
    import gguf
    import torch

    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name == "rope_freqs.weight":                        # computed from config.json on both sides
            continue
        shape = tuple(int(x) for x in reversed(t.shape))           # GGUF lists dims innermost first
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, kv_heads)
        with torch.no_grad():
            model.get_parameter(hf_name(t.name)).copy_(torch.from_numpy(np.ascontiguousarray(w)))


def llamacpp_logits(path: Path, ids: np.ndarray, threads: int) -> np.ndarray:
    """[T, vocab] logits of llama.cpp on the GGUF: one llama_decode of the whole prompt, logits at every position."""
    import llama_cpp as L

    @L.llama_log_callback
    def log(level, text, _user):
        if level == 4:                           # GGML_LOG_LEVEL_ERROR
            sys.stderr.write(text.decode(errors="replace"))

    L.llama_log_set(log, None)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    n = len(ids)
    c = L.llama_context_default_params()
    c.n_ctx = c.n_batch = c.n_ubatch = max(n, 32)
    c.n_threads = c.n_threads_batch = threads
    c.type_k = c.type_v = 0                      # GGML_TYPE_F32
    c.flash_attn_type = 0                        # LLAMA_FLASH_ATTN_TYPE_DISABLED
    c.no_perf = True
    ctx = L.llama_init_from_model(model, c)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not make a context for {path}")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    b = L.llama_batch_init(n, 0, 1)
    try:
        for p, t in enumerate(ids):
            b.token[p], b.pos[p], b.n_seq_id[p], b.logits[p] = int(t), p, 1, True
            b.seq_id[p][0] = 0
        b.n_tokens = n
        rc = L.llama_decode(ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        ptr = ctypes.cast(L.llama_get_logits(ctx), ctypes.POINTER(ctypes.c_float))
        out = np.ctypeslib.as_array(ptr, shape=(n, vocab)).copy()
    finally:
        L.llama_batch_free(b)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return out


def matrix_types(path: Path) -> list[str]:
    import gguf
    return sorted({t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) > 1})


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    d = np.abs(got - ref)
    return {"max_abs_diff": float(d.max()), "max_abs_ref": float(np.abs(ref).max()),
            "mean_abs_diff": float(d.mean()),
            "corr": float(np.corrcoef(ref.ravel(), got.ravel())[0, 1]),
            "top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def check(hf: Path, ggufs: list[Path], tokens: int = 32, seed: int = 0, threads: int = 2) -> list[dict]:
    """One result per GGUF: {gguf, matrix_types, vs_fp32, vs_dequantized (quantized files), bound, ok}."""
    cfg = json.loads((hf / "config.json").read_text())
    ids = np.random.default_rng(seed).integers(3, cfg["vocab_size"], tokens)
    model = load_reference(hf, threads)
    ref = logits_of(model, ids)
    results = []
    for path in ggufs:
        types = matrix_types(path)
        got = llamacpp_logits(path, ids, threads)
        r = {"gguf": str(path), "tokens": tokens, "seed": seed, "matrix_types": types, "vs_fp32": compare(ref, got)}
        if set(types) <= {"F32", "F16"}:
            bound = MAX_REL_DIFF["F16" if "F16" in types else "F32"] * r["vs_fp32"]["max_abs_ref"]
            r["bound"] = f"vs fp32: max_abs_diff <= {bound:.3g}"
            r["ok"] = r["vs_fp32"]["max_abs_diff"] <= bound
        else:
            if model is None:
                model = load_reference(hf, threads)
            load_dequantized(model, path, cfg)
            r["vs_dequantized"] = compare(logits_of(model, ids), got)
            model = None                                   # its weights are this file's now
            r["bound"] = f"vs dequantized: corr >= {MIN_CORR_DEQUANTIZED}"
            r["ok"] = r["vs_dequantized"]["corr"] >= MIN_CORR_DEQUANTIZED
        results.append(r)
    return results


def check_reference(ref: Path, ggufs: list[Path], threads: int = 2) -> list[dict]:
    """check() against REF.npz's logits of its ids (the module docstring's second form): {gguf, matrix_types,
    vs_reference, bound, ok} per GGUF."""
    saved = np.load(ref)
    ids, want = saved["ids"], saved["logits"]
    results = []
    for path in ggufs:
        types = matrix_types(path)
        r = {"gguf": str(path), "tokens": len(ids), "matrix_types": types,
             "vs_reference": compare(want, llamacpp_logits(path, ids, threads))}
        if set(types) <= {"F32", "F16"}:
            bound = MAX_REL_DIFF["F16" if "F16" in types else "F32"] * r["vs_reference"]["max_abs_ref"]
            r["bound"], r["ok"] = f"max_abs_diff <= {bound:.3g}", r["vs_reference"]["max_abs_diff"] <= bound
        else:
            r["bound"] = f"corr >= {MIN_CORR_DEQUANTIZED}"
            r["ok"] = r["vs_reference"]["corr"] >= MIN_CORR_DEQUANTIZED
        results.append(r)
    return results


def _line(name: str, c: dict) -> str:
    return (f"vs {name}: max|diff| {c['max_abs_diff']:.3g} (max|ref| {c['max_abs_ref']:.3g}), "
            f"corr {c['corr']:.5f}, top-1 {c['top1_agreement']:.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hf", type=Path, help="the transformers directory, or REF.npz (ids, logits) to compare with")
    p.add_argument("gguf", type=Path, nargs="+")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here too")
    a = p.parse_args(argv)
    if a.hf.suffix == ".npz":
        results = check_reference(a.hf, a.gguf, a.threads)
    else:
        results = check(a.hf, a.gguf, a.tokens, a.seed, a.threads)
    for r in results:
        parts = [_line(k.removeprefix("vs_"), r[k]) for k in ("vs_reference", "vs_fp32", "vs_dequantized") if k in r]
        print(f"gguf_check: {Path(r['gguf']).name} ({'/'.join(r['matrix_types'])}, {r['tokens']} positions): "
              f"{'; '.join(parts)}: {'ok' if r['ok'] else 'FAILED'} ({r['bound']})", file=sys.stderr)
    if a.out:
        a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
