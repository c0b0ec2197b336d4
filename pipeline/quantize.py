"""Weight-only quantizers for com.microsoft MatMulNBits, behind two verbs (STYLE.md 4).

    quantize(w [N, K] fp32) -> QuantizedWeight   packed data + scales (+ zero points) + its own error
    dequantize(q)           -> fp32 [N, K]        the NumPy reference of what MatMulNBits computes with

MatMulNBits layout (checked against onnxruntime 1.31 by tests/pipeline/test_quantize.py, dequantize
then MatMul vs the op): B is [N, k_blocks, block_size * bits / 8] uint8 with K zero-padded to whole
blocks; 4-bit values two per byte, element 2j in the low nibble and 2j+1 in the high nibble. scales are
fp32 [N * k_blocks]. zero_points are either uint8 packed like B along k_blocks (4-bit: two per byte,
each row padded to whole bytes) or fp32 [N * k_blocks] (4-bit only; onnxruntime then dequantizes to
fp32 instead of computing in int8). Without zero_points the zero point is 2^(bits-1) (symmetric).
w ~= (q - zero_point) * scale, per (row n, block of K).

Algorithms: RTN (round to nearest on the block min/max or absmax) and HQQ (half-quadratic proximal
optimisation of the zero point, Badri & Shaji 2023, fp32 zero points as onnxruntime's own HQQ
quantizer writes them) need no data. GPTQ needs calibration activations and is not implemented yet:
build refuses it with a one-line error rather than pretend.

Errors per tensor: max_rel = max|w - w_hat| / max|w|, rms_rel = ||w - w_hat||_2 / ||w||_2.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import numpy as np

from .errors import BuildError

ALGOS = ("rtn", "hqq", "gptq")
WEIGHT_DTYPES = {"fp32": None, "int8": 8, "int4": 4}
KEEP_DTYPES = ("fp32", "int8")
DEFAULT_ACCURACY_LEVEL = 4      # int8 compute on CPU (activations quantized per block)


@dataclass
class QuantizedWeight:
    """One [N, K] weight ready for MatMulNBits."""
    n: int
    k: int
    bits: int
    block_size: int
    data: np.ndarray                 # uint8 [N, k_blocks, block_size * bits / 8]
    scales: np.ndarray               # fp32 [N * k_blocks]
    zero_points: np.ndarray | None   # uint8 packed [N * ceil(k_blocks * bits / 8)] or fp32 [N * k_blocks]
    max_rel: float = 0.0
    rms_rel: float = 0.0

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.block_size)


# ---------------------------------------------------------------- packing

def _pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., L] -> packed bytes [..., L * bits / 8] (4-bit: low nibble first); L even for 4 bits."""
    q = q.astype(np.uint8)
    return q if bits == 8 else (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _unpack_bits(p: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return p
    out = np.empty((*p.shape[:-1], p.shape[-1] * 2), np.uint8)
    out[..., 0::2], out[..., 1::2] = p & 0x0F, p >> 4
    return out


def _pack_zero_points(zp: np.ndarray, bits: int) -> np.ndarray:
    """uint8 zero points [N, k_blocks] -> [N * ceil(k_blocks * bits / 8)] (rows padded to whole bytes)."""
    if bits == 4 and zp.shape[1] % 2:
        zp = np.concatenate([zp, np.zeros((zp.shape[0], 1), zp.dtype)], axis=1)
    return _pack_bits(zp, bits).reshape(-1)


def _blocks(w: np.ndarray, block_size: int) -> np.ndarray:
    """[N, K] -> [N, k_blocks, block_size], K zero-padded to whole blocks."""
    n, k = w.shape
    kb = -(-k // block_size)
    if kb * block_size != k:
        w = np.concatenate([w, np.zeros((n, kb * block_size - k), np.float32)], axis=1)
    return w.reshape(n, kb, block_size)


def dequantize(q: QuantizedWeight) -> np.ndarray:
    """The NumPy reference: fp32 [N, K] that MatMulNBits multiplies by (up to its activation rounding)."""
    codes = _unpack_bits(q.data, q.bits).astype(np.float32)           # [N, kb, bs]
    scales = q.scales.reshape(q.n, q.k_blocks, 1)
    if q.zero_points is None:
        zp = np.float32(1 << (q.bits - 1))
    elif q.zero_points.dtype == np.float32:
        zp = q.zero_points.reshape(q.n, q.k_blocks, 1)
    else:
        per_row = -(-q.k_blocks * q.bits // 8)
        zp = _unpack_bits(q.zero_points.reshape(q.n, per_row), q.bits)[:, :q.k_blocks]
        zp = zp.reshape(q.n, q.k_blocks, 1).astype(np.float32)
    return ((codes - zp) * scales).reshape(q.n, -1)[:, :q.k]


def _finish(w: np.ndarray, bits: int, block_size: int, codes: np.ndarray, scales: np.ndarray,
            zero_points: np.ndarray | None) -> QuantizedWeight:
    n, k = w.shape
    q = QuantizedWeight(n, k, bits, block_size, _pack_bits(codes, bits), scales.astype(np.float32).reshape(-1),
                        zero_points)
    err = dequantize(q) - w
    peak, norm = float(np.abs(w).max()), float(np.sqrt(np.square(w, dtype=np.float64).sum()))
    q.max_rel = float(np.abs(err).max()) / peak if peak else 0.0
    q.rms_rel = float(np.sqrt(np.square(err, dtype=np.float64).sum())) / norm if norm else 0.0
    return q


# ---------------------------------------------------------------- quantizers

class RTNQuantizer:
    """Round to nearest per block: symmetric (absmax / (2^(b-1) - 1), implicit zero point 2^(b-1)) or
    asymmetric (block min..max over 0..2^b-1, uint8 zero point, so onnxruntime keeps int8 compute)."""
    needs_data = False

    def __init__(self, bits: int, block_size: int, symmetric: bool):
        self.bits, self.block_size, self.symmetric = bits, block_size, symmetric

    def quantize(self, w: np.ndarray) -> QuantizedWeight:
        w = np.asarray(w, np.float32)
        blk = _blocks(w, self.block_size)                                   # [N, kb, bs]
        qmax = (1 << self.bits) - 1
        if self.symmetric:
            mid = 1 << (self.bits - 1)
            scale = np.abs(blk).max(-1, keepdims=True) / (mid - 1)
            scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
            codes = np.clip(np.rint(blk / scale) + mid, 0, qmax)
            return _finish(w, self.bits, self.block_size, codes, scale, None)
        lo = np.minimum(blk.min(-1, keepdims=True), 0)
        hi = np.maximum(blk.max(-1, keepdims=True), 0)
        scale = ((hi - lo) / qmax).astype(np.float32)
        scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
        zp = np.clip(np.rint(-lo / scale), 0, qmax)
        codes = np.clip(np.rint(blk / scale) + zp, 0, qmax)
        return _finish(w, self.bits, self.block_size, codes, scale,
                       _pack_zero_points(zp[..., 0].astype(np.uint8), self.bits))

    dequantize = staticmethod(dequantize)


class HQQQuantizer:
    """HQQ: asymmetric with an fp32 zero point optimised by half-quadratic splitting (lp-norm, p < 1, of the
    weight error is robust to outliers). 4-bit only in onnxruntime (fp32 zero points); 8-bit falls back to RTN."""
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
        blk = _blocks(w, self.block_size).astype(np.float32)
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
        return _finish(w, self.bits, self.block_size, codes, (1.0 / inv).astype(np.float32),
                       zero.reshape(-1).astype(np.float32))

    dequantize = staticmethod(dequantize)


def make_quantizer(algo: str, bits: int, block_size: int, symmetric: bool = False):
    if algo == "rtn":
        return RTNQuantizer(bits, block_size, symmetric)
    if algo == "hqq":
        return HQQQuantizer(bits, block_size, symmetric)
    if algo == "gptq":
        raise BuildError("--algo gptq is not implemented yet (it needs calibration activations per layer); "
                         "use --algo rtn or --algo hqq")
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


_LAYER_PATH = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)$")


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
    symmetric: bool = False
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL
    keep: tuple[tuple[str, str], ...] = ()
    report: dict = field(default_factory=dict)      # HF name -> {bits, block_size, max_rel, rms_rel}

    def __post_init__(self):
        check_block_size(self.block_size)
        for name in ("quant", "lm_head"):
            if getattr(self, name) not in WEIGHT_DTYPES:
                raise BuildError(f"--{name.replace('_', '-')} must be one of {', '.join(WEIGHT_DTYPES)}; "
                                 f"got '{getattr(self, name)}'")
        make_quantizer(self.algo, 4, self.block_size, self.symmetric)   # validates algo / scheme
        self._quantizers: dict[int, object] = {}

    def dtype_for(self, name: str) -> str:
        """fp32 | int8 | int4 for one HF tensor name (--keep globs first, in order)."""
        for pattern, dtype in self.keep:
            if fnmatch.fnmatchcase(name, pattern):
                return dtype
        return self.lm_head if name == "lm_head.weight" else self.quant

    @property
    def active(self) -> bool:
        return self.quant != "fp32" or self.lm_head != "fp32"

    def quantize(self, name: str, w: np.ndarray) -> QuantizedWeight | None:
        """The quantized weight, or None to keep it fp32; records the tensor's error in the report."""
        bits = WEIGHT_DTYPES[self.dtype_for(name)]
        if bits is None:
            return None
        if bits not in self._quantizers:
            self._quantizers[bits] = make_quantizer(self.algo, bits, self.block_size, self.symmetric)
        q = self._quantizers[bits].quantize(w)
        self.report[name] = {"bits": bits, "block_size": self.block_size, "max_rel": q.max_rel, "rms_rel": q.rms_rel}
        return q
