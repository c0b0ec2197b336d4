"""Custom-ops microbenchmark (`ortllm bench --scenario ops`).

Same run, same thread count, systems alternated round by round; medians with min/max:
  - PagedAttention (float32 / int8 / fp8_e4m3 cache) vs ORT com.microsoft GroupQueryAttention (fp32, CPU)
    for one SmolLM2-135M layer (9 heads, 3 kv heads, head_dim 64, block 16): decode B = 1, 8, 16 at
    context 128 / 512 / 2048 and prefill 512. Caches are bound with IO binding, output = input buffer,
    for both systems (GQA's past/present share one buffer), so neither copies the past;
  - PagedAttention per call at a B = 1 decode step (`--only paged_attention`): 30 nodes in one graph (SmolLM2's
    layers, each with its own cache: at context 2048 the caches stream from memory as in the engine), context 64
    (the per-call fixed cost) and 2048 (block tables shuffled, and in pool order), float32 and int8 caches;
    `--baseline LIB` alternates another build of
    libortllm_ops.so in the same process (A/B, paired ratios); `--spinning`: ORT's default pool (the engine's
    setting; on a shared machine the spinning worker competes with the timed thread, so not the default here);
  - MultiLoRA vs the plain-ONNX equivalent (Gather + MatMul + MatMul + Add), 1/2/4 adapters, T = 16
    (MultiLoRA's A/B slot stacks in float16, as the engine binds them; the stock-ops graph's in float32);
  - MultiLoRA (4 adapters, rank 16) added to a MatMulNBits int4 projection (576->576, 576->1536,
    block 32, accuracy_level 4) at T = 16: the added latency in percent.
results.json = {"machine", "commit", "command", "results": [{scenario, system, batch, metric, median,
min, max, unit}, ...]}.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from ortllm.runtime.config import CacheConfig
from ortllm.runtime.contract import cache_kinds

from . import qlinear
from .op_graphs import (F16, F32, I32, U8, model, multi_lora_model, multi_lora_node, paged_attention_model,
                        paged_attention_node, rope_cache, value_info)
from .timing import Runner, compare, ratio_row, us_row

H, HKV, D, BS = 9, 3, 64, 16          # SmolLM2-135M attention
HIDDEN = H * D                          # 576
MAX_POS = 4096
LAYERS = 30                             # SmolLM2-135M


# ---------------------------------------------------------------- attention

def _pa_layer(rng, B, ctx, new, kv_dtype, suffix="", ordered=False):
    """One layer's PagedAttention inputs (B sequences, `ctx` cached and `new` new tokens each): feeds, the
    node's input and output names, the output -> input aliases (in-place cache update) and the input types.
    `suffix` names this layer's caches (several layers in one graph share q, k, v and the indices); ordered:
    the block table lists the pool's blocks in order (what the engine's pool gives a fresh sequence), else
    shuffled (a pool after much allocating and freeing)."""
    eight = kv_dtype != "float32"
    bps = -(-(ctx + new) // BS)
    nb = B * bps
    T = B * new
    cos, sin = rope_cache(MAX_POS, D)
    cache_t = np.uint8 if eight else np.float32
    shape = (nb, HKV, BS, D)
    feeds = {
        "q": rng.standard_normal((T, HIDDEN), dtype=np.float32),
        "k": rng.standard_normal((T, HKV * D), dtype=np.float32),
        "v": rng.standard_normal((T, HKV * D), dtype=np.float32),
        "positions": np.tile(np.arange(ctx, ctx + new, dtype=np.int32), B),
        "cu_seqlens": (np.arange(B + 1) * new).astype(np.int32),
        "context_lens": np.full(B, ctx, np.int32),
        "block_tables": (np.arange(nb) if ordered else rng.permutation(nb)).astype(np.int32).reshape(B, bps),
        "cos_cache": cos, "sin_cache": sin,
        "key_cache" + suffix: (rng.integers(0, 120, shape).astype(cache_t) if eight
                               else rng.standard_normal(shape, dtype=np.float32)),
        "value_cache" + suffix: (rng.integers(0, 120, shape).astype(cache_t) if eight
                                 else rng.standard_normal(shape, dtype=np.float32)),
    }
    kinds = cache_kinds(eight)
    if eight:
        feeds["key_scales" + suffix] = np.full(shape[:3], 0.01, np.float16)
        feeds["value_scales" + suffix] = np.full(shape[:3], 0.01, np.float16)
    names = ["q", "k", "v", "positions", "cu_seqlens", "context_lens", "block_tables", "cos_cache",
             "sin_cache"] + [kind + suffix for kind in kinds]
    outs = ["attn" + suffix] + [kind.replace("_cache", "_cache_out").replace("_scales", "_scales_out") + suffix
                                for kind in kinds]
    aliases = dict(zip(outs[1:], names[9:]))
    ctype = U8 if eight else F32
    types = {"positions": I32, "cu_seqlens": I32, "context_lens": I32, "block_tables": I32}
    types.update({n: {"key_cache": ctype, "value_cache": ctype}.get(n.removesuffix(suffix), F16) for n in names[9:]})
    return feeds, names, outs, aliases, types


def paged_attention_runner(rng, B, ctx, new, kv_dtype, threads):
    """B sequences with `ctx` cached tokens and `new` new tokens each, one layer."""
    feeds, _, _, aliases, _ = _pa_layer(rng, B, ctx, new, kv_dtype)
    graph = paged_attention_model(num_heads=H, kv_num_heads=HKV, head_size=D, block_size=BS, kv_dtype=kv_dtype)
    return Runner(graph, feeds, threads, aliases)


def paged_attention_layers_runner(rng, ctx, kv_dtype, threads, layers=LAYERS, library=None, spinning=False,
                                  ordered=False):
    """One decode token (B = 1) at context `ctx` through `layers` PagedAttention nodes, each with its own
    cache (as the engine's layers: at context 2048 the caches stream from memory), in one graph, so
    session.run's own cost is shared by `layers` calls; per call = a run / layers. library: another build of
    libortllm_ops.so (A/B against an older one in the same process); spinning: ORT's default (the engine's)."""
    feeds, inputs, outputs, nodes, aliases = {}, [], [], [], {}
    for i in range(layers):
        f, names, outs, al, types = _pa_layer(rng, 1, ctx, 1, kv_dtype, suffix=f".{i}", ordered=ordered)
        for n in names:
            if n not in feeds:
                feeds[n] = f[n]
                inputs.append(value_info(n, types.get(n, F32), f[n].ndim))
        outputs += [value_info(outs[0], F32, 2)] + [value_info(o, types[al[o]], f[al[o]].ndim) for o in outs[1:]]
        nodes.append(paged_attention_node(names, outs, name=f"/model/layers.{i}/attn/PagedAttention", num_heads=H,
                                          kv_num_heads=HKV, head_size=D, block_size=BS, kv_dtype=kv_dtype))
        aliases.update(al)
    return Runner(model(nodes, inputs, outputs), feeds, threads, aliases, library=library, spinning=spinning)


def gqa_runner(rng, B, ctx, new, threads):
    """com.microsoft GroupQueryAttention fp32 with rotary; past and present share one buffer."""
    cap = ctx + new
    cos, sin = rope_cache(MAX_POS, D)
    feeds = {
        "query": rng.standard_normal((B, new, HIDDEN), dtype=np.float32),
        "key": rng.standard_normal((B, new, HKV * D), dtype=np.float32),
        "value": rng.standard_normal((B, new, HKV * D), dtype=np.float32),
        "past_key": rng.standard_normal((B, HKV, cap, D), dtype=np.float32),
        "past_value": rng.standard_normal((B, HKV, cap, D), dtype=np.float32),
        "seqlens_k": np.full(B, ctx + new - 1, np.int32),
        "total_sequence_length": np.array(ctx + new, np.int32),
        "cos_cache": cos, "sin_cache": sin,
    }
    names = list(feeds)
    types = {"seqlens_k": I32, "total_sequence_length": I32}
    inputs = [value_info(n, types.get(n, F32), feeds[n].ndim) for n in names]
    outputs = [value_info("output", F32, 3), value_info("present_key", F32, 4), value_info("present_value", F32, 4)]
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=H, kv_num_heads=HKV, do_rotary=1,
                            scale=float(1 / np.sqrt(D)))
    return Runner(model([node], inputs, outputs, domains=("com.microsoft",)), feeds, threads,
                  {"present_key": "past_key", "present_value": "past_value"})


def kv_bytes_per_token(kv_dtype: str) -> int:
    """Per layer: K and V rows of every kv head (+ the 8-bit caches' per-row scales), as the engine sizes its
    pool (CacheConfig.bytes_per_block for one layer and a one-token block)."""
    return CacheConfig(block_size=1).bytes_per_block(1, HKV, D, kv_dtype)


# ---------------------------------------------------------------- LoRA

def _lora_feeds(rng, T, in_dim, out_dim, n_adapters, rank, n_slots) -> dict:
    """x [T, in], base_y [T, out], A [slots, in, r], B [slots, r, out], scale, rank, token_adapter [T].
    A and B are float32 here (the stock-ops graph's); MultiLoRA takes them as float16 (_to_f16_stacks)."""
    return {
        "x": rng.standard_normal((T, in_dim), dtype=np.float32),
        "base_y": rng.standard_normal((T, out_dim), dtype=np.float32),
        "A": rng.standard_normal((n_slots, in_dim, rank), dtype=np.float32),
        "B": rng.standard_normal((n_slots, rank, out_dim), dtype=np.float32),
        "scale": np.ones(n_slots, np.float32),
        "rank": np.full(n_slots, rank, np.int32),
        "token_adapter": (np.arange(T) % n_adapters).astype(np.int32),
    }


def _to_f16_stacks(feeds: dict) -> dict:
    """MultiLoRA's A/B slot stacks are float16 (what the engine binds)."""
    return {n: v.astype(np.float16) if n in ("A", "B") else v for n, v in feeds.items()}


def multi_lora_runner(rng, T, in_dim, out_dim, n_adapters, rank, threads, n_slots=8):
    feeds = _to_f16_stacks(_lora_feeds(rng, T, in_dim, out_dim, n_adapters, rank, n_slots))
    return Runner(multi_lora_model(), feeds, threads)


def plain_lora_runner(rng, T, in_dim, out_dim, n_adapters, rank, threads, n_slots=8):
    """y = base_y + scale[a] * (x @ A[a]) @ B[a] per token with stock ONNX ops (per-token gathers)."""
    feeds = _lora_feeds(rng, T, in_dim, out_dim, n_adapters, rank, n_slots)
    del feeds["rank"]           # the stock-ops graph uses every row of A and B
    c = lambda name, v: helper.make_node("Constant", [], [name], value=helper.make_tensor(  # noqa: E731
        name, TensorProto.INT64, [len(v)], v))
    nodes = [
        c("ax1", [1]),
        helper.make_node("Gather", ["A", "token_adapter"], ["A_t"], axis=0),        # [T, in, r]
        helper.make_node("Gather", ["B", "token_adapter"], ["B_t"], axis=0),        # [T, r, out]
        helper.make_node("Gather", ["scale", "token_adapter"], ["s_t"], axis=0),    # [T]
        helper.make_node("Unsqueeze", ["s_t", "ax1"], ["s_t2"]),                    # [T, 1]
        helper.make_node("Unsqueeze", ["x", "ax1"], ["x3"]),                        # [T, 1, in]
        helper.make_node("MatMul", ["x3", "A_t"], ["h"]),                           # [T, 1, r]
        helper.make_node("MatMul", ["h", "B_t"], ["d3"]),                           # [T, 1, out]
        helper.make_node("Squeeze", ["d3", "ax1"], ["d"]),                          # [T, out]
        helper.make_node("Mul", ["d", "s_t2"], ["ds"]),
        helper.make_node("Add", ["base_y", "ds"], ["y"]),
    ]
    types = {"token_adapter": I32}
    inputs = [value_info(n, types.get(n, F32), v.ndim) for n, v in feeds.items()]
    return Runner(model(nodes, inputs, [value_info("y", F32, 2)], domains=()), feeds, threads)


def nbits_runner(rng, T, K, N, threads, lora_adapters=0, rank=16, n_slots=8, copies=8):
    """`copies` independent MatMulNBits int4 projections of x (block 32, accuracy_level 4, distinct
    weights), each optionally followed by MultiLoRA on its output, all concatenated into y; one graph, so
    the per-run overhead of session.run is shared by `copies` projections. Reported per projection."""
    blocks = K // 32
    feeds = {"x": rng.standard_normal((T, K), dtype=np.float32)}
    inits, nodes = [], []
    domains = ["com.microsoft"] + (["ortllm"] if lora_adapters else [])
    if lora_adapters:
        feeds.update({
            "scale": np.ones(n_slots, np.float32),
            "rank": np.full(n_slots, rank, np.int32),
            "token_adapter": (np.arange(T) % lora_adapters).astype(np.int32),
        })
    for i in range(copies):
        inits += [
            helper.make_tensor(f"W{i}", U8, [N, blocks, 16],
                               rng.integers(0, 256, (N, blocks, 16), dtype=np.uint8).tobytes(), raw=True),
            helper.make_tensor(f"W{i}_scales", F32, [N * blocks],
                               (rng.random(N * blocks, dtype=np.float32) * 0.02).tobytes(), raw=True),
        ]
        mm_out = f"base{i}" if lora_adapters else f"y{i}"
        nodes.append(helper.make_node("MatMulNBits", ["x", f"W{i}", f"W{i}_scales"], [mm_out], domain="com.microsoft",
                                      K=K, N=N, bits=4, block_size=32, accuracy_level=4))
        if lora_adapters:
            feeds[f"A{i}"] = (rng.standard_normal((n_slots, K, rank), dtype=np.float32) * 0.05).astype(np.float16)
            feeds[f"B{i}"] = (rng.standard_normal((n_slots, rank, N), dtype=np.float32) * 0.05).astype(np.float16)
            nodes.append(multi_lora_node(["x", mm_out, f"A{i}", f"B{i}", "scale", "rank", "token_adapter"], [f"y{i}"]))
    # the projections' outputs feed a Concat (both systems), as each feeds the next node in the engine:
    # intermediate outputs are what ORT lets MultiLoRA's y share with its base_y
    nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(copies)], ["y"], axis=1))
    outputs = [value_info("y", F32, ["T", copies * N])]
    types = {"rank": I32, "token_adapter": I32, **{n: F16 for n, v in feeds.items() if v.dtype == np.float16}}
    # x [T, K] with a named token dim, as in the engine's graphs: shapes propagate through MatMulNBits,
    # so ORT can give MultiLoRA's y the projection's buffer (no copy), as it does in the engine
    inputs = [value_info("x", F32, ["T", K])]
    inputs += [value_info(n, types.get(n, F32), v.ndim) for n, v in feeds.items() if n != "x"]
    return Runner(model(nodes, inputs, outputs, inits, domains), feeds, threads)


