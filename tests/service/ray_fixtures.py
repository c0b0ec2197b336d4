"""What the Ray tests share (tests/service/test_http_ray.py: one node; test_ray_nodes.py: several): the tiny model
with 4 adapters (the fixture tiny_lora_artifact, tests/service/conftest.py), the Zipf adapter trace over them, the
engine sizes that make 4 adapters not fit one replica."""
from __future__ import annotations

import random
import socket

ADAPTERS = ("a0", "a1", "a2", "a3")
# each replica holds 2 adapter slots (4 adapters do not fit in one), 4 running + 4 queued
ENGINE_OVERRIDES = {"num_blocks": 256, "max_slots": 2, "max_adapters_per_batch": 2, "max_num_seqs": 4,
                    "max_queued": 4}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def zipf_trace(n: int, seed: int) -> list[str]:
    """n adapter names, Zipf s = 1 over ADAPTERS (docs/architecture.md, Benchmarks: the multi-adapter trace)."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) for k in range(len(ADAPTERS))]
    return rng.choices(ADAPTERS, weights, k=n)
