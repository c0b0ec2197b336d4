"""transformers references for the llama graphs: a LlamaForCausalLM from our weights, and greedy logits."""
from __future__ import annotations

import numpy as np


def hf_model_from_weights(weights):
    """LlamaForCausalLM holding exactly `weights` (fp32); used for random-weight recipes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = {k: v for k, v in weights.config.to_hf_config().items() if k != "architectures"}
    model = LlamaForCausalLM(LlamaConfig(**hf_cfg)).eval()
    state = {k: torch.from_numpy(v) for k, v in weights.tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


def hf_greedy_logits(model, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy-decode `steps` tokens with transformers; returns them and the logits that chose each [steps, V]."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, torch.stack(out.logits, 1)[0].float().numpy()
