"""`ortllm build`: recipe or path -> weights -> graph -> tokenizer -> manifest, written atomically.

The artifact is assembled in a temporary sibling directory and renamed into place only when complete,
so an interrupted build never leaves something that looks like a valid artifact.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from ortllm.runtime import contract as C
from ortllm.runtime.artifact import ArtifactError, file_entry, read_manifest
from ortllm.runtime.artifact import pid_alive as _pid_alive

from .errors import BuildError
from .families import default_act16, default_int4_smooth
from .layer_reference import LayerReference, streams_by_default
from .quantize import ACT16_GROUPS, ALGOS, QuantPlan, check_block_size, parse_keep
from .smooth import SMOOTHED, adapter_scales, check_alpha, smooth_weights
from .sources import load_model
from .weights import LazyTensors, ModelWeights, norm_names

QUANTS = ("fp32", "int8", "int4")
KV_DTYPES = tuple(C.KV_DTYPES)     # the --kv options (runtime/contract.py's table)
EXPORTERS = ("native", "optimum")
KV_BLOCK_SIZES = (8, 16, 32, 64)
# --lm-head and --kv when not given: the fastest int4 form whose held-out quality (calibration/heldout.py: prose,
# code and chat each) meets the default builds' bar, mean KLD <= 0.005 and top-1 >= 95% in every domain
# (docs/quality.md, SmolLM2 in-build check, 1,533 positions a domain). The weights reproduce SmolLM2's Q4_1 (and
# the head its Q8_0) exactly, so what is left is the rounding of activations and of an 8-bit cache; prose is the
# domain that binds. With int8 activations on the head: int8 head + int8 KV 0.0062 (fails), int8 head + fp32 KV
# 0.0050 (meets it with no room); an fp32 head 0.0043 (B = 1 decode ~0.6x). The int8 head now takes its input as
# int16 codes (QLinear act_bits 16: graph_qlinear.qlinear act16), which leaves it the fp32 head's quality at the
# int8 head's bytes: prose 0.0043 with the fp32 cache, 0.0043 with the fp16 cache (0.00434 +- 0.00020: room).
# So int4 builds get the int8 head and the fp16 cache (the fp32 cache's quality, KLD 1e-6 apart, at half its
# bytes); the int4 head (GPTQ, searched grid: top-1 ~91% held out, though it passed on the calibration-like text
# it was fitted to) and the rotated int8 cache (half the fp16 cache's bytes, prose +0.0012) stay options:
# --lm-head int4, --kv int8. int8 builds take the same int8 head and fp16 cache: with them they measure what the
# fp32 head and cache gave (prose 0.00272, all 0.00164, top-1 98.22%, PPL 1.0002) at a quarter of the head's bytes
# (an fp32 head was ~113 MB of SmolLM2's int8 step). fp32 builds stay fp32 throughout (the reference).
DEFAULT_LM_HEAD = {"fp32": "fp32", "int8": "int8", "int4": "int8"}
ACT16_MAX_BLOCK = 128   # int16 activation codes x int8 weights stay exact in int32 up to this block (qlinear.h's
                        # kQLinearMaxBlock16)
DEFAULT_KV = {"fp32": "fp32", "int8": "fp16", "int4": "fp16"}


@dataclass(frozen=True)
class BuildOptions:
    quant: str = "fp32"
    block_size: int = 32
    algo: str = "rtn"
    lm_head: str | None = None    # None: DEFAULT_LM_HEAD[quant] (the fastest head that passes the quant's gate)
    lm_head_algo: str | None = None   # an int4 head's quantizer (rtn|hqq|gptq); None: quantize.DEFAULT_HEAD_ALGO
    kv: str | None = None         # None: DEFAULT_KV[quant] on the engine graph, else fp32
    graph: str = "engine"
    exporter: str = "native"
    kv_block_size: int = 16       # tokens per paged-KV block (engine graph attribute)
    symmetric: bool = False       # int8/int4 zero point: implicit 2^(bits-1) (True) or per block (False)
    accuracy_level: int = 4       # MatMulNBits accuracy_level (4: int8 compute on CPU)
    keep: tuple = ()              # ("GLOB=fp32|int8", ...) on HF tensor names: sensitive layers kept wider
    kv_rotate: bool = True        # Hadamard-rotate K and Q (int4: and V) before a quantized KV cache
    quality_tokens: int = 4096    # scored positions of the in-build check on held-out text (quality.json),
                                  # split over prose, code and chat (calibration/quality.py)
    calib_tokens: int = 8192      # calibration tokens of --algo gptq and --smooth
                                  # (windows of 256; calib_activations.py)
    smooth: float | None = None   # SmoothQuant alpha on the projections after a norm (pipeline/smooth.py); None: auto
    smooth_down: float = 0.0      # SmoothQuant alpha on down_proj's input, carried by up_proj's rows; 0: off
    act16: tuple | None = None    # projection groups (quantize.ACT16_GROUPS) whose int8 weights take int16 activation
                                  # codes; None: the family's default (families.default_act16), resolved at build
    source_mix: bool = True       # int4: a GGUF's tensors of a type wider than 4 bits (Q5_0, Q6_K, Q8_0, ...) stay int8

    def __post_init__(self):
        if self.lm_head is None and self.quant in DEFAULT_LM_HEAD:
            object.__setattr__(self, "lm_head", DEFAULT_LM_HEAD[self.quant])
        if self.kv is None:
            object.__setattr__(self, "kv", DEFAULT_KV.get(self.quant, "fp32") if self.graph == "engine" else "fp32")
        for name, allowed in (("quant", QUANTS), ("algo", ALGOS), ("lm_head", QUANTS), ("kv", KV_DTYPES),
                              ("graph", C.GRAPH_KINDS), ("exporter", EXPORTERS)):
            if getattr(self, name) not in allowed:
                raise BuildError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}; "
                                 f"got '{getattr(self, name)}'")
        check_block_size(self.block_size)
        if self.block_size > ACT16_MAX_BLOCK and self.graph == "engine" and self.lm_head == "int8":
            raise BuildError(f"--block-size {self.block_size} with the int8 LM head: the head takes int16 activation "
                             f"codes, which QLinear sums exactly in blocks of up to {ACT16_MAX_BLOCK}; add --lm-head "
                             f"fp32 (or int4), or use --block-size {ACT16_MAX_BLOCK}")
        if self.kv_block_size not in KV_BLOCK_SIZES:
            raise BuildError(f"--kv-block-size must be one of {', '.join(map(str, KV_BLOCK_SIZES))}; "
                             f"got {self.kv_block_size}")
        object.__setattr__(self, "keep", tuple(self.keep))
        if self.act16 is not None:
            object.__setattr__(self, "act16", tuple(self.act16))
            bad = [g for g in self.act16 if g not in ACT16_GROUPS]
            if bad:
                raise BuildError(f"--act16 takes a comma-separated list of {', '.join(ACT16_GROUPS)} (or none); "
                                 f"got {', '.join(map(repr, bad))}")
        if self.keep and self.quant == "fp32":
            raise BuildError("--keep keeps layers of a quantized build wider; add --quant int8|int4 or drop --keep")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise BuildError(f"--accuracy-level must be 0..4 (4: int8 compute); got {self.accuracy_level}")
        if not isinstance(self.quality_tokens, int) or self.quality_tokens < 16:
            raise BuildError(f"quality_tokens must be an integer >= 16; got {self.quality_tokens!r}")
        if not isinstance(self.calib_tokens, int) or self.calib_tokens < 0:
            raise BuildError(f"--calib-tokens must be an integer >= 0; got {self.calib_tokens!r}")
        plan = self.quant_plan()       # validates algo, scheme and --keep
        for flag, alpha in (("--smooth", self.smooth), ("--smooth-down", self.smooth_down)):
            if alpha is None:
                continue
            check_alpha(alpha)
            if alpha and self.quant == "fp32":
                raise BuildError(f"{flag} rescales quantized projections; add --quant int8|int4 or drop {flag}")
            if alpha and self.algo == "gptq":
                raise BuildError(f"{flag} and --algo gptq do not combine (GPTQ's Hessians are of the unsmoothed "
                                 f"inputs); use {flag} 0 with gptq, or --algo rtn|hqq with {flag}")
        for flag, on, instead in (("gptq", plan.needs_calibration, "use rtn|hqq (--algo, --lm-head-algo): no data"),
                                  ("--smooth", self.smooth_alpha, "turn it off with --smooth 0"),
                                  ("--smooth-down", self.smooth_down, "turn it off with --smooth-down 0")):
            if on and self.calib_tokens < 16:
                raise BuildError(f"{flag} needs calibration data: set --calib-tokens to at least 16 (default 8192; "
                                 f"got {self.calib_tokens}), or {instead}")
        if not self.kv_rotate and self.kv in ("fp32", "fp16"):
            raise BuildError("--kv-rotate 0 applies to quantized KV caches; add --kv int8|fp8|int4 or drop it")
        if self.kv != "fp32" and self.graph != "engine":
            raise BuildError(f"--kv {self.kv} needs the engine graph (paged quantized KV); add --graph engine "
                             "or use --kv fp32")

    def quant_plan(self) -> QuantPlan:
        """A fresh plan for the graph builders (it collects each quantized tensor's error)."""
        return QuantPlan(quant=self.quant, lm_head=self.lm_head, block_size=self.block_size, algo=self.algo,
                         lm_head_algo=self.lm_head_algo, symmetric=self.symmetric, accuracy_level=self.accuracy_level,
                         keep=parse_keep(self.keep), act16=self.act16 or (), source_mix=self.source_mix)

    def for_model(self, cfg) -> "BuildOptions":
        """The options with the family's defaults filled in, as the manifest records them: --act16 not given:
        families.default_act16 on quantized weights; --smooth not given on an int4 build without GPTQ:
        families.default_int4_smooth where the family has one (else smooth_alpha's rule)."""
        filled = {}
        if self.act16 is None:
            filled["act16"] = default_act16(cfg) if self.quant != "fp32" else ()
        if self.smooth is None and self.quant == "int4" and self.algo != "gptq" and default_int4_smooth(cfg):
            filled["smooth"] = default_int4_smooth(cfg)
        act16 = filled.get("act16", self.act16)
        if act16 and self.quant == "int8" and self.block_size > ACT16_MAX_BLOCK and self.graph == "engine":
            raise BuildError(f"--block-size {self.block_size} with int16 activation codes on {', '.join(act16)} "
                             f"(--act16{'' if self.act16 is not None else ': the family default'}): QLinear sums them "
                             f"exactly in blocks of up to {ACT16_MAX_BLOCK}; add --act16 none, or use --block-size "
                             f"{ACT16_MAX_BLOCK}")
        if cfg.num_experts:     # the calibration pass runs the portable graph, which has no MoE MLP yet
            if self.smooth or self.smooth_down or self.algo == "gptq" or self.lm_head_algo == "gptq":
                raise BuildError("an MoE model builds without a calibration pass for now: use --algo rtn|hqq, "
                                 "--lm-head-algo rtn|hqq and --smooth 0 (the default on MoE models)")
            if self.smooth is None and self.quant != "fp32":
                filled["smooth"] = 0.0
        return replace(self, **filled) if filled else self

    @property
    def smooth_alpha(self) -> float:
        """--smooth, or by default 0.5 where int8 compute meets fine int8 weights (--quant int8, accuracy level 4,
        rtn|hqq), which is where activation outliers cost the most (pipeline/smooth.py); 0 elsewhere: int4
        weights cannot take the outliers (and on SmolLM2 RTN reproduces the shipped Q4_1 grid exactly)."""
        if self.smooth is not None:
            return float(self.smooth)
        return 0.5 if self.quant == "int8" and self.accuracy_level == 4 and self.algo != "gptq" else 0.0

    @property
    def quantized(self) -> bool:
        """Anything below fp32 (weights, LM head or KV cache): such builds carry quality.json."""
        return self.quant != "fp32" or self.lm_head != "fp32" or self.kv != "fp32"


def _tool_versions() -> dict:
    out = {}
    for dist in ("ortllm", "onnx", "numpy", "gguf", "tokenizers", "onnxruntime-extensions"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _check_out_dir(out: Path, force: bool, recipe_name: str | None, source_sha: str, opts: BuildOptions) -> None:
    """Refuse to overwrite a directory holding something else, unless --force."""
    if not out.exists() or force:
        return
    if not out.is_dir():
        raise BuildError(f"--out {out} is a file; choose another path or pass --force to replace it")
    if not any(out.iterdir()):
        return
    try:
        old = read_manifest(out)
    except ArtifactError:
        raise BuildError(f"--out {out} already holds files that are not an ortllm artifact; choose an empty "
                         "directory or pass --force to replace it") from None
    same = (old.recipe == recipe_name and old.source_sha256 == source_sha
            and old.build == json.loads(json.dumps(asdict(opts))))
    if not same:
        raise BuildError(f"--out {out} holds a different artifact (recipe {old.recipe}, build "
                         f"{old.build}); pass --force to replace it or choose another --out")


def write_graph(weights: ModelWeights, out: Path, opts: BuildOptions, plan: QuantPlan | None, meta: dict) -> None:
    """model.onnx + model.onnx.data of the chosen graph kind into `out`."""
    if opts.graph == "engine":
        from .graph_engine import build_engine_graph
        build_engine_graph(weights, out / C.MODEL, out / C.MODEL_DATA, kv=opts.kv, block_size=opts.kv_block_size,
                           metadata=meta, quant=plan, kv_rotate=opts.kv_rotate)
    else:
        if weights.config.num_experts:
            raise BuildError("the portable graph has no mixture-of-experts MLP yet; build this MoE model with "
                             "--graph engine (the default)")
        from .graph_portable import build_portable_graph
        build_portable_graph(weights, out / C.MODEL, out / C.MODEL_DATA, metadata=meta, quant=plan)


def _unsmooth_act16(original: ModelWeights, smoothed: ModelWeights, scales: dict, act16: tuple
                    ) -> tuple[ModelWeights, dict]:
    """SmoothQuant taken back from the norms whose projections take int16 activation codes (--act16 qkv: the
    attention's input norm; gate_up: the MLP's): their activations' step no longer needs it, and unsmoothed weights
    stay on the source's grid (quant_grid.on_grid), so q|k|v of a GGUF are its own Q5_0 / Q8_0 values."""
    roles = {"qkv": "attn_in", "gate_up": "mlp_in"}
    undo = [roles[g] for g in act16 if g in roles]
    if not undo:
        return smoothed, scales
    lazy = isinstance(smoothed.tensors, LazyTensors)     # stays lazy: the originals' loaders taken back
    cfg, scales = original.config, dict(scales)
    tensors = smoothed.tensors.copy() if lazy else dict(smoothed.tensors)

    def restore(name: str) -> None:
        if lazy:
            tensors.add(name, original.tensors.shape(name), original.tensors.loader(name))
        else:
            tensors[name] = original.tensors[name]

    names = norm_names(cfg)
    for i in range(cfg.num_layers):
        for role in undo:
            if role == "mlp_in" and f"model.layers.{i}.mlp.up_proj.weight" in scales:
                continue      # --smooth-down rescaled up_proj's rows too: the MLP keeps its smoothing
            norm = f"model.layers.{i}.{names[role]}.weight"
            scales.pop(norm, None)
            restore(norm)
            for t in SMOOTHED[role]:
                restore(f"model.layers.{i}.{t}.weight")
    return replace(smoothed, tensors=tensors), scales


def write_quantized_graph(weights: ModelWeights, tmp: Path, opts: BuildOptions, plan: QuantPlan, meta: dict,
                          log=print, tokenizer_dir: Path | None = None, fp32_reference: str = "auto") -> dict | None:
    """write_graph, with a calibration pass (GPTQ's Hessians, SmoothQuant's channel RMS) captured in a scratch
    directory beside `tmp` when the build needs one; returns the calibration's identity (None without one).
    tokenizer_dir: where the artifact's tokenizer is already written (the calibration text is tokenized with it);
    fp32_reference: the calibration runs the fp32 model whole or one layer at a time (runs_layer_by_layer)."""
    alpha, down = opts.smooth_alpha, opts.smooth_down
    if not plan.needs_calibration and not alpha and not down:
        write_graph(weights, tmp, opts, plan, meta)
        return None
    from safetensors.numpy import save_file

    from .calib_activations import Calibration, LayerCalibration

    scratch = tmp.with_name(tmp.name.replace(".building-", ".calib.building-"))   # cleaned like tmp if killed
    shutil.rmtree(scratch, ignore_errors=True)
    start = time.perf_counter()
    cal = None
    try:
        layers = runs_layer_by_layer(weights, fp32_reference)
        if layers:
            log("calibrating: the fp32 model runs one layer at a time")
        cal = (LayerCalibration if layers else Calibration)(
            weights, opts.calib_tokens, scratch, log=log, names=None if alpha or down else plan.calibration_names,
            tokenizer_dir=tokenizer_dir, diagonal_only=not plan.needs_calibration)
        info = {"fp32_model": "run one layer at a time (pipeline/graph_stages.py)"} if layers else {}
        if alpha or down:
            weights, scales = _unsmooth_act16(weights, *smooth_weights(weights, alpha, cal.channel_rms, down),
                                              plan.act16)
            save_file(adapter_scales(weights.config, scales), str(tmp / C.SMOOTHING))   # for adapters
            info["smoothquant"] = {"alpha": alpha, "norms": len(scales), **({"down_alpha": down} if down else {}),
                                   "s_range": [min(v["s_min"] for v in scales.values()),
                                               max(v["s_max"] for v in scales.values())] if scales else None}
        if plan.needs_calibration:
            plan.calibration = cal
            info["gptq"] = ("non-sequential (fp32 activations of every layer), damp 1% of mean diag(H), chunks of "
                            "max(128, block) columns, grid per block from error-updated weights")
            if plan.calibration_names is not None:
                info["gptq"] = "LM head only: " + info["gptq"]
            if plan.lm_head == "int4" and plan.head_algo == "gptq" and not plan.symmetric:
                info["gptq"] += "; the LM head's grid by a search weighted by diag(H)"
        write_graph(weights, tmp, opts, plan, meta)
        log(f"calibrated graph built in {time.perf_counter() - start:.0f} s (calibration passes {cal.seconds:.0f} s)")
        return {**cal.info, **info}
    finally:
        plan.calibration = None
        if cal is not None:
            cal.close()
        shutil.rmtree(scratch, ignore_errors=True)


# (weights, artifact dir, fp32 reference, opts, ref_opts, per-tensor error report) -> quality.json's dict; the
# reference is the fp32 artifact's directory or a pipeline.layer_reference.LayerReference (scorer(windows)).
# The check runs the engine, which the pipeline may not import (tests/test_layering.py): the caller composes it
# in (ortllm.cli.build.build_artifact passes ortllm.calibration.quality.in_build_quality).
QualityCheck = Callable[[ModelWeights, Path, "Path | LayerReference", "BuildOptions", "BuildOptions", dict], dict]


FP32_REFERENCES = ("auto", "full", "layers")   # --fp32-reference: how the build runs the model in fp32


def runs_layer_by_layer(weights: ModelWeights, fp32_reference: str) -> bool:
    """Whether the calibration pass and the quality check run the fp32 model one layer at a time (the stages of
    pipeline/graph_stages.py): asked for ("layers"), or "auto" where its whole fp32 copy would not fit."""
    return fp32_reference == "layers" or (fp32_reference == "auto" and streams_by_default(weights))


def write_quality(weights: ModelWeights, tmp: Path, opts: BuildOptions, plan: QuantPlan | None,
                  quality_check: QualityCheck, calibration: dict | None = None, fp32_reference: str = "auto",
                  log=print) -> None:
    """quality.json: each quantized tensor's error and a short paired fidelity check against the same weights in
    fp32 (fp32 KV): built whole in a scratch directory beside `tmp`, or run one layer at a time there
    (pipeline/layer_reference.py: bounded memory; runs_layer_by_layer). Skipped, and said so, when the weights carry
    extra["fidelity_skipped"] (a shape recipe's random weights) unless fp32_reference asks for a way to run it."""
    skipped = weights.extra.get("fidelity_skipped")
    if skipped and fp32_reference == "auto":   # per-tensor errors only (a shape recipe: pipeline/shape_weights.py)
        report = {"build": asdict(opts), "reference": None, "fidelity": {}, "fidelity_skipped": skipped,
                  "tensors": plan.report if plan else {}}
    else:
        report = _measured_quality(weights, tmp, opts, plan, quality_check, fp32_reference, log)
        if skipped:
            report["fidelity_note"] = ("measured on request (--fp32-reference) on random weights (a shape recipe): "
                                       "its figures say what the check costs, not a quality")
    if calibration is not None:
        report["calibration"] = calibration
    (tmp / C.QUALITY).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _measured_quality(weights: ModelWeights, tmp: Path, opts: BuildOptions, plan: QuantPlan | None,
                      quality_check: QualityCheck, fp32_reference: str, log) -> dict:
    """quality_check against the fp32 reference, made in a scratch directory beside `tmp` (removed after)."""
    ref = tmp.with_name(tmp.name.replace(".building-", ".fp32ref.building-"))   # cleaned like tmp if killed
    shutil.rmtree(ref, ignore_errors=True)
    ref.mkdir()
    ref_opts = replace(opts, quant="fp32", lm_head="fp32", kv="fp32", keep=(), kv_rotate=True, smooth=None,
                       smooth_down=0.0, act16=())
    try:
        if runs_layer_by_layer(weights, fp32_reference):
            log("quality check: the fp32 reference runs one layer at a time")
            reference = LayerReference(weights, ref, opts.kv_block_size, log=log)   # its scratch: ref
        else:
            write_graph(weights, ref, ref_opts, None, {})
            reference = ref
        return quality_check(weights, tmp, reference, opts, ref_opts, plan.report if plan else {})
    finally:
        shutil.rmtree(ref, ignore_errors=True)


def write_artifact(weights: ModelWeights, recipe_name: str | None, opts: BuildOptions, tmp: Path,
                   log=print, quality_check: QualityCheck | None = None, fp32_reference: str = "auto") -> dict:
    """Write every artifact file into `tmp` and return the manifest (also written)."""
    cfg = weights.config
    meta = {"ortllm.contract_version": C.CONTRACT_VERSION, "ortllm.graph": opts.graph}
    plan = opts.quant_plan() if opts.quant != "fp32" or opts.lm_head != "fp32" else None
    if plan is not None:      # a GGUF's tensor types and Q4_K grids (pipeline/sources.py), for int4 builds
        plan.source_types = weights.extra.get("source_types", {})
        plan.source_grids = weights.extra.get("source_grids", {})
    # the tokenizer first: a calibrated build tokenizes its calibration text with these files (converting a GGUF's
    # vocabulary takes seconds: Gemma's 262k tokens 8-10 s)
    tok = weights.write_tokenizer(tmp) if weights.write_tokenizer else None
    calibration = None
    if plan is None:
        write_graph(weights, tmp, opts, plan, meta)
    else:
        calibration = write_quantized_graph(weights, tmp, opts, plan, meta, log, tokenizer_dir=tmp if tok else None,
                                            fp32_reference=fp32_reference)
    eos = list(dict.fromkeys([*cfg.eos_token_ids, *(tok.eos_token_ids if tok else ())]))
    (tmp / C.CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")
    generation = {
        "eos_token_ids": eos,
        "bos_token_id": tok.bos_token_id if tok else cfg.bos_token_id,
        "pad_token_id": tok.pad_token_id if tok else None,
        "context_length": cfg.max_position_embeddings,
    }
    (tmp / C.GENERATION).write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    graphs = {}
    if tok is not None:
        from .tokenizer_graphs import write_tokenizer_graphs_cached
        graphs = write_tokenizer_graphs_cached(tmp, tok.files, log)
    if opts.exporter == "optimum":
        from .optimum_export import export_optimum
        export_optimum(weights, tmp, tmp / "optimum")

    if opts.quantized:
        write_quality(weights, tmp, opts, plan, quality_check, calibration, fp32_reference, log)

    files = {str(p.relative_to(tmp)): file_entry(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {
        "format_version": C.FORMAT_VERSION,
        "contract_version": C.CONTRACT_VERSION,
        "graph": opts.graph,
        "recipe": recipe_name,
        "source": {"desc": weights.source_desc, "sha256": weights.source_sha256},
        "build": asdict(opts),
        "model": cfg.to_dict(),
        "tokenizer_graphs": graphs,
        "files": files,
        "tools": _tool_versions(),
    }
    if calibration is not None:
        manifest["calibration"] = calibration     # GPTQ's / SmoothQuant's data: tokens, sha256 of text and ids
    (tmp / C.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _clear_dead_leftovers(out: Path) -> None:
    """Remove temp dirs of earlier builds of `out` that were killed (their pid is gone)."""
    for p in out.parent.glob(f".{out.name}.*-*"):
        kind, _, pid = p.name.rpartition("-")
        if kind.endswith((".building", ".old")) and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def build(spec: str, out: Path, opts: BuildOptions, source: str | None = None, force: bool = False,
          log=print, quality_check: QualityCheck | None = None, fp32_reference: str = "auto") -> dict:
    """quality_check: required for a quantized build (every quantized artifact ships its measured quality);
    fp32_reference: how it runs the fp32 reference (FP32_REFERENCES; write_quality)."""
    if fp32_reference not in FP32_REFERENCES:
        raise BuildError(f"--fp32-reference {fp32_reference!r}: choose one of {', '.join(FP32_REFERENCES)}")
    if opts.quantized and quality_check is None:
        raise BuildError("a quantized build measures its quality against fp32 with the engine: build it with "
                         "`ortllm build` or ortllm.cli.build.build_artifact (or pass "
                         "quality_check=ortllm.calibration.quality.in_build_quality)")
    out = Path(out).absolute()
    log(f"loading {spec} ...")
    recipe, weights = load_model(spec, source)
    recipe_name = recipe.name if recipe else None
    opts = opts.for_model(weights.config)
    _check_out_dir(out, force, recipe_name, weights.source_sha256, opts)
    out.parent.mkdir(parents=True, exist_ok=True)
    _clear_dead_leftovers(out)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        log(f"building {opts.graph} graph ({opts.quant}) ...")
        manifest = write_artifact(weights, recipe_name, opts, tmp, log, quality_check, fp32_reference)
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"artifact written to {out}")
    return manifest
