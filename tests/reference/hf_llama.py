"""transformers references for the llama graphs: greedy logits (and the LlamaForCausalLM of our weights)."""
from __future__ import annotations

import numpy as np

from ortllm.pipeline.hf_model import hf_model_from_weights  # noqa: F401  (re-exported for the tests)


def hf_greedy_logits(model, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy-decode `steps` tokens with transformers; returns them and the logits that chose each [steps, V]."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, torch.stack(out.logits, 1)[0].float().numpy()
