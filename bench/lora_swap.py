"""lora-swap scenario: time to first token of a request whose adapter is in a slot, in host RAM or on disk, idle,
beside 16 decoding requests and queued behind them (prefetch); run_swap says how."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams

from .engine import PLAIN
from .results import row
from .synthetic_adapters import with_adapters

SWAP_STATES = ("base", "slot", "host", "disk")      # where the probe's adapter is when it arrives (base: none)
SWAP_CONDITIONS = ("idle", "load", "queued")
QUEUE_BOUND_S = 30.0           # the queued condition's longest wait for the prefetch before it frees a seat anyway


class _ActivateLog:
    """Times the engine's AdapterRegistry.activate (the step's adapter loads, on the engine thread, before the
    model run): [(names, where each was at the call, seconds)] per call. Instrumentation of the real registry:
    it wraps the bound method and calls it unchanged."""

    def __init__(self, registry):
        self.registry, self.calls = registry, []
        inner = registry.activate

        def activate(names):
            where = {n: registry.state(n) for n in names}
            t = time.perf_counter()
            out = inner(names)
            self.calls.append((list(names), where, time.perf_counter() - t))
            return out
        registry.activate = activate

    def first(self, name: str, since: int) -> tuple[str, float]:
        """(where `name` was, seconds the call took) at the first activate since call index `since` naming it."""
        for names, where, secs in self.calls[since:]:
            if name in names:
                return where[name], secs
        raise RuntimeError(f"adapter {name} was never activated")


def run_swap(artifact: Path, repeats: int = 3, threads: int | None = None, load_batch: int = 16,
             prompt_len: int = 64, rank: int = 16) -> list[dict]:
    """Time to first token of a request (prompt_len tokens, 1 new) whose adapter (rank `rank`, q, k, v, o) is in
    a session slot, in host RAM only or on disk only, beside a base-model request, in three conditions:
      idle    the engine runs nothing else;
      load    load_batch base requests are decoding; the request gets a free seat at the next step;
      queued  load_batch + 1 decoding fill every seat; the request waits in the queue until one of them is
              cancelled: once the prefetch started at submit has put its adapter in host RAM (at most
              QUEUE_BOUND_S), and not before 16 steps. A fixed number of steps was too short for a disk read on a
              busy host; waiting for the prefetch itself measures what the queue buys (its TTFT includes the wait).
    Besides TTFT, "activate_ms": the time the step that admitted it spent in the registry's activate (disk read
    and hash check if not prefetched, int8 packing into the slot), which every row of that step waits for; and
    "prefetched": the share of requests whose adapter was already in host RAM (or a slot) at that moment.
    A disk-only or host-only adapter is a fresh one each sample (never read before / read into host RAM only)."""
    overrides = {"threads": threads} if threads else {}
    fresh = 2 * len(SWAP_CONDITIONS) * repeats
    rng = np.random.default_rng(0)
    ttft = {(c, s): [] for c in SWAP_CONDITIONS for s in SWAP_STATES}
    act = {(c, s): [] for c in SWAP_CONDITIONS for s in SWAP_STATES if s != "base"}
    hit = {(c, s): [] for c in SWAP_CONDITIONS for s in SWAP_STATES if s != "base"}
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-swap-") as tmp:
        art, names = with_adapters(Path(artifact), Path(tmp), [rank] * (fresh + 1))
        warm, unused = names[0], iter(names[1:])
        with Engine.from_artifact(art, max_num_seqs=load_batch + 1, max_adapters_per_batch=4,
                                  enable_prefix_cache=False, **PLAIN, **overrides) as engine:
            log = _ActivateLog(engine.adapters)
            vocab, reg = engine.vocab_size, engine.adapters
            one = dict(max_tokens=1, temperature=0.0, ignore_eos=True)

            def probe(adapter, blocker=None):
                """TTFT of one request; with `blocker` (the queued condition) every seat is taken and the request
                waits until `blocker` is cancelled: after 16 of its steps and once the adapter has left the disk."""
                h = engine.submit(rng.integers(3, vocab, prompt_len).tolist(), SamplingParams(**one, adapter=adapter))
                if blocker is not None:
                    deadline = time.monotonic() + QUEUE_BOUND_S
                    while time.monotonic() < deadline and (
                            len(blocker.token_times) < 16
                            or adapter is not None and reg.state(adapter) in ("disk", "loading")):
                        time.sleep(0.002)
                    blocker.cancel()
                h.result()
                return h.first_token_time - h.submitted

            probe(warm)                                               # warm-up, and `warm` into a slot
            for _ in range(repeats):
                for cond in SWAP_CONDITIONS:
                    for state in SWAP_STATES:
                        name = None if state == "base" else warm if state == "slot" else next(unused)
                        if state == "slot" and not reg.is_resident(warm):
                            probe(warm)
                        if state == "host":
                            reg.host_weights(name)
                        load = []
                        if cond != "idle":                             # base requests decoding when it arrives
                            n = load_batch + (cond == "queued")
                            load = [engine.submit(rng.integers(3, vocab, prompt_len).tolist(),
                                                  SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True))
                                    for _ in range(n)]
                            while any(h.first_token_time is None for h in load):
                                time.sleep(0.005)
                        since = len(log.calls)
                        ttft[(cond, state)].append(probe(name, load[0] if cond == "queued" else None))
                        for h in load:
                            h.cancel()
                        for h in load:
                            h.result()
                        if name is not None:
                            where, secs = log.first(name, since)
                            act[(cond, state)].append(secs)
                            hit[(cond, state)].append(float(where in ("host", "slot")))
    rows = []
    for (cond, state), v in ttft.items():
        scen = f"lora-swap ({cond})"
        b = 1 if cond == "idle" else load_batch
        rows.append(row(scen, "ortllm", b, f"ttft_ms (adapter in {state})" if state != "base" else
                        "ttft_ms (base model)", v, "ms", scale=1e3, rank=rank, prompt_tokens=prompt_len))
        if state != "base":
            rows.append(row(scen, "ortllm", b, f"activate_ms (adapter in {state})", act[(cond, state)], "ms",
                            scale=1e3))
            rows.append(row(scen, "ortllm", b, f"prefetched (adapter in {state})", hit[(cond, state)], "fraction"))
    return rows
