"""An artifact's adapter files: PEFT LoRA directories converted into the artifact's adapter format, added to
and removed from the manifest. Used by `ortllm adapters add|list|remove|train` (cli/) and by the service's
POST/DELETE /v1/adapters while it serves; the engine reads what this writes (runtime/adapters.py).

An adapter is `adapters/<name>.safetensors` holding, per adapted projection, the MultiLoRA layout
  layers.{i}.{target}.a  [in, r]   (PEFT lora_A.weight [r, in], transposed)
  layers.{i}.{target}.b  [r, out]  (PEFT lora_B.weight [out, r], transposed)
and a manifest entry {file, sha256, size, rank, scale, targets}. scale = lora_alpha / r
(rsLoRA: lora_alpha / sqrt(r)). The manifest is rewritten atomically, so load-time verification covers
the adapter files too.

DoRA adapters (PEFT use_dora, with a lora_magnitude_vector m [out] per projection) also hold
  layers.{i}.{target}.g  [out]     g = m / ||W + scale * B A||, the norm of each output's row (PEFT's weight norm)
and the entry has dora: true. W is the base projection as the artifact's graph multiplies it (runtime/base_weights.py:
the fp32 weight of an fp32 artifact, the dequantized weight of a quantized one, as PEFT takes the norm of the
dequantized weight of a quantized base layer), so a served row is g * (x W^T + scale * x A B) and each output's
merged weight row has norm m exactly. QLinear and MultiLoRA multiply a DoRA row by g (docs/adapters.md, DoRA).

A SmoothQuant'ed artifact's projections multiply rescaled weights by rescaled inputs (runtime/smoothing.py): adapter
files still hold the PEFT weights, which the engine maps onto the rescales when it reads them, and a DoRA norm is taken
over the artifact's weight with the rescales undone.
"""
from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import numpy as np

from . import contract as C
from .artifact import read_manifest
from .artifact_editor import ArtifactDraft
from .contract import ModelConfig
from .errors import AdapterFileError
from .smoothing import Smoothing

MAX_RANK = 64
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_F16_MAX = float(np.finfo(np.float16).max)
_SMOOTHED_NOTE = " times the artifact's SmoothQuant scales (runtime/smoothing.py)"
_KEY = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")
# an MoE MLP's experts (any projection names), router or shared expert, by each family's module names (Qwen2-MoE's
# shared_expert and its gate, Granite's block_sparse_moe.router and shared_mlp)
_MOE_MODULE = re.compile(r"\.(experts|gate|shared_expert|shared_expert_gate|router|block_sparse_moe|shared_mlp)\.")
_MAGNITUDE = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_magnitude_vector(?:\.default)?(?:\.weight)?$")


def target_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """target -> (in, out) of the base projection."""
    h, d, f = model.hidden_size, model.head_dim, model.intermediate_size
    q, kv = model.num_heads * d, model.num_kv_heads * d
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}


