"""PagedAttention alone, one decode token at context 2048 (or `--context N`) on SmolLM2's heads (9 query, 3 kv,
D = 64, blocks of 16) over an int8 (or `--kv int4`) cache, as the engine calls it: caches bound in place (IO
binding), and each call reading another layer's region (int8 at context 2048: 786 KB, int4: 405 KB) of a pool
sized for `--layers` layers, so with 30 the keys and values come from memory rather than from L2 (with 1 they
stay in L2: the op's compute alone).

    .venv/bin/python bench/probes/attention_membench.py [--threads 2] [--layers 30] [--kv int8|int4]
                                   [--layout ascending] [--context 2048]

--layout: the order of a sequence's blocks in its region, as the block table lists them: ascending (what
runtime/block_pool.py hands out), descending (a FIFO free list after tables freed tail-first) or shuffled.
Prints microseconds per call (min and median of 15 rounds of 4 passes over the layers). Compare ops libraries
with ORTLLM_OPS_LIBRARY=path, alternating. Dev tooling: includes the Python cost of one `run_with_iobinding`.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort

from ortllm.bench.op_graphs import bind_in_place, paged_attention_case, paged_attention_model, session

BLOCK = 16                         # tokens per cache block
CACHES = ["key_cache", "value_cache", "key_scales", "value_scales"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv", choices=("int8", "int4"), default="int8")
    ap.add_argument("--layout", choices=("ascending", "descending", "shuffled"), default="ascending")
    ap.add_argument("--context", type=int, default=2048, help="keys the new token sees, itself included")
    args = ap.parse_args(argv)
    cached = args.context - 1                 # keys before the new token
    blocks = cached // BLOCK + 1              # the sequence's blocks (128 at context 2048)
    attrs = dict(num_heads=9, kv_num_heads=3, head_size=64, block_size=BLOCK, kv_dtype=args.kv)
    stride = blocks + 1               # blocks per layer's region
    feeds = paged_attention_case(np.random.default_rng(0), [(cached, 1)], **attrs,
                                 spare_blocks=args.layers * stride - blocks)
    sess = session(paged_attention_model(**attrs), args.threads)
    values = {n: ort.OrtValue.ortvalue_from_numpy(feeds[n]) for n in CACHES}
    bindings = []
    for layer in range(args.layers):  # one binding per layer: its own consecutive blocks, as the pool hands out
        table = feeds["block_tables"].copy()
        order = {"ascending": np.arange(blocks), "descending": np.arange(blocks)[::-1],
                 "shuffled": np.random.default_rng(layer).permutation(blocks)}[args.layout]
        table[0, :blocks] = layer * stride + order
        bindings.append(bind_in_place(sess, {**feeds, "block_tables": table}, values))
    for _ in range(3):
        for b in bindings:
            sess.run_with_iobinding(b)
    per_call = []
    for _ in range(15):
        t0 = time.perf_counter()
        for _ in range(4):
            for b in bindings:
                sess.run_with_iobinding(b)
        per_call.append((time.perf_counter() - t0) / (4 * args.layers) * 1e6)
    print(f"{args.kv}, {args.layout}, context {args.context}, threads {args.threads}, layers {args.layers}: per call "
          f"min {min(per_call):.1f} us, median {np.median(per_call):.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
