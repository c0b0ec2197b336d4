"""llama.cpp peer for the multi-adapter trace (`ortllm bench --scenario lora-trace --peers llama.cpp`): requests for
LoRA adapters served the way llama-server serves them, one adapter set per llama_decode.

Runs inside .venv-peers (standalone, run by path from the repo root; imports nothing of ortllm):
  .venv-peers/bin/python bench/peers/llamacpp_lora_driver.py --gguf BASE.gguf --lora NAME=PEFT_DIR ... \
      --work DIR --trace TRACE.json [--slots 16] [--threads 2]
  .venv-peers/bin/python bench/peers/llamacpp_lora_driver.py --gguf BASE.gguf --lora NAME=PEFT_DIR ... \
      --work DIR --logits IDS.json --adapter NAME --out LOGITS.npy
prints one JSON line. Each PEFT directory is converted once into DIR/NAME.gguf (lora_gguf.py; --lora-gguf
NAME=FILE takes a converted one as it is) and loaded with llama_adapter_lora_init; a request's adapter runs at
scale 1 (llama.cpp multiplies by alpha / r itself).

TRACE.json: {"requests": [{"at": s after the start, "prompt": [token ids], "max_tokens": n, "adapter": NAME}]}.
The replay is llama-server's loop (tools/server, update_slots) with `--parallel SLOTS` and continuous batching:
  - an arrived request takes an idle slot (least recently used first) or waits in a FIFO queue;
  - each iteration builds one batch: first the next token of every generating slot, in slot order, then prompt
    tokens of slots still reading their prompt, up to n_batch (2048, its default) tokens; the first slot taken
    fixes the batch's adapter set and a slot with another one is skipped ("requests with different LoRA
    configurations will not be batched together"): it waits for an iteration whose first slot has its adapter;
  - llama_set_adapters_lora with that set (llama.cpp changes nothing when it is the current one), one
    llama_decode, a greedy token (argmax) for every slot that got logits; EOS is never a stop, so each request
    gets exactly max_tokens tokens, as the ortllm side does.
KV: one sequence per slot in one unified cache (llama-server's --kv-unified; --kv-split: a stream per slot,
measured no faster here), n_ctx = slots x the longest request rounded up to 256.
Threads: ggml's workers spin at barriers, so on a machine with fewer free cores than threads a llama_decode can
take several times longer (seen: 2 threads 5x slower than 1 on a 2-core host under load 9); compare systems at a
thread count the machine has free.
Reply: per request ttft (s from its arrival to its first token) and latency (to its last token), the wall
time from the start to the last token, decode calls, adapter switches and the mean tokens per llama_decode.

Logits (the conversion check): the window's every-position logits with the adapter applied, float32 [n, vocab].
The real llama-server takes the same trace (per-request `lora` ids and scales, the same one-set-per-batch loop):
docs/notes/benchmarks.md, "The adapter trace on the real llama-server", says what wiring it would take.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from _common import answer_once  # noqa: E402
from llamacpp_driver import LlamaCppDriver  # noqa: E402
from lora_gguf import write_lora_gguf  # noqa: E402

import numpy as np  # noqa: E402

N_BATCH = 2048          # llama-server's default --batch-size
PROMPT, GENERATING = "prompt", "generating"
UNSET = object()


class LlamaCppLoraDriver(LlamaCppDriver):
    """llama.cpp (llama-cpp-python) served one adapter set per batch, as llama-server does"""

    def __init__(self, args):
        super().__init__(args)
        L = self.L
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        self.adapters: dict[str, object] = {}
        files = {}
        for opt, specs in (("--lora", args.lora), ("--lora-gguf", args.lora_gguf)):
            for spec in specs:
                name, _, path = spec.partition("=")
                if not name or not path:
                    raise ValueError(f"{opt} takes NAME={'PEFT_DIR' if opt == '--lora' else 'FILE'}; got {spec!r}")
                files[name] = (opt, Path(path))
        for name, (opt, path) in files.items():
            out = path
            if opt == "--lora":
                out = work / f"{name}.gguf"
                if not out.is_file() or out.stat().st_mtime < (path / "adapter_model.safetensors").stat().st_mtime:
                    tmp = work / f"{name}.gguf.tmp"
                    write_lora_gguf(path, Path(args.gguf), tmp)
                    tmp.replace(out)
            ptr = L.llama_adapter_lora_init(self.model, str(out).encode())
            if not ptr:
                raise RuntimeError(f"llama.cpp could not load the LoRA {out}")
            self.adapters[name] = ptr
        self._current = UNSET

    def _set_adapter(self, ctx, name: str | None) -> bool:
        """The context's adapter set: [name] at scale 1, or none. True when it changed."""
        if name == self._current:
            return False
        L = self.L
        if name is None:
            rc = L.llama_set_adapters_lora(ctx, None, 0, None)
        else:
            arr = (L.llama_adapter_lora_p_ctypes * 1)(self.adapters[name])
            rc = L.llama_set_adapters_lora(ctx, arr, 1, (ctypes.c_float * 1)(1.0))
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora({name}) returned {rc}")
        self._current = name
        return True

    def _new_context(self, n_ctx: int, n_seq: int, n_batch: int, unified: bool = True):
        L = self.L
        c = L.llama_context_default_params()
        c.n_ctx, c.n_seq_max, c.kv_unified = n_ctx, n_seq, unified or n_seq == 1
        c.n_batch, c.n_ubatch = n_batch, min(n_batch, 512)
        c.n_threads = c.n_threads_batch = self.threads
        c.no_perf = True
        ctx = L.llama_init_from_model(self.model, c)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context (n_ctx {n_ctx}, n_seq_max {n_seq})")
        self._current = UNSET
        return ctx

    # ------------------------------------------------------------ the trace
    def replay(self, requests: list[dict], n_slots: int, unified: bool = True) -> dict:
        L = self.L
        for r in requests:
            if r["adapter"] is not None and r["adapter"] not in self.adapters:
                raise ValueError(f"the trace asks for adapter {r['adapter']!r}; loaded: {sorted(self.adapters)}")
        per_slot = -(-max(len(r["prompt"]) + r["max_tokens"] + 1 for r in requests) // 256) * 256
        ctx = self._new_context(n_slots * per_slot, n_slots, N_BATCH, unified)
        mem = L.llama_get_memory(ctx)
        b = L.llama_batch_init(N_BATCH, 0, 1)
        n_req = len(requests)
        ttft, latency, got = [None] * n_req, [None] * n_req, [0] * n_req
        slots: list[dict | None] = [None] * n_slots
        last_used = [0.0] * n_slots
        waiting: collections.deque[int] = collections.deque()
        nxt = done = decodes = switches = tokens_in = 0
        try:
            t0 = time.perf_counter()
            while done < n_req:
                now = time.perf_counter() - t0
                while nxt < n_req and requests[nxt]["at"] <= now:
                    waiting.append(nxt)
                    nxt += 1
                while waiting and None in slots:        # an idle slot, least recently used first
                    s = min((i for i in range(n_slots) if slots[i] is None), key=last_used.__getitem__)
                    i = waiting.popleft()
                    slots[s] = {"req": i, "state": PROMPT, "n_past": 0, "last": None,
                                "adapter": requests[i]["adapter"]}
                if all(s is None for s in slots):
                    time.sleep(max(0.0, requests[nxt]["at"] - (time.perf_counter() - t0)))
                    continue
                chosen, n, rows = UNSET, 0, []         # rows: (slot, batch index of its logits)
                for state in (GENERATING, PROMPT):
                    for s, st in enumerate(slots):
                        if st is None or st["state"] != state or n >= N_BATCH:
                            continue
                        if chosen is UNSET:
                            chosen = st["adapter"]
                        elif st["adapter"] != chosen:
                            continue
                        prompt = requests[st["req"]]["prompt"]
                        if state == GENERATING:
                            toks = [(st["last"], True)]
                        else:
                            take = prompt[st["n_past"]:st["n_past"] + N_BATCH - n]
                            end = st["n_past"] + len(take) == len(prompt)
                            toks = [(t, end and k == len(take) - 1) for k, t in enumerate(take)]
                        for tok, want in toks:
                            b.token[n], b.pos[n], b.n_seq_id[n] = int(tok), st["n_past"], 1
                            b.seq_id[n][0] = s
                            b.logits[n] = want
                            if want:
                                rows.append((s, n))
                            st["n_past"] += 1
                            n += 1
                b.n_tokens = n
                switches += self._set_adapter(ctx, chosen)
                self._decode(ctx, b)
                decodes += 1
                tokens_in += n
                argmax = self._argmax(ctx, [i for _, i in rows])
                now = time.perf_counter() - t0
                for (s, _), tok in zip(rows, argmax):
                    st = slots[s]
                    i = st["req"]
                    got[i] += 1
                    if ttft[i] is None:
                        ttft[i] = now - requests[i]["at"]
                    st["state"], st["last"] = GENERATING, tok
                    if got[i] == requests[i]["max_tokens"]:
                        latency[i] = now - requests[i]["at"]
                        L.llama_memory_seq_rm(mem, s, -1, -1)
                        slots[s], last_used[s] = None, now
                        done += 1
            wall = time.perf_counter() - t0
        finally:
            L.llama_batch_free(b)
            L.llama_free(ctx)
        return {"ok": True, "ttft": ttft, "latency": latency, "tokens": got, "wall": wall, "decodes": decodes,
                "adapter_switches": switches, "tokens_per_decode": tokens_in / max(decodes, 1), "slots": n_slots,
                "threads": self.threads, "info": self.info()}

    # ------------------------------------------------------------ logits with an adapter
    def adapter_logits(self, ids: list[int], adapter: str | None) -> np.ndarray:
        L = self.L
        n = len(ids)
        size = -(-n // 256) * 256
        ctx = self._new_context(size, 1, size)
        b = L.llama_batch_init(n, 0, 1)
        try:
            self._set_adapter(ctx, adapter)
            for p, t in enumerate(ids):
                b.token[p], b.pos[p], b.n_seq_id[p] = int(t), p, 1
                b.seq_id[p][0] = 0
                b.logits[p] = True
            b.n_tokens = n
            self._decode(ctx, b)
            return np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n, self.vocab)).copy()
        finally:
            L.llama_batch_free(b)
            L.llama_free(ctx)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", required=True, help="the base model's GGUF")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PEFT_DIR", help="an adapter (repeatable)")
    p.add_argument("--lora-gguf", action="append", default=[], metavar="NAME=FILE",
                   help="an adapter already in llama.cpp's LoRA GGUF (repeatable)")
    p.add_argument("--work", required=True, help="directory for the converted LoRA GGUFs (kept between runs)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, default=16, help="llama-server's --parallel")
    p.add_argument("--trace", type=Path, help="TRACE.json to replay")
    p.add_argument("--kv-split", action="store_true",
                   help="one KV stream per slot (kv_unified false) instead of one shared cache")
    p.add_argument("--logits", type=Path, help="IDS.json: a token window whose logits to save (with --out)")
    p.add_argument("--adapter", default=None, help="with --logits: the adapter (none: the base model)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)

    def work() -> dict:
        driver = LlamaCppLoraDriver(a)
        if a.trace:
            return driver.replay(json.loads(a.trace.read_text())["requests"], a.slots, not a.kv_split)
        if a.logits and a.out:
            np.save(a.out, driver.adapter_logits(json.loads(a.logits.read_text()), a.adapter))
            return {"ok": True, "out": str(a.out)}
        raise ValueError("give --trace TRACE.json, or --logits IDS.json with --out OUT.npy")

    return answer_once(work)


if __name__ == "__main__":
    sys.exit(main())
