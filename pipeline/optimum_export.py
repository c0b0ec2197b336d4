"""`--exporter optimum`: also export the same weights with optimum-onnx (traced), into artifact/optimum/.

For interoperability with optimum's ORTModelForCausalLM and as an independent reference: the parity
tests compare our builder's graph with this export. Needs the `build` extra (torch, transformers).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ortllm.runtime import contract as C
from ortllm.runtime.errors import ConfigError

from .errors import BuildError
from .weights import ModelWeights


def write_hf_dir(weights: ModelWeights, out: Path) -> None:
    """A transformers directory (config.json + model.safetensors, written last) of `weights`: LlamaForCausalLM for
    llama-featured models, else the family's own class and layout (families.hf_model_spec: Gemma 3, Qwen, Phi-3,
    ...), whose config needs transformers (no torch)."""
    from safetensors.numpy import save_file

    cfg = weights.config
    try:
        hf_config, tensors = cfg.to_hf_config(), dict(weights.tensors)
    except ConfigError:     # features LlamaForCausalLM lacks (windows, softcaps, norms, biases)
        import transformers

        from .families import hf_model_spec
        cfg_cls, model_cls, kw, tensors = hf_model_spec(cfg, weights.tensors)
        hf_config = getattr(transformers, cfg_cls)(**kw).to_dict() | {"architectures": [model_cls]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True))
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()
               if not (k == "lm_head.weight" and cfg.tie_word_embeddings)}
    save_file(tensors, str(out / "model.safetensors"))


def export_optimum(weights: ModelWeights, artifact_tmp: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from optimum.exporters.onnx import main_export
    except ImportError:
        raise BuildError("--exporter optimum needs the build extra: pip install 'ortllm[build]'") from None
    with tempfile.TemporaryDirectory(prefix="ortllm-hf-") as hf:
        hf_dir = Path(hf)
        write_hf_dir(weights, hf_dir)
        for name in (C.TOKENIZER, C.TOKENIZER_CONFIG):
            if (artifact_tmp / name).is_file():
                shutil.copy(artifact_tmp / name, hf_dir / name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer warnings are for optimum's developers, not our users
                main_export(str(hf_dir), output=out, task="text-generation-with-past", device="cpu",
                            do_validation=False, local_files_only=True)
        except Exception as e:  # optimum raises many types; the build stops with one line
            raise BuildError(f"optimum-onnx export failed: {type(e).__name__}: {e}") from None
