"""How far a quantized artifact's adapter rows are from the fp32 artifact's, beside how far its base rows are: the
adapter's own error on top of the quantization's (e.g. an adapter mapped onto a SmoothQuant'ed build's rescales,
runtime/smoothing.py). Both artifacts are builds of one model holding the same adapter (`ortllm adapters add`).

    .venv/bin/python bench/probes/adapter_fidelity.py QUANTIZED FP32 --adapter NAME [--prompts 3] [--seed 1]

Prints the rms over every prompt token's logprob (random token ids, lengths 33-60) of quantized minus fp32, for base
rows and for the adapter's rows, and the adapter's effect on the fp32 artifact. Equal base and adapter figures: the
adapter costs nothing beyond the quantization. Dev tooling.
"""
from __future__ import annotations

import argparse

import numpy as np

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams


def prompt_logprobs(art: str, adapter: str, prompts: list[list[int]]) -> dict[str | None, np.ndarray]:
    out = {}
    with Engine.from_artifact(art, num_blocks=64) as engine:
        for a in (None, adapter):
            rows = [engine.generate([p], SamplingParams(max_tokens=1, prompt_logprobs=True, adapter=a))[0]
                    for p in prompts]
            out[a] = np.concatenate([[t.logprob for t in r.prompt_logprobs[1:]] for r in rows])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("quantized")
    ap.add_argument("fp32")
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    prompts = [rng.integers(3, 5000, n).tolist() for n in rng.integers(33, 61, a.prompts)]
    ref, got = (prompt_logprobs(art, a.adapter, prompts) for art in (a.fp32, a.quantized))

    def rms(v):
        return float(np.sqrt(np.mean(np.square(v))))
    print(f"{len(ref[None])} positions; adapter effect on fp32 {rms(ref[a.adapter] - ref[None]):.4f} rms")
    print(f"quantized - fp32: base rows {rms(got[None] - ref[None]):.4f} rms, "
          f"{a.adapter} rows {rms(got[a.adapter] - ref[a.adapter]):.4f} rms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
