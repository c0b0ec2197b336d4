"""Shape recipes at user sizes (`kind = "random-dir"`: Llama 3.2 3B, Llama 3.1 8B): seeded random weights written
tensor by tensor as a sharded fp16 safetensors directory under $ORTLLM_HOME/shapes/, then built from it like any HF
directory (read lazily, pipeline/sources.add_safetensors), so neither the generator nor the build ever holds the
model's fp32 copy (an 8B model's is 32 GB).

Each tensor has its own generator, seeded (seed, tensor index): the directory is the same on every machine, and a
tensor is made in row chunks of CHUNK_ELEMS values, so the generator's peak is one chunk. Projections ~ N(0, 1/in),
norms 1 + N(0, 0.1), the embedding N(0, 1), as pipeline/sources.random_weights makes the small shape recipes.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from ortllm.runtime.hash_cache import ortllm_home

from .errors import BuildError
from .recipes import Recipe
from .weights import ModelConfig, expected_shapes

SHARD_BYTES = 2 << 30          # fp16 bytes a shard, about (a tensor is never split)
CHUNK_ELEMS = 1 << 24          # values generated at a time (64 MB of fp32)
DONE = ".complete"             # written last: a directory without it was interrupted and is made again


# quality.json's note where the in-build fidelity check does not run
NO_FIDELITY = ("skipped: random weights (a shape recipe) make the KLD against fp32 meaningless (`ortllm build "
               "--fp32-reference layers` runs it all the same, one layer at a time, for its time and memory)")


def shape_config(recipe: Recipe) -> ModelConfig:
    try:
        return ModelConfig(**recipe.architecture, bos_token_id=None, eos_token_ids=(0,))
    except TypeError as e:
        raise BuildError(f"recipe '{recipe.name}' [architecture] is invalid: {e}") from None


def shape_dir(recipe: Recipe) -> Path:
    """The recipe's safetensors directory, generated on first use."""
    seed = int(recipe.source.get("seed", 0))
    out = ortllm_home() / "shapes" / f"{recipe.name}-seed{seed}"
    if not (out / DONE).is_file():
        write_shape_dir(shape_config(recipe), seed, out)
    return out


def _tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator, rows: slice) -> np.ndarray:
    """Rows `rows` of the tensor, fp32."""
    if len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    n = rows.stop - rows.start
    scale = 1.0 if name == "model.embed_tokens.weight" else 1.0 / np.sqrt(shape[1])
    return rng.standard_normal((n, shape[1]), dtype=np.float32) * np.float32(scale)


def _shards(shapes: dict[str, tuple[int, ...]]) -> list[list[str]]:
    out, size = [[]], 0
    for name, shape in shapes.items():
        nbytes = 2 * int(np.prod(shape))
        if out[-1] and size + nbytes > SHARD_BYTES:
            out.append([])
            size = 0
        out[-1].append(name)
        size += nbytes
    return out


def write_shape_dir(cfg: ModelConfig, seed: int, out: Path, log=print) -> None:
    """config.json + model-0000i-of-0000n.safetensors (fp16) + the index, one tensor (one row chunk) at a time."""
    shapes = expected_shapes(cfg)
    index = {n: i for i, n in enumerate(shapes)}
    out.mkdir(parents=True, exist_ok=True)
    (out / DONE).unlink(missing_ok=True)
    shards = _shards(shapes)
    weight_map, total = {}, 0
    for s, names in enumerate(shards):
        file = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name in names:
            nbytes = 2 * int(np.prod(shapes[name]))
            header[name] = {"dtype": "F16", "shape": list(shapes[name]), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        total += offset
        log(f"writing {file} ({offset / 2**30:.1f} GiB, {len(names)} tensors) ...")
        with open(out / file, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for name in names:
                shape = shapes[name]
                rng = np.random.default_rng([seed, index[name]])
                step = max(1, CHUNK_ELEMS // shape[-1]) if len(shape) == 2 else shape[0]
                for a in range(0, shape[0], step):
                    f.write(_tensor(name, shape, rng, slice(a, min(a + step, shape[0]))).astype(np.float16).tobytes())
    hf = cfg.to_hf_config() | {"torch_dtype": "float16"}
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}     # transformers reads total_size
    (out / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2) + "\n")
    (out / DONE).write_text(f"seed {seed}\n")
