"""OpenVINO GenAI peer: ContinuousBatchingPipeline (paged attention, the plugin's default KV precision), B requests
added at once, then step() until all are done; greedy, EOS ignored.

Runs inside the OpenVINO peers' virtualenv (.venv-peers-ov, see ci/install_peers.sh), standalone from the repo root:
  .venv-peers-ov/bin/python bench/peers/openvino_driver.py --model DIR --scenario decode --batch 4
prints one JSON line {ok, scenario, batch, metric, unit, samples, ...}. DIR is an OpenVINO IR directory that
`optimum-cli export openvino --weight-format int4|int8 ...` wrote from the same hf/ directory as the other peers
(openvino_model.xml/.bin, the tokenizer IRs, config.json).

Timing: the clock starts before the B add_request calls; "first" is after the step() at which every request has
its first token (handle.can_read()); "end" after the step() that finishes the last one. Prefix caching is off
(random prompts, a new seed per sample: no system gets cache hits); max_num_batched_tokens covers B x prompt, so
the B prompts go through in one step like the other drivers' one prefill call. 2 inference threads, 1 stream.

Logits (quality): ContinuousBatchingPipeline hands out tokens only, so the window runs through the same
openvino_model.xml with plain `openvino` (the stateful IR optimum-intel writes: input_ids, attention_mask,
position_ids, beam_idx in; logits [1, n, vocab] of every position out), one forward pass per window with the
state (the KV cache) reset before it.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from _common import Clock, main, prompts  # noqa: E402

import numpy as np

MAX_BATCHED_TOKENS = 16 * 512     # >= every scenario's B x prompt (16 x 64, 1 x 512, 1 x 1984): one prefill step


class OpenVinoDriver:
    """OpenVINO GenAI (ContinuousBatchingPipeline) peer driver"""
    system = "openvino"

    @staticmethod
    def add_arguments(p):
        p.add_argument("--model", required=True, help="OpenVINO IR directory (openvino_model.xml) of optimum-cli")

    def __init__(self, args):
        import openvino as ov
        import openvino_genai as og

        self.ov, self.og, self.dir, self.threads = ov, og, args.model, args.threads
        with open(os.path.join(args.model, "config.json")) as f:
            self.vocab = json.load(f)["vocab_size"]
        sched = og.SchedulerConfig()
        sched.enable_prefix_caching = False
        sched.max_num_batched_tokens = MAX_BATCHED_TOKENS
        sched.max_num_seqs = 64
        sched.cache_size = 1           # GB of KV blocks for the CPU plugin (allocated as the sequences grow)
        self.properties = {"INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1}
        self.pipe = og.ContinuousBatchingPipeline(args.model, sched, "CPU", self.properties)
        self.next_id = 0
        self.request = None             # the plain-openvino logits request, made at the first window
        self.version = {"openvino": ov.get_version(), "openvino_genai": getattr(og, "__version__", "?")}
        self.ir = self._ir_info()

    def _ir_info(self) -> dict:
        """What optimum-cli wrote: nncf's weight compression options (the rt_info at the end of openvino_model.xml)."""
        import re
        with open(os.path.join(self.dir, "openvino_model.xml"), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 16384))
            tail = f.read().decode(errors="replace")
        keys = ("mode", "group_size", "ratio", "all_layers", "awq", "scale_estimation", "backup_mode", "gptq")
        found = dict(re.findall(r'<(\w+) value="([^"]*)" />', tail.split("<weight_compression>")[-1]))
        return {k: found[k] for k in keys if k in found} if "<weight_compression>" in tail else {}

    def info(self) -> dict:
        ov_core = self.ov.Core()
        kv = ov_core.get_property("CPU", "KV_CACHE_PRECISION") if "KV_CACHE_PRECISION" in \
            ov_core.get_property("CPU", "SUPPORTED_PROPERTIES") else None
        return {"system": self.system, "version": self.version, "weight_compression": self.ir,
                "kv_cache_precision": str(kv), "inference_precision": str(ov_core.get_property(
                    "CPU", "INFERENCE_PRECISION_HINT")), "cpu_pinning": bool(ov_core.get_property(
                    "CPU", "ENABLE_CPU_PINNING")), "properties": self.properties}

    def run(self, batch: int, prompt_len: int, new: int, seed: int):
        og, ov = self.og, self.ov
        ids = prompts(self.vocab, batch, prompt_len, seed).astype(np.int64)
        config = og.GenerationConfig()
        config.max_new_tokens = config.min_new_tokens = new
        config.ignore_eos = True
        config.do_sample = False
        tensors = [ov.Tensor(np.ascontiguousarray(ids[i:i + 1])) for i in range(batch)]
        clock = Clock()
        handles = []
        for t in tensors:
            handles.append(self.pipe.add_request(self.next_id, t, config))
            self.next_id += 1
        counts = [0] * batch
        while self.pipe.has_non_finished_requests():
            self.pipe.step()                  # one scheduled step: the prompts first, then a token of each
            if clock.t_first is None:
                for i, h in enumerate(handles):
                    if not counts[i] and h.can_read():
                        counts[i] += sum(len(o.generated_ids) for o in h.read().values())
                if all(counts):
                    clock.first()
        clock.end()
        for i, h in enumerate(handles):      # the tokens not read in the loop
            counts[i] += sum(len(o.generated_ids) for o in h.read_all())
        return clock.prefill_s, clock.decode_s if new > 1 else 0.0, counts

    def logits(self, ids):
        """float32 [len(ids), vocab] of one window: the stateful IR in one pass from an empty state."""
        if self.request is None:
            core = self.ov.Core()
            model = core.compile_model(os.path.join(self.dir, "openvino_model.xml"), "CPU", self.properties)
            self.request = model.create_infer_request()
            self.inputs = {i.get_any_name() for i in model.inputs}
        self.request.reset_state()
        n = len(ids)
        feeds = {"input_ids": ids.astype(np.int64)[None], "attention_mask": np.ones((1, n), np.int64),
                 "position_ids": np.arange(n, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32)}
        unknown = self.inputs - feeds.keys()
        if unknown:
            raise RuntimeError(f"openvino_model.xml has inputs {sorted(unknown)} this driver does not know how to feed")
        self.request.infer({k: v for k, v in feeds.items() if k in self.inputs})
        return np.array(self.request.get_tensor("logits").data[0], dtype=np.float32)


if __name__ == "__main__":
    sys.exit(main(OpenVinoDriver))
