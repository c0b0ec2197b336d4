"""onnxruntime-genai peer: Generator with batch_size B (static batching), greedy, EOS held off by min_length.

Runs inside .venv-peers (standalone: run by path from the repo root):
  .venv-peers/bin/python bench/peers/genai_driver.py --model DIR --scenario decode --batch 4
prints one JSON line {ok, scenario, batch, metric, unit, samples, ...}. DIR is the output of
`python -m onnxruntime_genai.models.builder -p int4 -e cpu` (block_size 32; see ci/install_peers.sh).

Logits (quality): genai's Generator hands out the last position's logits only, so the window runs through the
same model.onnx with plain onnxruntime (the version onnxruntime-genai itself loads), in one forward pass with an
empty past: input_ids, attention_mask and position_ids of the window, past_key_values.* of length 0; the graph's
`logits` output holds every position (the builder's default, prune_lm_head=false).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

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
            self.config = json.load(f)["model"]
        self.vocab = self.config["vocab_size"]
        self.dir, self.threads, self.session = args.model, args.threads, None
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

    def _session(self):
        if self.session is None:
            import onnxruntime as ort
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = self.threads, 1
            path = os.path.join(self.dir, self.config["decoder"]["filename"])
            self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return self.session

    def logits(self, ids):
        """float32 [len(ids), vocab] of one window: model.onnx in one pass, every position's logits."""
        s, dec = self._session(), self.config["decoder"]
        n = len(ids)
        types = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
                 "tensor(float16)": np.float16}
        feeds = {}
        for i in s.get_inputs():
            dt = types[i.type]
            if i.name == "input_ids":
                feeds[i.name] = ids.astype(dt)[None]
            elif i.name == "attention_mask":
                feeds[i.name] = np.ones((1, n), dt)
            elif i.name == "position_ids":
                feeds[i.name] = np.arange(n, dtype=dt)[None]
            elif i.name.startswith("past_key_values."):
                feeds[i.name] = np.zeros((1, dec["num_key_value_heads"], 0, dec["head_size"]), dt)
            else:
                raise RuntimeError(f"model.onnx has an input {i.name!r} this driver does not know how to feed")
        (logits,) = s.run(["logits"], feeds)
        return logits[0].astype(np.float32)


if __name__ == "__main__":
    sys.exit(main(GenaiDriver))
