"""onnxruntime-genai peer: Generator with batch_size B (static batching), greedy, EOS held off by min_length.

Runs inside .venv-peers (standalone: run by path from the repo root):
  .venv-peers/bin/python bench/peers/genai_driver.py --model DIR --scenario decode --batch 4
prints one JSON line {ok, scenario, batch, metric, unit, samples, ...}. DIR is the output of
`python -m onnxruntime_genai.models.builder -p int4 -e cpu` (block_size 32; see ci/install_peers.sh).
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from _common import Clock, main, prompts  # noqa: E402


class GenaiDriver:
    """onnxruntime-genai peer driver"""
    system = "onnxruntime-genai"

    @staticmethod
    def add_arguments(p):
        p.add_argument("--model", required=True, help="onnxruntime-genai model directory (genai_config.json)")

    def __init__(self, args):
        import onnxruntime_genai as og

        self.og = og
        config = og.Config(args.model)
        config.clear_providers()     # CPU
        # same intra-op thread count as every other system; no inter-op parallelism
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": args.threads, "inter_op_num_threads": 1}}}}))
        self.model = og.Model(config)
        with open(os.path.join(args.model, "genai_config.json")) as f:
            self.vocab = json.load(f)["model"]["vocab_size"]
        self.version = getattr(og, "__version__", "?")

    def info(self) -> dict:
        return {"system": self.system, "version": self.version}

    def run(self, batch: int, prompt_len: int, new: int, seed: int):
        og = self.og
        ids = prompts(self.vocab, batch, prompt_len, seed)
        params = og.GeneratorParams(self.model)
        total = prompt_len + new
        # min_length = max_length: the EOS logit is masked until the last token, so every row gets `new`
        params.set_search_options(do_sample=False, batch_size=batch, max_length=total, min_length=total)
        gen = og.Generator(self.model, params)
        clock = Clock()
        gen.append_tokens(ids)       # prompt forward (logits of the last position)
        gen.generate_next_token()    # first token: argmax of the prefill logits
        clock.first()
        steps = 1
        while steps < new and not gen.is_done():
            gen.generate_next_token()   # one batched decoder step + argmax
            steps += 1
        clock.end()
        generated = [len(gen.get_sequence(i)) - prompt_len for i in range(batch)]
        del gen
        return clock.prefill_s, clock.decode_s if new > 1 else 0.0, generated


if __name__ == "__main__":
    sys.exit(main(GenaiDriver))
