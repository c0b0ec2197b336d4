"""LoRA scenarios: the cost of adapters in mixed batches (docs/architecture.md, Benchmarks).

lora-overhead: 16 concurrent sequences decoding, all base vs spread over 1, 2, 4 distinct adapters of rank
8, 16 or 32 (LoRA on q, k, v, o), measured two ways:
  - end to end: each configuration's batch of requests runs right after a base batch; decode tokens/s and the
    ratio to that neighbour. Runs last seconds, and on a shared VM throughput drifts by tens of percent
    over seconds, so a handful of pairs cannot resolve a few percent;
  - paired steps: the same decode step (16 sequences at context 128, in the engine's own session, pool and
    adapter slots) run with all tokens on the base and with the adapters, alternating step by step (order
    ABBA), so both halves of a pair see the same machine; step throughput ratio = base time / LoRA time.
lora-mix: the cost of adapter mixes (SamplingParams(adapters={...})), by the same paired steps (16 sequences at
context 128, rank 16 on q, k, v, o): every row on adapter a, on b, on the mix a*0.7 + b*0.3; request i on adapter
i % 4, and every row mixing 2 of the 4 (the 6 pairs in turn). Rows: each configuration's step overhead against its
own interleaved base steps, per round (the configurations alternate, their order reversed every other round), and
per round the two ratios the mixes must keep: overhead(a + b) / (overhead(a) + overhead(b)) <= 1, and
overhead(2 of 4 mixed) / overhead(4 adapters) <= 2.
lora-trace: requests arriving with gamma-distributed gaps, each for an adapter drawn Zipf (s = 1) over 4 or
16 adapters of ranks 8/16/32; metric throughput and time to first token; peers: llama.cpp served one adapter set per
batch as llama-server does, OpenVINO GenAI one adapter set per pipeline (bench/peers/openvino_lora_driver.py).
Adapters are synthetic (seeded random A, B in PEFT's file format), written into a copy of the artifact.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ortllm.runtime.atomic_files import link_or_copy
from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.artifact import read_manifest
from ortllm.runtime.config import SchedulerConfig
from ortllm.runtime.contract import ModelConfig
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams, adapter_names
from ortllm.runtime.scheduler_messages import ScheduledSeq

from .engine import PLAIN, decode_run
from .errors import BenchError
from .results import row

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_peft_lora(out: Path, model: ModelConfig, rank: int, seed: int, targets=ATTN, b_scale: float = 0.01) -> Path:
    """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors) with seeded random weights:
    A ~ N(0, 1 / in), B ~ N(0, b_scale^2), lora_alpha = 2 x rank."""
    from safetensors.numpy import save_file

    from ortllm.runtime.adapter_files import target_shapes

    rng = np.random.default_rng(seed)
    shapes, tensors = target_shapes(model), {}
    for i in range(model.num_layers):
        for t in targets:
            n_in, n_out = shapes[t]
            kind = "self_attn" if t in ATTN else "mlp"
            key = f"base_model.model.model.layers.{i}.{kind}.{t}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (b_scale * rng.standard_normal((n_out, rank))).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                         "target_modules": list(targets), "bias": "none"}))
    return out


def link_copy(artifact: Path, out: Path) -> Path:
    """A copy of an artifact to add adapters to, its large files hard-linked (the weights are never written in
    place; add_adapter replaces the manifest by rename, so the source artifact stays as it was)."""
    shutil.copytree(artifact, out, copy_function=link_or_copy)
    return out


def _with_adapters(artifact: Path, work: Path, ranks: list[int]) -> tuple[Path, list[str]]:
    art = link_copy(artifact, work / "artifact")
    model = read_manifest(art).model
    names = []
    for k, r in enumerate(ranks):
        add_adapter(art, write_peft_lora(work / f"peft{k}", model, r, seed=k), f"bench{k}")
        names.append(f"bench{k}")
    return art, names


def paired_steps(engine: Engine, adapters: list, batch: int = 16, context: int = 128, pairs: int = 100,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per decode step of `batch` sequences at `context` cached tokens, (all base, request i on
    adapters[i % n]: an adapter's name or a mix, an AdapterSpec of runtime/sampling_params.py), pair by pair. Runs
    the engine's model step directly (Engine.execute, the call the engine makes per step, with its Python input
    preparation): call only while the engine is idle, on an engine without the prefix cache (the sequences are
    written into blocks 1.. of the pool)."""
    pool = engine.kv_pool
    context = min(context, engine.context_length - 2)      # tiny test models have short contexts
    per_seq = -(-(context + 1) // pool.block_size)
    if 1 + batch * per_seq > pool.num_blocks:
        raise BenchError(f"{batch} sequences at context {context} need {batch * per_seq} KV blocks; the pool has "
                         f"{pool.num_blocks - 1}: lower the batch or the context")
    rng = np.random.default_rng(seed)
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    engine.execute([ScheduledSeq(f"p{i}", rng.integers(3, engine.vocab_size, context).tolist(), 0, tables[i], True,
                                 None) for i in range(batch)])                # prefill: [batch x context] once
    slots, failed = engine.adapters.activate(sorted({n for a in adapters for n in adapter_names(a)}))
    if failed:
        raise BenchError("could not load adapters into slots: " + "; ".join(f"{n}: {e}" for n, e in failed.items()))
    last = rng.integers(3, engine.vocab_size, batch).tolist()

    def seqs(with_lora: bool) -> list[ScheduledSeq]:   # the decode step at position `context` (rewritten)
        return [ScheduledSeq(f"p{i}", [last[i]], context, tables[i], True,
                             adapters[i % len(adapters)] if with_lora else None) for i in range(batch)]

    def step(with_lora: bool) -> float:
        batch_seqs = seqs(with_lora)
        t0 = time.perf_counter()
        engine.execute(batch_seqs, adapter_slots=slots)
        return time.perf_counter() - t0

    if np.array_equal(engine.execute(seqs(False), slots).copy(), engine.execute(seqs(True), slots)):
        raise RuntimeError(f"adapters {adapters} left the logits unchanged: the LoRA step would time a no-op")
    for _ in range(3):                    # warm-up: both variants
        step(False), step(True)
    base, lora = np.empty(pairs), np.empty(pairs)
    for k in range(pairs):
        if k % 2 == 0:
            base[k], lora[k] = step(False), step(True)
        else:
            lora[k], base[k] = step(True), step(False)
    return base, lora


def run_overhead(artifact: Path, ranks=(8, 16, 32), counts=(1, 2, 4), batch: int = 16, repeats: int = 3,
                 threads: int | None = None, step_pairs: int = 100) -> list[dict]:
    """End to end: each configuration (rank r, n distinct adapters) runs right after a base run of the same
    batch, and its ratio is taken to that neighbour. Then `step_pairs` paired steps per configuration."""
    rng = np.random.default_rng(0)
    overrides = {"threads": threads} if threads else {}
    configs = [(r, n) for r in ranks for n in counts]
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-bench-") as tmp:
        art, names = _with_adapters(Path(artifact), Path(tmp), [r for r in ranks for _ in range(max(counts))])
        by_rank = {r: names[k * max(counts):(k + 1) * max(counts)] for k, r in enumerate(ranks)}
        with Engine.from_artifact(art, max_num_seqs=batch, max_adapters_per_batch=max(counts),
                                  enable_prefix_cache=False, **PLAIN, **overrides) as engine:
            decode_run(engine, batch, rng, new_tokens=8)                      # warm-up
            base: list[float] = []
            tps: dict[tuple, list[float]] = {c: [] for c in configs}
            ratio: dict[tuple, list[float]] = {c: [] for c in configs}
            for _ in range(repeats):                                         # base, (8, 1), base, (8, 2), ...
                for r, n in configs:
                    b = decode_run(engine, batch, rng, new_tokens=64)[0]
                    x = decode_run(engine, batch, rng, by_rank[r][:n], new_tokens=64)[0]
                    base.append(b)
                    tps[(r, n)].append(x)
                    ratio[(r, n)].append(x / b)
            steps = {c: paired_steps(engine, by_rank[c[0]][:c[1]], batch, pairs=step_pairs) for c in configs}
    rows = [row("lora-overhead", "ortllm", batch, "decode_tokens_per_s (base)", base, "tok/s")]
    for (r, n) in configs:
        name = f"{n} adapters rank {r}"
        b, x = steps[(r, n)]
        rows.append(row("lora-overhead", "ortllm", batch, f"decode_tokens_per_s ({name})", tps[(r, n)], "tok/s"))
        rows.append(row("lora-overhead", "ortllm", batch, f"throughput_vs_base ({name})", ratio[(r, n)], "ratio"))
        rows.append(row("lora-overhead", "ortllm", batch, f"step_ms (base, paired with {name})", (b * 1e3).tolist(),
                        "ms"))
        rows.append(row("lora-overhead", "ortllm", batch, f"step_ms ({name})", (x * 1e3).tolist(), "ms"))
        q25, q75 = np.percentile(b / x, [25, 75])
        rows.append(row("lora-overhead", "ortllm", batch, f"step_throughput_vs_base ({name})", (b / x).tolist(),
                        "ratio", p25=float(q25), p75=float(q75)))
    return rows


def mix_configs(names: list[str]) -> dict[str, list]:
    """lora-mix's configurations over 4 adapters: each row's AdapterSpec, cycled over the batch."""
    def mix(*terms):
        return SamplingParams(adapters=dict(terms)).validate().adapter_mix
    a, b = names[:2]
    pairs = [(names[i], names[j]) for i in range(4) for j in range(i + 1, 4)]      # the 6 pairs of 4
    return {"adapter a": [a], "adapter b": [b], "mix a*0.7 + b*0.3": [mix((a, 0.7), (b, 0.3))],
            "4 adapters": names[:4], "2 of 4 mixed": [mix((x, 0.6), (y, 0.4)) for x, y in pairs]}


def run_mix(artifact: Path, rank: int = 16, batch: int = 16, rounds: int = 3, pairs: int = 100,
            threads: int | None = None) -> list[dict]:
    """The lora-mix scenario (module docstring): paired steps per configuration, `rounds` rounds alternating the
    configurations; the overhead of a round is the median over its pairs of LoRA step / base step - 1."""
    overrides = {"threads": threads} if threads else {}
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-mix-") as tmp:
        art, names = _with_adapters(Path(artifact), Path(tmp), [rank] * 4)
        configs = mix_configs(names)
        over: dict[str, list[float]] = {c: [] for c in configs}
        with Engine.from_artifact(art, max_num_seqs=batch, max_adapters_per_batch=4, enable_prefix_cache=False,
                                  **PLAIN, **overrides) as engine:
            for k in range(rounds):
                for c in (list(configs) if k % 2 == 0 else list(reversed(configs))):
                    b, x = paired_steps(engine, configs[c], batch, pairs=pairs, seed=k)
                    over[c].append(float(np.median(x / b)) - 1)
    scen, extra = "lora-mix", {"rank": rank, "pairs": pairs}
    rows = [row(scen, "ortllm", batch, f"step_overhead ({c})", v, "%", scale=100, **extra) for c, v in over.items()]
    o = {c: np.asarray(v) for c, v in over.items()}
    rows.append(row(scen, "ortllm", batch, "mix_vs_sum_of_singles", o["mix a*0.7 + b*0.3"] / (
        o["adapter a"] + o["adapter b"]), "ratio", **extra))
    rows.append(row(scen, "ortllm", batch, "mixed_2of4_vs_4_adapters", o["2 of 4 mixed"] / o["4 adapters"], "ratio",
                    **extra))
    return rows


TRACE_RATE = 4.0          # requests/s of run_trace's default trace
SATURATED_RATE = 16.0     # a queue builds on every model here: throughput is each system's capacity
SUSTAINED_SHARE = 0.5     # the scenario's second rate: half the base model's capacity on the saturated trace
BASE_SYSTEM = "ortllm (base model)"
LORA_VS_BASE = "ortllm LoRA / base"  # run_trace's rows of the LoRA's overhead against BASE_SYSTEM
TRACE_SLOTS = 16          # concurrent sequences: ortllm's max_num_seqs, llama-server's --parallel


def make_trace(n_adapters: int, requests: int, rate: float, vocab: int, seed: int = 0) -> list[dict]:
    """Gamma arrivals (shape 2, mean gap 1/rate s), adapter index ~ Zipf(s=1) over n_adapters, prompts of 16-127
    random tokens, 16-95 new tokens: [{at (s from the start), prompt, max_tokens, adapter (index)}]. The same
    (n_adapters, requests, rate, seed) gives the same trace for every system."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, n_adapters + 1)
    zipf /= zipf.sum()
    gaps = rng.gamma(2.0, 1.0 / (2.0 * rate), requests)
    picks = rng.choice(n_adapters, requests, p=zipf)
    trace = []
    for at, k in zip(np.cumsum(gaps), picks):
        prompt = rng.integers(3, vocab, int(rng.integers(16, 128))).tolist()
        trace.append({"at": float(at), "prompt": prompt, "max_tokens": int(rng.integers(16, 96)), "adapter": int(k)})
    return trace


def trace_summary(ttft, latency, tokens: int, wall: float) -> dict:
    """The rows' figures of one replay: tok/s over the wall time and the percentiles of TTFT and latency (s)."""
    return {"throughput": tokens / wall, "ttft_p50": float(np.percentile(ttft, 50)),
            "ttft_p99": float(np.percentile(ttft, 99)), "latency_p50": float(np.percentile(latency, 50)),
            "latency_p99": float(np.percentile(latency, 99))}


def replay_ortllm(engine: Engine, trace: list[dict], names: list[str] | None) -> dict:
    """Submit each request at its arrival time (greedy, EOS ignored), with its adapter (names=None: on the base
    model); TTFT and latency from the submit to the first and last token; wall from the start to the last token."""
    handles, t0 = [], time.monotonic()
    for r in trace:
        time.sleep(max(0.0, t0 + r["at"] - time.monotonic()))
        handles.append(engine.submit(r["prompt"], SamplingParams(max_tokens=r["max_tokens"], temperature=0.0,
                                                                 ignore_eos=True,
                                                                 adapter=names[r["adapter"]] if names else None)))
    outs = [h.result() for h in handles]
    if any(len(o.token_ids) != r["max_tokens"] for o, r in zip(outs, trace)):
        raise RuntimeError("ortllm generated fewer tokens than the trace asks for")
    return trace_summary([h.first_token_time - h.submitted for h in handles],
                         [h.token_times[-1] - h.submitted for h in handles], sum(len(o.token_ids) for o in outs),
                         max(h.token_times[-1] for h in handles) - t0)


class PeerTrace:
    """A peer of the trace: its driver (bench/peers/llamacpp_lora_driver.py, openvino_lora_driver.py) run once per
    call in the peer's venv, on the assets the decode scenarios use, with the adapters' PEFT directories. Subclasses
    set DRIVER, PER_CALL (the row name of the mean tokens the peer's engine takes a call) and driver_args."""
    DRIVER = ""
    PER_CALL = ""

    def __init__(self, artifact: Path, loras: dict[str, Path], work: Path, threads: int, system: str):
        from .peer_runner import DRIVERS, available, model_of

        specs = available([system], model_of(artifact))
        if not specs:
            raise BenchError(f"no {system} peer for this artifact (the warning above says why)")
        self.system, self.threads, self.work = specs[0].system, threads, work
        self.log = work / f"{self.DRIVER.removesuffix('.py')}.log"
        self.cmd = [str(specs[0].venv / "bin" / "python"), str(DRIVERS / self.DRIVER), *specs[0].model_args,
                    "--threads", str(threads), *self.driver_args(loras)]

    def driver_args(self, loras: dict[str, Path]) -> list[str]:
        raise NotImplementedError

    def _run(self, *args) -> dict:
        import json
        import os
        import subprocess

        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
        env.pop("PYTHONPATH", None)            # nothing of ortllm's venv may leak into the peers' interpreter
        p = subprocess.run([*self.cmd, *map(str, args)], capture_output=True, text=True, env=env, timeout=3600)
        with self.log.open("a") as log:
            log.write(p.stderr)
        lines = p.stdout.strip().splitlines()
        reply = json.loads(lines[-1]) if lines else {"ok": False, "error": f"exit {p.returncode}"}
        if not reply.get("ok"):
            raise BenchError(f"{self.system} LoRA driver: {reply.get('error')} (log: {self.log})")
        return reply

    def replay(self, trace: list[dict], names: list[str], slots: int = TRACE_SLOTS) -> dict:
        import json

        f = self.work / "trace.json"
        f.write_text(json.dumps({"requests": [{**r, "adapter": names[r["adapter"]]} for r in trace]}))
        reply = self._run("--trace", f, "--slots", slots)
        if reply["tokens"] != [r["max_tokens"] for r in trace]:
            raise BenchError(f"{self.system} generated other token counts than the trace asks for")
        return {**trace_summary(reply["ttft"], reply["latency"], sum(reply["tokens"]), reply["wall"]),
                "tokens_per_decode": reply["tokens_per_decode"], "adapter_switches": reply["adapter_switches"]}


class LlamaCppTrace(PeerTrace):
    """The llama.cpp peer of the trace (bench/peers/llamacpp_lora_driver.py): the same GGUF the decode scenarios
    use, the adapters' PEFT directories converted to LoRA GGUFs, one adapter set per llama_decode."""
    DRIVER = "llamacpp_lora_driver.py"
    PER_CALL = "tokens_per_llama_decode"

    def __init__(self, artifact: Path, loras: dict[str, Path], work: Path, threads: int, system="llama.cpp"):
        """loras: name -> a PEFT directory (converted by the driver) or a LoRA .gguf file (loaded as it is)."""
        super().__init__(artifact, loras, work, threads, system)

    def driver_args(self, loras: dict[str, Path]) -> list[str]:
        return ["--work", str(self.work / "lora-gguf"),
                *(a for n, d in loras.items()
                  for a in ("--lora-gguf" if str(d).endswith(".gguf") else "--lora", f"{n}={d}"))]

    def logits(self, ids: list[int], adapter: str | None) -> np.ndarray:
        import json

        f, out = self.work / "ids.json", self.work / "logits.npy"
        f.write_text(json.dumps([int(t) for t in ids]))
        self._run("--logits", f, "--out", out, *(("--adapter", adapter) if adapter else ()))
        return np.load(out)


OPENVINO_TRACE_MODES = {"switch": "", "pipelines": " (a pipeline per adapter)"}   # mode -> the rows' system suffix


class OpenVinoTrace(PeerTrace):
    """The OpenVINO GenAI peer of the trace (bench/peers/openvino_lora_driver.py): an optimum-intel export of the same
    weights, the PEFT files loaded by GenAI itself; mode "switch" (one pipeline, adapters switched between batches)
    or "pipelines" (one pipeline per adapter, stepped in turn): the driver's docstring says why these two."""
    DRIVER = "openvino_lora_driver.py"
    PER_CALL = "tokens_per_step"

    def __init__(self, artifact: Path, loras: dict[str, Path], work: Path, threads: int, system="openvino",
                 mode: str = "switch"):
        self.mode = mode
        super().__init__(artifact, loras, work, threads, system)
        self.system += OPENVINO_TRACE_MODES[mode]

    def driver_args(self, loras: dict[str, Path]) -> list[str]:
        return ["--mode", self.mode, *(a for n, d in loras.items() for a in ("--lora", f"{n}={d}"))]

    def prompt_logprobs(self, ids: list[int], adapter: str | None) -> np.ndarray:
        """log p(ids[i] | ids[:i]) for i = 1 .. n-1, float32 [n - 1], with the adapter (None: the base)."""
        import json

        f, out = self.work / "ids.json", self.work / "logprobs.npy"
        f.write_text(json.dumps([int(t) for t in ids]))
        self._run("--logprobs", f, "--out", out, *(("--adapter", adapter) if adapter else ()))
        return np.load(out)


def trace_peer(name: str, artifact: Path, loras: dict[str, Path], work: Path, threads: int) -> PeerTrace:
    """The trace's side of a --peers name: a llama.cpp GGUF system, or an OpenVINO one, its mode after a slash
    ("openvino-int8/pipelines"; "switch" when none is given)."""
    from .peer_runner import ALIASES, GGUF_TYPES, OPENVINO_MODELS

    base, _, mode = name.partition("/")
    system = ALIASES.get(base, base)
    if system in GGUF_TYPES and not mode:
        return LlamaCppTrace(artifact, loras, work, threads, system)
    if system in OPENVINO_MODELS and mode in ("", *OPENVINO_TRACE_MODES):
        return OpenVinoTrace(artifact, loras, work, threads, system, mode or "switch")
    raise BenchError(f"peer {name} has no lora-trace driver: llama.cpp GGUF systems, or OpenVINO ones with an "
                     f"optional /{'|/'.join(OPENVINO_TRACE_MODES)}")


TRACE_METRICS = (("throughput", "tok/s"), ("ttft_p50", "s"), ("ttft_p99", "s"), ("latency_p50", "s"),
                 ("latency_p99", "s"))


def run_trace(artifact: Path, n_adapters: int, requests: int = 64, rate: float = TRACE_RATE,
              threads: int | None = None, seed: int = 0, peers: list[str] = (), repeats: int = 1,
              base: bool = True, engine_overrides: dict | None = None) -> list[dict]:
    """The Zipf trace over n_adapters (ranks 8/16/32 in turn, LoRA on q, k, v, o) on ortllm, with `base` the same trace
    (arrivals, prompts, lengths) on the base model, and for each peer named (trace_peer: llama.cpp GGUF systems,
    OpenVINO ones) the same trace on it, alternating ortllm, base, peer, ortllm, ... `repeats` times. Rows per
    system: throughput, TTFT and request latency p50/p99; with `base`, "ortllm LoRA / base" rows: the LoRA's
    end-to-end overhead in % per alternating pair (throughput: base / LoRA - 1; latency p50 and p99: LoRA / base - 1);
    with a peer, "ortllm / PEER" rows: throughput ratio (> 1: ortllm faster) and latency p99 ratio (PEER / ortllm: > 1
    means ortllm's is lower). engine_overrides: EngineConfig keys for ortllm's engine (bench/probes/adapter_cap.py:
    max_adapters_per_batch, max_slots); max_queued is at least the trace's length unless given there."""
    ranks = [(8, 16, 32)[k % 3] for k in range(n_adapters)]
    # A replay submits each request at its arrival whatever the backlog, so a saturated trace may have nearly all of
    # them waiting: that is the load it measures, not one to refuse (the engine's default bound, 256, made a longer
    # trace on a slow host end in Overloaded). The queue bound is the trace's length unless the caller sets one.
    overrides = {"max_queued": max(requests, SchedulerConfig.max_queued), **({"threads": threads} if threads else {}),
                 **(engine_overrides or {})}
    scen = f"lora-trace ({n_adapters} adapters, {rate:.3g} req/s)"
    with tempfile.TemporaryDirectory(prefix="ortllm-lora-trace-") as tmp:
        art, names = _with_adapters(Path(artifact), Path(tmp), ranks)
        peer_sides = []
        for p in peers:
            try:
                peer_sides.append(trace_peer(p, Path(artifact), {n: Path(tmp) / f"peft{k}" for k, n in
                                                                 enumerate(names)}, Path(tmp), threads or 2))
            except BenchError as e:
                print(f"warning: peer {p} skipped: {e}", file=sys.stderr)
        with Engine.from_artifact(art, max_num_seqs=TRACE_SLOTS, **PLAIN, **overrides) as engine:
            trace = make_trace(n_adapters, requests, rate, engine.vocab_size, seed)
            got: dict[str, list[dict]] = {"ortllm": [], **({BASE_SYSTEM: []} if base else {}),
                                          **{p.system: [] for p in peer_sides}}
            for _ in range(repeats):
                got["ortllm"].append(replay_ortllm(engine, trace, names))
                if base:
                    got[BASE_SYSTEM].append(replay_ortllm(engine, trace, None))
                for p in list(peer_sides):
                    try:
                        got[p.system].append(p.replay(trace, names))
                    except BenchError as e:          # e.g. a pipeline per adapter that does not fit in memory
                        print(f"warning: peer {p.system} dropped from this trace: {e}", file=sys.stderr)
                        peer_sides.remove(p)
                        del got[p.system]
    rows, per_call = [], {p.system: p.PER_CALL for p in peer_sides}
    mine = got["ortllm"]
    for system, runs in got.items():
        extra = {"requests": requests, "rate": rate, "new_tokens": sum(r["max_tokens"] for r in trace),
                 "threads": threads or 2 if system not in ("ortllm", BASE_SYSTEM) else threads}
        for metric, unit in TRACE_METRICS:
            rows.append(row(scen, system, TRACE_SLOTS, metric, [r[metric] for r in runs], unit, **extra))
        if system == BASE_SYSTEM:
            pairs = list(zip(mine, runs))
            rows.append(row(scen, LORA_VS_BASE, TRACE_SLOTS, "throughput_overhead_pct",
                            [b["throughput"] / a["throughput"] - 1 for a, b in pairs], "%", scale=100))
            for m in ("latency_p50", "latency_p99"):
                rows.append(row(scen, LORA_VS_BASE, TRACE_SLOTS, f"{m}_overhead_pct",
                                [a[m] / b[m] - 1 for a, b in pairs], "%", scale=100))
        elif system != "ortllm":
            rows.append(row(scen, system, TRACE_SLOTS, per_call[system], [r["tokens_per_decode"] for r in runs],
                            "tokens", **extra))
            rows.append(row(scen, system, TRACE_SLOTS, "adapter_switches", [r["adapter_switches"] for r in runs],
                            "switches", **extra))
            rows.append(row(scen, f"ortllm / {system}", TRACE_SLOTS, "throughput_ratio",
                            [a["throughput"] / b["throughput"] for a, b in zip(mine, runs)], "x"))
            rows.append(row(scen, f"ortllm / {system}", TRACE_SLOTS, "latency_p99_ratio",
                            [b["latency_p99"] / a["latency_p99"] for a, b in zip(mine, runs)], "x"))
            rows.append(row(scen, f"ortllm / {system}", TRACE_SLOTS, "ttft_p99_ratio",
                            [b["ttft_p99"] / a["ttft_p99"] for a, b in zip(mine, runs)], "x"))
    return rows


def rate_at(rows: list[dict], share: float) -> float:
    """Requests/s that load the base model to `share` of its capacity: its throughput on a saturated replay
    (rows of run_trace) over the trace's mean new tokens per request."""
    base = next(r for r in rows if r["system"] == BASE_SYSTEM and r["metric"] == "throughput")
    return share * base["median"] / (base["new_tokens"] / base["requests"])


# ---------------------------------------------------------------- lora-swap
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
        art, names = _with_adapters(Path(artifact), Path(tmp), [rank] * (fresh + 1))
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
