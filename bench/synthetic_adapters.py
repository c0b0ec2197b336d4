"""Synthetic LoRA adapters for the LoRA scenarios (lora-overhead, lora-mix, lora-trace, lora-swap) and the probes:
seeded random A, B in PEFT's file format, added to a copy of an artifact whose files are hard links of the source's
(runtime/artifact_editor.ArtifactDraft.from_base, as Ollama's create makes a model from its base)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ortllm.runtime.adapter_files import add_adapter_to
from ortllm.runtime.artifact_editor import ArtifactDraft
from ortllm.runtime.contract import ModelConfig

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_peft_lora(out: Path, model: ModelConfig, rank: int, seed: int, targets=ATTN, b_scale: float = 0.01) -> Path:
    """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors) with seeded random weights:
    A ~ N(0, 1 / in), B ~ N(0, b_scale^2), lora_alpha = 2 x rank."""
    from safetensors.numpy import save_file

    from ortllm.runtime.adapter_files import target_shapes

    rng = np.random.default_rng(seed)
    shapes, tensors = target_shapes(model), {}
    for i in range(model.num_layers):
        for t in targets:
            n_in, n_out = shapes[t]
            kind = "self_attn" if t in ATTN else "mlp"
            key = f"base_model.model.model.layers.{i}.{kind}.{t}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (b_scale * rng.standard_normal((n_out, rank))).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                         "target_modules": list(targets), "bias": "none"}))
    return out


def link_copy(artifact: Path, out: Path) -> Path:
    """A copy of an artifact to add adapters to: every file a hard link of the source's (a copy where links fail;
    adding adapters rewrites the manifest by rename, so the source artifact stays as it was)."""
    ArtifactDraft.from_base(artifact, out)
    return out


def with_adapters(artifact: Path, work: Path, ranks: list[int]) -> tuple[Path, list[str]]:
    """work/artifact: a link_copy of `artifact` with adapters bench0, bench1, ... of the given ranks (LoRA on
    ATTN, seeded k), their PEFT directories work/peft0, work/peft1, ...; (that artifact, the adapters' names)."""
    draft = ArtifactDraft.from_base(artifact, work / "artifact")
    model = ModelConfig.from_dict(draft.manifest["model"])
    names = []
    for k, r in enumerate(ranks):
        add_adapter_to(draft, write_peft_lora(work / f"peft{k}", model, r, seed=k), f"bench{k}")
        names.append(f"bench{k}")
    draft.commit()
    return draft.path, names