_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """name -> fp32 array; BF16 too (PEFT saves adapters in their training dtype; NumPy has no bfloat16)."""
    raw = path.read_bytes()
    try:
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
    except (struct.error, ValueError, UnicodeDecodeError):
        raise AdapterFileError(f"{path} is not a safetensors file (damaged header)") from None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise AdapterFileError(f"{path}: tensor {name} has dtype {info['dtype']}; supported: F32, F16, BF16")
        start, end = (8 + n + o for o in info["data_offsets"])
        if end > len(raw):
            raise AdapterFileError(f"{path} is truncated: tensor {name} ends at byte {end}, file has {len(raw)}")
        arr = np.frombuffer(raw, dtype, (end - start) // np.dtype(dtype).itemsize, start).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return out


def _read_peft(peft_dir: Path) -> tuple[dict, dict[str, np.ndarray]]:
    cfg_path, weights_path = peft_dir / "adapter_config.json", peft_dir / "adapter_model.safetensors"
    if not cfg_path.is_file() or not weights_path.is_file():
        raise AdapterFileError(f"{peft_dir} is not a PEFT LoRA directory: it needs adapter_config.json and "
                               "adapter_model.safetensors (PeftModel.save_pretrained writes both)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise AdapterFileError(f"{cfg_path} is not valid JSON ({e})") from None
    return cfg, _read_safetensors(weights_path)


def _split_fused(target: str, which: str, arr: np.ndarray, shapes: dict, key: str) -> dict[str, np.ndarray]:
    """{projection: its tensor} of one LoRA tensor: {target: arr} for a served projection. A LoRA on a fused one
    (Phi-3's qkv_proj, gate_up_proj; contract.FUSED_PROJECTIONS) splits exactly: lora_A [r, in] is every part's,
    lora_B [sum of outs, r] and a DoRA magnitude [sum of outs] split by rows in the fused module's order."""
    parts = C.FUSED_PROJECTIONS.get(target)
    if parts is None:
        return {target: arr}
    if which == "A":
        return {part: arr for part in parts}
    outs = [shapes[part][1] for part in parts]
    if arr.shape[0] != sum(outs):
        raise AdapterFileError(f"adapter tensor {key}: {arr.shape[0]} outputs, the base model's {target} has "
                               f"{sum(outs)} ({' + '.join(map(str, outs))}); was it trained on another model?")
    return dict(zip(parts, np.split(arr, np.cumsum(outs)[:-1], axis=0)))


def _llama_rows(model: ModelConfig, part: str, arr: np.ndarray) -> np.ndarray:
    """A q/k lora_B [out, r] or DoRA magnitude [out] of a model whose source pairs RoPE rows (2i, 2i+1) (Helium), in
    the row order the artifact stores its q/k weights (ModelConfig.qk_rows_interleaved); anything else as it is."""
    heads = {"q_proj": model.num_heads, "k_proj": model.num_kv_heads}.get(part)
    if not model.qk_rows_interleaved or heads is None:
        return arr
    return np.ascontiguousarray(arr[C.rope_half_rows(arr.shape[0], heads)])


def _check_config(cfg: dict) -> None:
    refuse = [
        (cfg.get("peft_type", "LORA") != "LORA", f"peft_type is {cfg.get('peft_type')}; only LORA is supported"),
        (cfg.get("bias", "none") != "none", f"bias is {cfg.get('bias')!r}; only 'none' is supported"),
        (bool(cfg.get("modules_to_save")), f"modules_to_save is {cfg.get('modules_to_save')}; adapters that "
                                           "replace whole modules are not supported"),
        (bool(cfg.get("fan_in_fan_out")), "fan_in_fan_out is true; only llama Linear layers are supported"),
        (bool(cfg.get("layer_replication")), "layer_replication is set; not supported"),
    ]
    for bad, msg in refuse:
        if bad:
            raise AdapterFileError(f"adapter_config.json: {msg}")


def convert_peft(peft_dir: Path, model: ModelConfig,
                 artifact: Path | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """PEFT LoRA or DoRA -> (tensors in MultiLoRA layout, info {rank, scale, targets[, dora]}). A DoRA adapter needs
    the artifact whose base weights its norms are taken over."""
    cfg, weights = _read_peft(Path(peft_dir))
    _check_config(cfg)
    r = int(cfg.get("r", 0))
    if not 1 <= r <= MAX_RANK or cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise AdapterFileError(f"adapter_config.json: r is {r} (rank_pattern {cfg.get('rank_pattern') or 'none'}); "
                               f"ranks 1..{MAX_RANK}, one rank for all modules, are supported")
    alpha = float(cfg.get("lora_alpha", r))
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    shapes = target_shapes(model)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    magnitudes: dict[tuple[int, str], np.ndarray] = {}
    for key, arr in weights.items():
        mag = _MAGNITUDE.search(key)
        if mag:
            layer, target = int(mag.group(1)), mag.group(3)
            split = _split_fused(target, "B", arr.reshape(-1), shapes, key)
            magnitudes.update({(layer, part): _llama_rows(model, part, v) for part, v in split.items()})
            continue
        m = _KEY.search(key)
        if _MOE_MODULE.search(key) or (m and m.group(2) == "mlp"
                                                              and model.sparse_layer(int(m.group(1)))):
            raise AdapterFileError(f"adapter tensor {key} targets a mixture-of-experts MLP (its experts or router); "
                                   "LoRA on an MoE model applies to the attention projections (and dense layers' "
                                   "MLPs) only: train it with target_modules q_proj, k_proj, v_proj, o_proj")
        if not m:
            raise AdapterFileError(f"adapter tensor {key} is not a LoRA weight of a llama projection "
                                   f"({', '.join(shapes)})")
        layer, target, which = int(m.group(1)), m.group(3), m.group(4)
        if target not in shapes and target not in C.FUSED_PROJECTIONS:
            raise AdapterFileError(f"adapter tensor {key}: module {target} is not one of "
                                   f"{', '.join([*shapes, *C.FUSED_PROJECTIONS])}")
        if layer >= model.num_layers:
            raise AdapterFileError(f"adapter tensor {key}: layer {layer}, the base model has {model.num_layers}")
        for part, v in _split_fused(target, which, arr, shapes, key).items():
            pairs.setdefault((layer, part), {})[which] = _llama_rows(model, part, v) if which == "B" else v
    dora = bool(cfg.get("use_dora"))
    if dora != bool(magnitudes):
        raise AdapterFileError(
            "adapter_config.json has use_dora true (DoRA) but the weights hold no lora_magnitude_vector; save the "
            "adapter again with PEFT" if dora else "the adapter's weights hold lora_magnitude_vector tensors (DoRA) "
            "but adapter_config.json does not set use_dora; save it again with PEFT")
    if dora and set(magnitudes) != set(pairs):
        missing = sorted(set(pairs) ^ set(magnitudes))[0]
        raise AdapterFileError(f"DoRA adapter: layers.{missing[0]}.{missing[1]} has lora_A/B or a magnitude vector "
                               "but not both")
    artifact = Path(artifact) if artifact is not None else None
    smoothing = Smoothing.of(artifact, read_manifest(artifact)) if artifact is not None else Smoothing({})
    base = _dora_base(artifact, model) if dora else None
    tensors, targets = {}, set()
    for (layer, target), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterFileError(f"adapter has lora_{next(iter(ab))} but not its pair for layers.{layer}.{target}")
        n_in, n_out = shapes[target]
        a, b = ab["A"], ab["B"]
        if a.shape != (r, n_in) or b.shape != (n_out, r):
            raise AdapterFileError(f"adapter layers.{layer}.{target}: lora_A {a.shape}, lora_B {b.shape} do not fit "
                                   f"the base projection ({n_in} -> {n_out}) at rank {r}; was it trained on another "
                                   "model?")
        key = f"layers.{layer}.{target}"
        served = smoothing.to_artifact({key + ".a": a.T, key + ".b": b.T})    # as the session's slots get them
        for which, w in (("A", served[key + ".a"]), ("B", served[key + ".b"])):   # float16 slot stacks
            peak = float(np.max(np.abs(w))) if w.size else 0.0
            if not peak <= _F16_MAX:
                raise AdapterFileError(f"adapter layers.{layer}.{target}: lora_{which} has max |value| {peak:g}"
                                       f"{_SMOOTHED_NOTE if smoothing else ''}, outside float16 (the runtime's "
                                       f"adapter slots; limit {_F16_MAX:g})")
        tensors[f"layers.{layer}.{target}.a"] = np.ascontiguousarray(a.T, np.float32)
        tensors[f"layers.{layer}.{target}.b"] = np.ascontiguousarray(b.T, np.float32)
        if base is not None:
            w = smoothing.model_weight(base.weight(layer, target), layer, target)
            tensors[f"layers.{layer}.{target}.g"] = _dora_scale(w, a, b, scale,
                                                                magnitudes[(layer, target)], f"layers.{layer}.{target}")
        targets.add(target)
    if not tensors:
        raise AdapterFileError(f"{peft_dir} holds no LoRA weights")
    return tensors, {"rank": r, "scale": scale, "targets": sorted(targets)} | ({"dora": True} if dora else {})


def _dora_base(artifact: Path | None, model: ModelConfig):
    """The artifact's base weights for DoRA's norms."""
    from .base_weights import BaseWeights

    if artifact is None:
        raise AdapterFileError("a DoRA adapter is converted against an artifact's base weights; none was given")
    return BaseWeights(artifact, target_shapes(model))


def _dora_scale(w: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float, m: np.ndarray, where: str) -> np.ndarray:
    """g [out] = m / ||W + scale * B A|| over each output's row (PEFT DoraLinearLayer.get_weight_norm, dim=1);
    w [out, in], a = lora_A [r, in], b = lora_B [out, r]."""
    if m.shape != (w.shape[0],):
        raise AdapterFileError(f"adapter {where}: lora_magnitude_vector has shape {list(m.shape)}, the projection has "
                               f"{w.shape[0]} outputs")
    merged = w.astype(np.float64) + scale * (b.astype(np.float64) @ a.astype(np.float64))
    norm = np.linalg.norm(merged, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = (m.astype(np.float64) / norm).astype(np.float32)
    if not np.isfinite(g).all():
        raise AdapterFileError(f"adapter {where}: an output's merged weight row has norm 0 (or the magnitude is not "
                               "finite), so DoRA's scale m / ||W + s B A|| is undefined there")
    return g


def add_adapter(artifact: Path, peft_dir: Path, name: str, force: bool = False, meta: dict | None = None) -> dict:
    """Convert a PEFT directory into the artifact, in place (the manifest rewritten last); its manifest entry.
    meta: extra manifest fields (e.g. {"task": "add"} for adapters `ortllm adapters train` made)."""
    draft = ArtifactDraft.in_place(artifact)
    entry = add_adapter_to(draft, peft_dir, name, force, meta)
    draft.commit()
    return entry


def add_adapter_to(draft: ArtifactDraft, peft_dir: Path, name: str, force: bool = False,
                   meta: dict | None = None) -> dict:
    """add_adapter into a draft (runtime/artifact_editor.py), not yet committed: Ollama's create adds the adapter
    to a new artifact made from its base."""
    if not _NAME.match(name):
        raise AdapterFileError(f"adapter name {name!r} must be 1-64 letters, digits, '.', '_' or '-' (no '/')")
    if name in draft.adapters and not force:
        raise AdapterFileError(f"the artifact already has an adapter named {name!r}; remove it first or pass --force")
    tensors, info = convert_peft(Path(peft_dir), ModelConfig.from_dict(draft.manifest["model"]), draft.path)
    rel = f"adapters/{name}.safetensors"
    entry = draft.write_tensors(rel, tensors, {"rank": str(info["rank"]), "scale": repr(info["scale"])})
    return draft.add_adapter(name, {"file": rel, **info, **entry, **(meta or {})})


def remove_adapter(artifact: Path, name: str) -> None:
    draft = ArtifactDraft.in_place(artifact)
    if draft.remove_adapter(name) is None:
        known = ", ".join(sorted(draft.adapters)) or "none"
        raise AdapterFileError(f"the artifact has no adapter named {name!r} (adapters: {known})")
    draft.commit()


def list_adapters(artifact: Path) -> dict[str, dict]:
    return read_manifest(Path(artifact)).adapters