# ---------------------------------------------------------------- driver

def run(out_dir: Path, threads: int = 2, quick: bool = False, only: str | None = None,
        baseline: Path | None = None, spinning: bool = False) -> list[dict]:
    """The rows; the caller writes results.json (results.write_results: `ortllm bench --scenario ops` or main).
    only="qlinear" / "paged_attention": just that part (the whole ops bench takes minutes); baseline: another
    build of libortllm_ops.so that the PagedAttention per-call case alternates with (A/B in one process);
    spinning: that case on ORT's default spinning pool."""
    rng = np.random.default_rng(0)
    rounds, target = (3, 0.02) if quick else (9, 0.08)
    rows: list[dict] = []

    def log(msg):
        print(f"[bench ops] {msg}", file=sys.stderr, flush=True)

    if only is None:
        _attention_and_lora(rows, rng, threads, rounds, target, log, quick)
    if only in (None, "paged_attention"):
        _paged_attention_calls(rows, rng, threads, rounds, target, log, quick, baseline, spinning)
    if only in (None, "qlinear"):
        # -- QLinear against MatMulNBits (and the engine's former MatMulNBits + MultiLoRA pair)
        qlinear.run(rows, rng, threads, rounds, target, log, quick=quick)
    return rows


def _paged_attention_calls(rows, rng, threads, rounds, target, log, quick, baseline, spinning):
    """PagedAttention per call at a B = 1 decode step (SmolLM2: 30 layers in one graph), context 64 (the fixed
    cost: the work is a few microseconds) and 2048 (the caches stream from memory; block tables shuffled, and in
    pool order as a fresh sequence gets them), float32 and int8 caches; with a baseline library, old and new
    alternate round by round."""
    for ctx, ordered in ((64, False), (2048, False), (2048, True)):
        for kv in ("float32", "int8"):
            scen = f"ops/attention/decode_per_call_ctx{ctx}{'_ordered_blocks' if ordered else ''}_{kv}"
            built = {f"ortllm PagedAttention {kv}": paged_attention_layers_runner(rng, ctx, kv, threads,
                                                                                  spinning=spinning, ordered=ordered)}
            if baseline is not None:
                built[f"baseline PagedAttention {kv}"] = paged_attention_layers_runner(
                    rng, ctx, kv, threads, library=baseline, spinning=spinning, ordered=ordered)
            samples = compare({n: r.run for n, r in built.items()}, rounds * (1 if quick else 2), target)
            samples = {n: [v / LAYERS for v in vals] for n, vals in samples.items()}
            for name, vals in samples.items():
                rows.append(us_row(scen, name + " (per call)", 1, "latency", vals, "us"))
            msg = ", ".join(f"{n.split()[0]} {np.median(v) * 1e6:.1f}us" for n, v in samples.items())
            if baseline is not None:
                new, old = samples[f"ortllm PagedAttention {kv}"], samples[f"baseline PagedAttention {kv}"]
                rows.append(ratio_row(scen, "ortllm vs baseline library", 1, "speedup", old, new))
                paired = np.asarray(old) / np.asarray(new)   # round by round (the two ran back to back)
                msg += f", speedup {np.median(old) / np.median(new):.2f}x (paired rounds {np.median(paired):.2f}x)"
            log(f"{scen}: {msg} per call")


