"""PEFT LoRA adapters with random non-zero weights on our base weights: the reference adapters of the tests."""
from __future__ import annotations


def make_peft_lora(weights, out, seed: int, r: int, targets: list[str], rslora: bool = False, dora: bool = False):
    """Save a PEFT LoRA (A and B random, x0.5: enough to change greedy tokens, still a perturbation) to
    `out` the way PEFT saves it; returns the PeftModel (eval mode) as the reference. dora: a DoRA adapter
    (use_dora=True) whose magnitude vectors are PEFT's initial norms times U(0.8, 1.25) per output, as training
    moves them."""
    import torch
    from peft import LoraConfig, get_peft_model

    from ortllm.pipeline.hf_model import hf_model_from_weights

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, init_lora_weights=False, use_rslora=rslora,
                     use_dora=dora)
    model = get_peft_model(hf_model_from_weights(weights), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_magnitude_vector" in name:
                p.mul_(torch.empty_like(p).uniform_(0.8, 1.25))
            elif "lora_" in name:
                p.mul_(0.5)
    model.save_pretrained(out)
    return model.eval()
