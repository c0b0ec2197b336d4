"""transformers' model of the family holding exactly our fp32 weights (torch; `build` extra only).

Used where a torch model of the same weights is needed: LoRA training (PEFT) and the references."""
from __future__ import annotations

from .weights import ModelWeights


def hf_model_from_weights(weights: ModelWeights):
    """The family's transformers model (families.hf_model_spec) holding exactly these fp32 weights, eval mode."""
    import numpy as np
    import torch
    import transformers

    from .families import hf_model_spec

    cfg_cls, model_cls, kw, tensors = hf_model_spec(weights.config, weights.tensors)
    hf_cfg = getattr(transformers, cfg_cls)(**kw)
    if "sliding" in weights.config.layer_types or weights.config.final_logit_softcap:
        hf_cfg._attn_implementation = "eager"      # windows and softcaps as the family's reference code has them
    model = getattr(transformers, model_cls)(hf_cfg).eval()
    # GGUF/safetensors tensors may be read-only views of the file: torch wants writable memory
    state = {k: torch.from_numpy(np.require(v, requirements="W")) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ValueError(f"weights do not fit {model_cls}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if weights.config.tie_word_embeddings:
        model.tie_weights()
    return model
