"""transformers peer: LlamaForCausalLM fp32 on CPU (torch), batched greedy decode with the model's KV cache.

Runs inside .venv-peers (standalone: run by path from the repo root):
  .venv-peers/bin/python bench/peers/transformers_driver.py --hf DIR --scenario decode --batch 4
prints one JSON line {ok, scenario, batch, metric, unit, samples, ...}. DIR is a transformers directory
(config.json + model.safetensors) of the same fp32 weights ortllm builds from (see ci/install_peers.sh).
The loop is written out (prompt forward, then one forward of B new tokens per step, argmax) rather than
model.generate(), so the prefill/decode split is timed exactly and EOS never stops a row.
Logits (quality): one forward of the window, every position's logits.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from _common import Clock, main, prompts  # noqa: E402


class TransformersDriver:
    """transformers (fp32) peer driver"""
    system = "transformers"

    @staticmethod
    def add_arguments(p):
        p.add_argument("--hf", required=True, help="transformers model directory (config.json + safetensors)")

    def __init__(self, args):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(1)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
        self.vocab = self.model.config.vocab_size
        self.versions = {"transformers": transformers.__version__, "torch": torch.__version__}

    def info(self) -> dict:
        return {"system": self.system, "version": self.versions}

    def run(self, batch: int, prompt_len: int, new: int, seed: int):
        torch = self.torch
        ids = torch.from_numpy(prompts(self.vocab, batch, prompt_len, seed).astype("int64"))
        generated = 1
        with torch.inference_mode():
            clock = Clock()
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1, :].argmax(-1, keepdim=True)
            clock.first()
            past = out.past_key_values
            for _ in range(new - 1):
                out = self.model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1, :].argmax(-1, keepdim=True)
                generated += 1
            clock.end()
        return clock.prefill_s, clock.decode_s if new > 1 else 0.0, [generated] * batch

    def logits(self, ids):
        """float32 [len(ids), vocab] of one window."""
        torch = self.torch
        with torch.inference_mode():
            x = torch.from_numpy(ids.astype("int64"))[None]
            return self.model(input_ids=x, use_cache=False).logits[0].float().numpy()


if __name__ == "__main__":
    sys.exit(main(TransformersDriver))