def _attention_and_lora(rows, rng, threads, rounds, target, log, quick):
    # -- attention: decode and prefill
    cases = [("decode", B, ctx, 1) for ctx in (128, 512, 2048) for B in (1, 8, 16)]
    cases.append(("prefill", 1, 0, 512))
    if quick:
        cases = [("decode", 1, 2048, 1), ("decode", 16, 512, 1), ("prefill", 1, 0, 512)]
    for kind, B, ctx, new in cases:
        scen = f"ops/attention/{kind}" + (f"_ctx{ctx}" if kind == "decode" else f"{new}")
        systems = {
            "ORT GroupQueryAttention fp32": gqa_runner(rng, B, ctx, new, threads).run,
            "ortllm PagedAttention fp32": paged_attention_runner(rng, B, ctx, new, "float32", threads).run,
            "ortllm PagedAttention int8": paged_attention_runner(rng, B, ctx, new, "int8", threads).run,
            "ortllm PagedAttention fp8_e4m3": paged_attention_runner(rng, B, ctx, new, "fp8_e4m3", threads).run,
        }
        samples = compare(systems, rounds, target)
        for name, vals in samples.items():
            rows.append(us_row(scen, name, B, "latency", vals, "us"))
        gqa = samples["ORT GroupQueryAttention fp32"]
        for name in list(systems)[1:]:
            rows.append(ratio_row(scen, f"{name} vs GQA fp32", B, "speedup", gqa, samples[name]))
        log(f"{scen} B={B}: " + ", ".join(f"{n.split()[-1] if 'Paged' in n else 'GQA'} "
                                         f"{np.median(v) * 1e6:.0f}us" for n, v in samples.items()))
    for kv in ("float32", "int8", "fp8_e4m3"):
        b = kv_bytes_per_token(kv)
        rows.append({"scenario": "ops/attention/kv_bytes", "system": f"ortllm PagedAttention {kv}", "batch": 1,
                     "metric": "kv_bytes_per_token_per_layer", "median": b, "min": b, "max": b, "unit": "bytes"})

    # -- MultiLoRA vs plain ONNX
    T, rank = 16, 16
    for n_ad in (1, 2, 4):
        scen = f"ops/lora/T{T}_r{rank}_{n_ad}adapters_576x576"
        systems = {
            "ortllm MultiLoRA": multi_lora_runner(rng, T, HIDDEN, HIDDEN, n_ad, rank, threads).run,
            "ONNX Gather+MatMul+MatMul+Add": plain_lora_runner(rng, T, HIDDEN, HIDDEN, n_ad, rank, threads).run,
        }
        samples = compare(systems, rounds, target)
        for name, vals in samples.items():
            rows.append(us_row(scen, name, T, "latency", vals, "us"))
        rows.append(ratio_row(scen, "ortllm MultiLoRA vs plain ONNX", T, "speedup",
                               samples["ONNX Gather+MatMul+MatMul+Add"], samples["ortllm MultiLoRA"]))
        log(f"{scen}: " + ", ".join(f"{n} {np.median(v) * 1e6:.1f}us" for n, v in samples.items()))

    # -- MultiLoRA cost on top of an int4 projection (8 projections per graph, per-projection figures)
    copies = 8
    for N in (576, 1536):  # more rounds: the added cost is a difference of two timings
        scen = f"ops/lora_vs_int4/T{T}_576x{N}"
        systems = {
            "MatMulNBits int4": nbits_runner(rng, T, HIDDEN, N, threads, copies=copies).run,
            "MatMulNBits int4 + MultiLoRA 4x r16": nbits_runner(rng, T, HIDDEN, N, threads, lora_adapters=4,
                                                                copies=copies).run,
        }
        samples = compare(systems, rounds * 2 + 1, target)
        samples = {k: [x / copies for x in v] for k, v in samples.items()}
        for name, vals in samples.items():
            rows.append(us_row(scen, name + " (per projection)", T, "latency", vals, "us"))
        base, both = np.asarray(samples["MatMulNBits int4"]), np.asarray(samples["MatMulNBits int4 + MultiLoRA 4x r16"])
        over = (np.median(both) - np.median(base)) / np.median(base) * 100
        paired = (both - base) / base * 100  # round by round (the two ran back to back)
        rows.append({"scenario": scen, "system": "MultiLoRA 4x r16 added to MatMulNBits int4", "batch": T,
                     "metric": "added_latency", "median": round(float(over), 2),
                     "min": round(float(paired.min()), 2), "max": round(float(paired.max()), 2), "unit": "%"})
        log(f"{scen}: " + ", ".join(f"{n} {np.median(v) * 1e6:.1f}us" for n, v in samples.items())
            + f" per projection, added {over:.1f}% (paired rounds {np.median(paired):.1f}%)")


