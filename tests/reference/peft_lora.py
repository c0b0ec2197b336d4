"""PEFT LoRA adapters with random non-zero weights on our base weights: the reference adapters of the tests."""
from __future__ import annotations


def make_peft_lora(weights, out, seed: int, r: int, targets: list[str], rslora: bool = False):
    """Save a PEFT LoRA (A and B random, x0.5: enough to change greedy tokens, still a perturbation) to
    `out` the way PEFT saves it; returns the PeftModel (eval mode) as the reference."""
    import torch
    from peft import LoraConfig, get_peft_model

    from ortllm.pipeline.hf_model import hf_model_from_weights

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, init_lora_weights=False, use_rslora=rslora)
    model = get_peft_model(hf_model_from_weights(weights), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(0.5)
    model.save_pretrained(out)
    return model.eval()
