"""Weight-only quantizers for com.microsoft MatMulNBits, behind two verbs (docs/architecture.md, Conventions).

    quantize(w [N, K] fp32) -> QuantizedWeight   packed data + scales (+ zero points) + its own error
    dequantize(q)           -> fp32 [N, K]        the NumPy reference of what MatMulNBits computes with

The layout MatMulNBits reads and the two forms (symmetric, and the offset form that holds Q4_1, HQQ's
zero points and min..max grids): pipeline/quant_grid.py, with the primitives every quantizer here and
GPTQ (pipeline/gptq.py) share.

Algorithms: RTN (round to nearest on the block absmax, or on the block min..max exactly as Q4_1 does)
and HQQ (half-quadratic proximal optimisation of the zero point, Badri & Shaji 2023) need no data.
GPTQ (pipeline/gptq.py) rounds column by column with error feedback through the inverse Hessian of
each layer's calibration inputs (pipeline/calib_activations.py): same grid and forms, less output
error for more weight error. An int8 LM head stays RTN under every algorithm (below); an int4 one is GPTQ'd
by default whatever --algo says (--lm-head-algo to choose), each block's grid found by weighted_grid, a
search for the least error weighted by the head input's mean x_k^2.

Errors per tensor: max_rel = max|w - w_hat| / max|w|, rms_rel = ||w - w_hat||_2 / ||w||_2, and with
GPTQ out_rel = ||X (w - w_hat)^T|| / ||X w^T|| on the calibration inputs X.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import numpy as np

from .errors import BuildError
from .gptq import GPTQQuantizer
from .quant_grid import MXFP4, QuantizedWeight, blocks, dequantize, finish, fp16_exact, on_grid, on_mxfp4, \
    quantize_by_rows

ALGOS = ("rtn", "hqq", "gptq")
WEIGHT_DTYPES = {"fp32": None, "int8": 8, "int4": 4}
KEEP_DTYPES = ("fp32", "int8")
# GGUF tensor types wider than 4 bits: an int4 build keeps such tensors int8 (source_mix), as their GGUF's author
# chose them wider (llama.cpp's Q4_K_M mix: Q5_0 / Q6_K / Q8_0 beside Q4_K); re-rounded to 4 bits they cost Gemma 3
# most of the model (docs/quality-gemma3.md)
WIDER_SOURCES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_1", "Q8_K")
# The projection groups of a layer, one QLinear each in the engine graph (q|k|v fused, gate|up fused), that --act16
# can put on int16 activation codes (QLinear act_bits 16: int8 weights only; docs/quality-gemma3.md).
ACT16_GROUPS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
                "down": ("down_proj",)}
# An int4 LM head's quantizer unless --lm-head-algo says otherwise: GPTQ on the final norm's output with each
# block's grid searched (weighted_grid). On SmolLM2 an RTN int4 head fails the int4 gate and this one passes it
# (docs/notes/quality.md, "int4 LM head").
DEFAULT_HEAD_ALGO = "gptq"
DEFAULT_ACCURACY_LEVEL = 4      # int8 compute on CPU (activations quantized per block)


# ---------------------------------------------------------------- quantizers

class RTNQuantizer:
    """Round to nearest per block: symmetric (absmax / (2^(b-1) - 1), llama.cpp's Q8_0 at 8 bits) or
    asymmetric (block min..max over 0..2^b-1 with the min as offset, llama.cpp's Q4_1 at 4 bits, so
    Q4_1 weights come back exactly)."""
    needs_data = False

    def __init__(self, bits: int, block_size: int, symmetric: bool):
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric

    def quantize(self, w: np.ndarray) -> QuantizedWeight:
        w = np.asarray(w, np.float32)
        blk = blocks(w, self.block_size)                                   # [N, kb, bs]
        qmax = (1 << self.bits) - 1
        if self.symmetric:
            mid = 1 << (self.bits - 1)
            scale = np.abs(blk).max(-1, keepdims=True) / (mid - 1)
            scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
            codes = np.clip(np.rint(blk / scale) + mid, 0, qmax)
            return finish(w, self.bits, self.block_size, codes, scale, None)
        lo, hi = blk.min(-1, keepdims=True), blk.max(-1, keepdims=True)
        scale = ((hi - lo) / qmax).astype(np.float32)
        scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
        codes = np.clip(np.rint((blk - lo) / scale), 0, qmax)
        return finish(w, self.bits, self.block_size, codes, scale, lo + (1 << (self.bits - 1)) * scale)

    dequantize = staticmethod(dequantize)


class HQQQuantizer:
    """HQQ: asymmetric with an fp32 zero point optimised by half-quadratic splitting (lp-norm, p < 1, of the
    weight error is robust to outliers), stored in the offset form: offset = (2^(b-1) - zero) * scale.
    4-bit; 8-bit falls back to RTN (its grid is fine enough that the zero point hardly matters)."""
    needs_data = False

    def __init__(self, bits: int, block_size: int, symmetric: bool, iters: int = 20, lp_norm: float = 0.7,
                 beta: float = 10.0, kappa: float = 1.01):
        if symmetric:
            raise BuildError("--algo hqq is asymmetric (it optimises the zero point); drop --symmetric or use "
                             "--algo rtn")
        self.bits, self.block_size = bits, block_size
        self.iters, self.p, self.beta, self.kappa = iters, lp_norm, beta, kappa

    def quantize(self, w: np.ndarray) -> QuantizedWeight:
        if self.bits != 4:
            return RTNQuantizer(self.bits, self.block_size, False).quantize(w)
        w = np.asarray(w, np.float32)
        blk = blocks(w, self.block_size).astype(np.float32)
        qmax = float((1 << self.bits) - 1)
        lo, hi = blk.min(-1, keepdims=True), blk.max(-1, keepdims=True)
        inv = qmax / np.maximum(hi - lo, 1e-8)                                 # 1 / scale
        zero = -lo * inv
        beta, best, best_zero = self.beta, np.inf, zero
        for _ in range(self.iters):
            codes = np.clip(np.rint(blk * inv + zero), 0, qmax)
            recon = (codes - zero) / inv
            diff = blk - recon
            shrunk = np.sign(diff) * np.maximum(np.abs(diff) - (1.0 / beta) * np.power(np.abs(diff) + 1e-8,
                                                                                     self.p - 1), 0)
            err = float(np.abs(diff).mean())
            if err >= best:
                break
            best, best_zero = err, zero
            zero = np.mean(codes - (blk - shrunk) * inv, axis=-1, keepdims=True)
            beta *= self.kappa
        zero = best_zero.astype(np.float32)
        codes = np.clip(np.rint(blk * inv + zero), 0, qmax)
        scale = (1.0 / inv).astype(np.float32)
        return finish(w, self.bits, self.block_size, codes, scale, (np.float32(1 << (self.bits - 1)) - zero) * scale)

    dequantize = staticmethod(dequantize)


def make_quantizer(algo: str, bits: int, block_size: int, symmetric: bool = False, search: bool = False):
    """search: GPTQ picks each block's grid by weighted_grid (the int4 LM head's); ignored by rtn and hqq."""
    if algo == "rtn":
        return RTNQuantizer(bits, block_size, symmetric)
    if algo == "hqq":
        return HQQQuantizer(bits, block_size, symmetric)
    if algo == "gptq":
        return GPTQQuantizer(bits, block_size, symmetric, search=search)
    raise BuildError(f"--algo must be one of {', '.join(ALGOS)}; got '{algo}'")


def check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
        raise BuildError(f"--block-size must be a power of two >= 16 (16, 32, 64, 128, 256); got {block_size}")


# ---------------------------------------------------------------- the plan the graph builders receive

def parse_keep(items) -> tuple[tuple[str, str], ...]:
    """'PATTERN=fp32|int8' strings -> ((pattern, dtype), ...); globs match HF tensor names."""
    out = []
    for item in items or ():
        pattern, sep, dtype = str(item).rpartition("=")
        if not sep or not pattern or dtype not in KEEP_DTYPES:
            raise BuildError(f"--keep takes PATTERN=fp32|int8 (a glob on HF tensor names, e.g. "
                             f"'model.layers.*.mlp.down_proj.weight=int8'); got '{item}'")
        out.append((pattern, dtype))
    return tuple(out)


_LAYER_PATH = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/([\w.]+)$")   # mlp/experts.3.gate_proj: an expert's


def hf_name(path: str) -> str:
    """Graph path of a projection -> its HF tensor name: /model/layers.3/attn/q_proj ->
    model.layers.3.self_attn.q_proj.weight; /lm_head -> lm_head.weight."""
    m = _LAYER_PATH.match(path)
    if m:
        block = "self_attn" if m.group(2) == "attn" else "mlp"
        return f"model.layers.{m.group(1)}.{block}.{m.group(3)}.weight"
    return path.strip("/").replace("/", ".") + ".weight"


@dataclass
class QuantPlan:
    """Which dtype each projection gets, the quantizers, and the per-tensor error report they fill."""
    quant: str = "fp32"
    lm_head: str = "fp32"
    block_size: int = 32
    algo: str = "rtn"
    lm_head_algo: str | None = None     # an int4 LM head's algorithm; None: DEFAULT_HEAD_ALGO (an int8 head: RTN)
    symmetric: bool = False
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL
    keep: tuple[tuple[str, str], ...] = ()
    act16: tuple[str, ...] = ()         # ACT16_GROUPS whose int8 weights multiply int16 activation codes
    source_mix: bool = True             # int4: tensors of a wider GGUF type (WIDER_SOURCES) stay int8
    source_types: dict = field(default_factory=dict)    # HF name -> the GGUF tensor type it was read from
    source_grids: dict = field(default_factory=dict)    # HF name -> (scale, low) [N, K / 32]: sources.source_grid
    report: dict = field(default_factory=dict)      # HF name -> {bits, block_size, algo, max_rel, rms_rel[, out_rel]}
    # what GPTQ reads its Hessians from: .hessian(hf_name) -> [K, K] (pipeline.calib_activations.Calibration)
    calibration: object = None

    def __post_init__(self):
        check_block_size(self.block_size)
        for name in ("quant", "lm_head"):
            if getattr(self, name) not in WEIGHT_DTYPES:
                raise BuildError(f"--{name.replace('_', '-')} must be one of {', '.join(WEIGHT_DTYPES)}; "
                                 f"got '{getattr(self, name)}'")
        make_quantizer(self.algo, 4, self.block_size, self.symmetric)   # validates algo / scheme
        if self.lm_head_algo is not None:
            if self.lm_head_algo not in ALGOS:
                raise BuildError(f"--lm-head-algo must be one of {', '.join(ALGOS)}; got '{self.lm_head_algo}'")
            make_quantizer(self.lm_head_algo, 4, self.block_size, self.symmetric)
        self._quantizers: dict[tuple[str, int, bool, bool], object] = {}   # (algo, bits, symmetric, search)

    def act16_for(self, paths: list[str]) -> bool:
        """Whether the projections of one input (graph paths: q|k|v, o, gate|up or down of a layer) take their
        input as int16 codes (an int8 weight's QLinear; graph_qlinear.qlinear act16)."""
        targets = tuple(p.rsplit("/", 1)[1] for p in paths)
        return any(ACT16_GROUPS[g] == targets for g in self.act16)

    def dtype_for(self, name: str) -> str:
        """fp32 | int8 | int4 for one HF tensor name (--keep globs first, in order)."""
        for pattern, dtype in self.keep:
            if fnmatch.fnmatchcase(name, pattern):
                return dtype
        if name == "lm_head.weight":
            return self.lm_head
        if self.quant == "int4" and self.source_mix and self.source_types.get(name) in WIDER_SOURCES:
            return "int8"
        return self.quant

    @property
    def active(self) -> bool:
        return self.quant != "fp32" or self.lm_head != "fp32"

    @property
    def head_algo(self) -> str:
        """The algorithm of an int4 LM head: --lm-head-algo, else DEFAULT_HEAD_ALGO (whatever --algo the body has)."""
        return self.lm_head_algo or DEFAULT_HEAD_ALGO

    @property
    def needs_calibration(self) -> bool:
        """GPTQ with some tensor it quantizes (an int8 LM head alone stays RTN)."""
        return self.calibration_names != ()

    @property
    def calibration_names(self) -> tuple[str, ...] | None:
        """The HF tensors GPTQ needs calibration inputs for: None for every projection (a GPTQ body), or only
        the LM head's (the final norm output: one capture instead of every layer's), or () for none."""
        if self.algo == "gptq" and self.quant != "fp32":
            return None
        return ("lm_head.weight",) if self.lm_head == "int4" and self.head_algo == "gptq" else ()

    def mxfp4_source(self, name: str) -> bool:
        """Whether an int4 tensor of the plan comes from MXFP4 (gpt-oss's experts): the mxfp4 format can keep it."""
        return self.dtype_for(name) == "int4" and self.source_types.get(name) == "MXFP4" and name in self.source_grids

    def expert_format(self, names: list[str]) -> tuple[str | None, str | None]:
        """One MoE layer's expert tensors (HF names) -> (format, why): ("mxfp4", None) where every one is an int4
        MXFP4 tensor whose block scales 2^(e - 128) fp16 holds (the MoE op's mxfp4 format keeps them exact at 4.5 bits
        a weight); ("int8", why) where some MXFP4 one cannot be (a scale off fp16, or experts of the layer not all
        MXFP4: the op takes one format a layer), so the layer keeps them exact as today, on MXFP4's grid in int8;
        (None, None) otherwise (no MXFP4 source, or not int4: quantized as the plan says)."""
        source = [self.mxfp4_source(n) for n in names]
        if not any(source):
            return None, None
        if not all(source):
            return "int8", "int8 on the MXFP4 grid: not every expert tensor of the layer is an int4 MXFP4 one"
        bad = next((n for n in names if not fp16_exact(self.source_grids[n][0])), None)
        if bad is not None:
            return "int8", f"int8 on the MXFP4 grid: a block scale of {bad} is no fp16 number (mxfp4 stores d in fp16)"
        return MXFP4, None

    def quantize(self, name: str, w: np.ndarray, form: tuple[str | None, str | None] = (None, None)
                 ) -> QuantizedWeight | None:
        """The quantized weight, or None to keep it fp32; records the tensor's error in the report. form: the
        layer's expert_format (the MoE builder's): "mxfp4" packs the source's MXFP4 codes as they are, "int8" keeps
        an int4 tensor int8 (on its source grid) and says why in the report."""
        if form[0] == MXFP4:
            q = on_mxfp4(w, self.source_grids[name][0])
            if q is None:
                layer = name.rsplit(".experts.", 1)[0]
                raise BuildError(f"{name}: its values are not on its MXFP4 grid (a fix-up changed them?); build with "
                                 f"--keep '{layer}.experts.*=int8' to keep the layer's experts exact as int8")
            self.report[name] = {"bits": 4, "block_size": 32, "algo": "source codes (MXFP4)", "format": MXFP4,
                                 "max_rel": q.max_rel, "rms_rel": q.rms_rel}
            return q
        bits = 8 if form[0] == "int8" else WEIGHT_DTYPES[self.dtype_for(name)]
        if bits is None:
            return None
        # An int8 LM head is symmetric RTN: llama.cpp's Q8_0, exact on GGUF Q8_0 embeddings (SmolLM2's), and
        # MatMulNBits' fastest path with no offset term on the model's largest matmul. An int4 one follows
        # --lm-head-algo, else GPTQ from the final norm's output with each block's grid searched for the least
        # error weighted by that input's mean x_k^2 (the min..max grid measured 1.3x the KLD; docs/quality.md).
        is_head = name == "lm_head.weight"
        int8_head = is_head and bits == 8
        symmetric = self.symmetric or int8_head
        algo = self.head_algo if is_head else self.algo
        algo = "rtn" if int8_head or (symmetric and algo != "gptq") else algo
        search = is_head and algo == "gptq" and not symmetric
        key = (algo, bits, symmetric, search)
        if key not in self._quantizers:
            self._quantizers[key] = make_quantizer(algo, bits, self.block_size, symmetric, search)
        quantizer = self._quantizers[key]
        grid = self.source_grids.get(name) if self.block_size == 32 and not symmetric else None
        q = on_grid(w, *grid, bits) if grid is not None else None
        if q is not None:      # the source's own grid (Q4_K, Q5_0, Q8_0): no second rounding, whatever --algo says
            algo = f"source grid ({self.source_types.get(name, 'Q4_K')})"
        elif quantizer.needs_data:
            if self.calibration is None:
                raise BuildError(f"--algo gptq needs calibration activations for {name} and none were captured; "
                                 "build with --calib-tokens N (N > 0) or use --algo rtn|hqq")
            q = quantizer.quantize(w, self.calibration.hessian(name))
        else:
            q = quantize_by_rows(quantizer.quantize, w)     # a large head or embedding in row chunks
        self.report[name] = {"bits": bits, "block_size": self.block_size, "algo": algo, "max_rel": q.max_rel,
                             "rms_rel": q.rms_rel}
        if search:
            self.report[name]["grid"] = "weighted search (weights diag H)"
        if q.out_rel is not None:
            self.report[name]["out_rel"] = q.out_rel
        if form[1] is not None:
            self.report[name]["fallback"] = form[1]
        return q