def markdown(doc: dict) -> str:
    """Tables for docs/benchmarks.md from a results.json document."""
    rows = doc["results"]
    lat = {(r["scenario"], r["system"], r["batch"]): r for r in rows if r["metric"] == "latency"}
    fmt = lambda r: f"{r['median']:.0f} ({r['min']:.0f}-{r['max']:.0f})"  # noqa: E731
    out = ["| case | B | GQA fp32 | PA fp32 | PA int8 | PA fp8_e4m3 | int8 speedup vs GQA |",
           "|---|---|---|---|---|---|---|"]
    per_call = [r for r in rows if "decode_per_call" in r["scenario"] and r["metric"] == "latency"]
    attn = sorted({(r["scenario"], r["batch"]) for r in rows if r["scenario"].startswith("ops/attention/")
                   and r["metric"] == "latency" and r not in per_call},
                  key=lambda sb: (sb[0].startswith("ops/attention/prefill"), int("".join(
                      c for c in sb[0].rsplit("ctx", 1)[-1] if c.isdigit()) or 0), sb[1]))
    for scen, b in attn:
        cells = [lat[(scen, n, b)] for n in ("ORT GroupQueryAttention fp32", "ortllm PagedAttention fp32",
                                              "ortllm PagedAttention int8", "ortllm PagedAttention fp8_e4m3")]
        sp = next(r for r in rows if r["scenario"] == scen and r["batch"] == b
                  and r["system"] == "ortllm PagedAttention int8 vs GQA fp32")
        out.append(f"| {scen.rsplit('/', 1)[-1]} | {b} | " + " | ".join(fmt(c) for c in cells)
                   + f" | {sp['median']:.2f}x |")
    if per_call:
        out += ["", "| PagedAttention per call, B = 1 decode (30 layers in one graph) | system | us |", "|---|---|---|"]
        out += [f"| {r['scenario'].rsplit('/', 1)[-1]} | {r['system']} | {fmt(r)} |" for r in per_call]
    out += ["", "| KV cache | bytes per token per layer (SmolLM2: 3 kv heads x 64) |", "|---|---|"]
    out += [f"| {r['system'].split()[-1]} | {r['median']} |" for r in rows if r["scenario"] == "ops/attention/kv_bytes"]
    out += ["", "| case | system | median (min-max) |", "|---|---|---|"]
    for r in rows:
        if r["scenario"].startswith("ops/lora"):
            unit = {"us": " us", "x": "x", "%": " %"}[r["unit"]]
            out.append(f"| {r['scenario'].split('/', 1)[-1]} | {r['system']} | "
                       f"{r['median']:.1f}{unit} ({r['min']:.1f}-{r['max']:.1f}) |")
    return "\n".join(out) + "\n"
