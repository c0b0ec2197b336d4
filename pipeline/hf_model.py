"""transformers' LlamaForCausalLM holding exactly our fp32 weights (torch; `build` extra only).

Used where a torch model of the same weights is needed: LoRA training (PEFT) and the references."""
from __future__ import annotations

from .weights import ModelWeights


def hf_model_from_weights(weights: ModelWeights):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = {k: v for k, v in weights.config.to_hf_config().items() if k != "architectures"}
    model = LlamaForCausalLM(LlamaConfig(**hf_cfg)).eval()
    import numpy as np
    # GGUF/safetensors tensors may be read-only views of the file: torch wants writable memory
    state = {k: torch.from_numpy(np.require(v, requirements="W")) for k, v in weights.tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ValueError(f"weights do not fit LlamaForCausalLM: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if weights.config.tie_word_embeddings:
        model.tie_weights()
    return model
