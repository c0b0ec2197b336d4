"""OpenVINO GenAI peer for the multi-adapter trace (`ortllm bench --scenario lora-trace --peers openvino`): requests
for LoRA adapters served the ways OpenVINO GenAI can serve them.

Runs inside the OpenVINO peers' venv (.venv-peers-ov, ci/install_peers.sh), standalone from the repo root; imports
nothing of ortllm:
  .venv-peers-ov/bin/python bench/peers/openvino_lora_driver.py --model DIR --lora NAME=PEFT_DIR ... \
      --trace TRACE.json [--mode switch|pipelines] [--slots 16] [--threads 2]
  .venv-peers-ov/bin/python bench/peers/openvino_lora_driver.py --model DIR --lora NAME=PEFT_DIR ... \
      --logprobs IDS.json [--adapter NAME] --out LOGPROBS.npy
prints one JSON line. DIR is an optimum-cli IR directory (openvino_model.xml), PEFT_DIR a PEFT LoRA directory: its
adapter_model.safetensors is loaded as it is (openvino_genai.Adapter) at alpha = lora_alpha / r from its
adapter_config.json (lora_alpha / sqrt(r) with use_rslora): GenAI ignores the file's alpha and multiplies B A by the
alpha it is given (src/cpp/src/lora/adapter.cpp), so this is PEFT's scale.

Why two modes. A ContinuousBatchingPipeline takes one adapter set for all its sequences: it applies an AdapterConfig
to its LoRA state only in generate() ("LoRA adapters value must be the same for all requests"); add_request()
ignores GenerationConfig.adapters and step() runs with whatever generate() applied last. So mixed adapters are
served either
  - switch (default; one model in memory): one pipeline with every adapter registered (MODE_DYNAMIC: LoRA as extra
    MatMuls on state tensors, the int4/int8 weights untouched). Requests are admitted in arrival order while the one
    at the head of the queue has the pipeline's current adapter; when it has another, admission stops, the running
    sequences finish, and the adapter is switched by a one-token generate() with it (the only call that applies an
    adapter), then admission resumes; or
  - pipelines: one pipeline per adapter (each compiled from the IR; the driver stops, with a message, when the next
    would not fit in the memory left), requests admitted in arrival order into their adapter's pipeline, and the
    pipelines with work stepped in turn (one step() at a time, as one server process of a model per adapter would
    share the cores).
Both admit at most --slots sequences at once (llama-server's --parallel; ortllm's max_num_seqs) and step() schedules
the prompts (up to 2048 tokens a step) with the running sequences, greedy, EOS never a stop: each request gets
exactly max_tokens tokens.

TRACE.json: {"requests": [{"at": s after the start, "prompt": [token ids], "max_tokens": n, "adapter": NAME}]}.
Reply: per request ttft (s from its arrival to its first token) and latency (to its last token), the wall time from
the start to the last token, steps, adapter switches, pipelines, the resident memory after loading, and the mean
tokens fed per step.

Log-probabilities (the adapter check): with echo, GenAI returns the log-probability of every prompt token given the
ones before it; --logprobs writes them, float32 [n - 1] (positions 1..n-1), with the adapter applied through the
same switch the replay uses.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from _common import answer_once  # noqa: E402

import numpy as np  # noqa: E402

MAX_BATCHED_TOKENS = 2048     # prompt tokens a step may schedule (llama-server's n_batch)
UNSET = object()


def peft_alpha(peft_dir: Path) -> float:
    """PEFT's LoRA scale of a directory: lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)."""
    cfg = json.loads((peft_dir / "adapter_config.json").read_text())
    r, alpha = float(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
    return alpha / (r ** 0.5 if cfg.get("use_rslora") else r)


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def available_gb() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 1e6


class OpenVinoLoraDriver:
    """OpenVINO GenAI ContinuousBatchingPipeline(s) serving LoRA adapters"""

    def __init__(self, args):
        import openvino as ov
        import openvino_genai as og

        self.ov, self.og, self.threads, self.slots = ov, og, args.threads, args.slots
        self.mode = args.mode
        self.adapters: dict[str, tuple[object, float]] = {}       # name -> (Adapter, alpha)
        for spec in args.lora:
            name, _, path = spec.partition("=")
            if not name or not path:
                raise ValueError(f"--lora takes NAME=PEFT_DIR; got {spec!r}")
            d = Path(path)
            self.adapters[name] = (og.Adapter(str(d / "adapter_model.safetensors")), peft_alpha(d))
        self.properties = {"INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1}
        self.model = args.model
        t = time.perf_counter()
        self.pipes, self.current = {}, {}       # adapter -> its pipeline; id(pipeline) -> the adapter its state holds
        if self.mode == "pipelines":
            grew = 0.0      # GB the last pipeline added (its first generate() included: where weights are laid out)
            for n in self.adapters:
                if len(self.pipes) and 1.2 * grew > available_gb():
                    raise MemoryError(f"a pipeline per adapter: the last one took {grew:.1f} GB and "
                                      f"{available_gb():.1f} GB are left after {len(self.pipes)} of "
                                      f"{len(self.adapters)}; use --mode switch (one pipeline) or fewer adapters")
                before = rss_gb()
                self._add_pipeline(n, self._pipeline([n]))
                grew = rss_gb() - before
        else:
            shared = self._pipeline(list(self.adapters))
            for n in self.adapters:
                self._add_pipeline(n, shared)
            if args.base:
                self.pipes[None] = shared
        self.load_s = time.perf_counter() - t
        self.rss_gb = rss_gb()
        self.next_id = 0

    def _add_pipeline(self, name: str, pipe) -> None:
        """pipe serves adapter `name`: applied once (also the first compile of its kernels). The base is never applied
        here (see _apply: switching to the base and back is what goes wrong)."""
        self.pipes[name] = pipe
        self.current.setdefault(id(pipe), UNSET)
        self._apply(pipe, name)

    def _pipeline(self, names: list):
        og = self.og
        sched = og.SchedulerConfig()
        sched.enable_prefix_caching = False
        sched.max_num_batched_tokens = MAX_BATCHED_TOKENS
        sched.max_num_seqs = self.slots
        sched.cache_size = 1           # GB of KV blocks (allocated as the sequences grow)
        cfg = og.AdapterConfig([self.adapters[n] for n in names], og.AdapterConfig.Mode.MODE_DYNAMIC)
        return og.ContinuousBatchingPipeline(self.model, sched, "CPU", {**self.properties, "adapters": cfg})

    def _config(self, max_tokens: int, adapter=UNSET):
        c = self.og.GenerationConfig()
        c.max_new_tokens = c.min_new_tokens = max_tokens
        c.ignore_eos = True
        c.do_sample = False
        if adapter is not UNSET:
            c.adapters = self.og.AdapterConfig(*self.adapters[adapter]) if adapter else self.og.AdapterConfig()
        return c

    def _apply(self, pipe, name) -> bool:
        """The pipeline's LoRA state set to adapter `name` (None: the base model) by a one-token generate() with it
        (the pipeline must have no running sequence). True when it changed.
        GenAI 2026.4.1: after an adapter, the base (an empty AdapterConfig), a step, and an adapter again, the logits
        are NaN (seen as NaN log-probabilities; adapter-to-adapter switches give the same values every time), so the
        base is registered only with --base, and prompt_logprobs refuses NaN."""
        if self.current[id(pipe)] == name:
            return False
        one = self.ov.Tensor(np.array([[3]], np.int64))
        pipe.generate([one], [self._config(1, name)])
        self.current[id(pipe)] = name
        return True

    def info(self) -> dict:
        return {"system": "openvino", "mode": self.mode, "pipelines": len({id(p) for p in self.pipes.values()}),
                "version": {"openvino": self.ov.get_version(), "openvino_genai": getattr(self.og, "__version__", "?")},
                "properties": self.properties, "load_s": self.load_s, "rss_gb_after_load": self.rss_gb}

    def _add(self, pipe, prompt: list[int], config):
        h = pipe.add_request(self.next_id, self.ov.Tensor(np.asarray([prompt], np.int64)), config)
        self.next_id += 1
        return h

    # ------------------------------------------------------------ the trace
    def replay(self, requests: list[dict]) -> dict:
        for r in requests:
            if r["adapter"] not in self.pipes:
                raise ValueError(f"the trace asks for adapter {r['adapter']!r}; loaded: {sorted(self.adapters)}"
                                 + ("" if r["adapter"] is not None or self.mode == "pipelines" else " (--base)"))
        n_req = len(requests)
        ttft, latency, got = [None] * n_req, [0.0] * n_req, [0] * n_req
        waiting: collections.deque[int] = collections.deque()
        running: dict[int, object] = {}           # request -> its handle
        turn = collections.deque(dict.fromkeys(id(p) for p in self.pipes.values()))   # pipelines, stepped in turn
        by_id = {id(p): p for p in self.pipes.values()}
        nxt = done = steps = switches = 0
        t0 = time.perf_counter()
        while done < n_req:
            now = time.perf_counter() - t0
            while nxt < n_req and requests[nxt]["at"] <= now:
                waiting.append(nxt)
                nxt += 1
            while waiting and len(running) < self.slots:
                i = waiting[0]
                name = requests[i]["adapter"]
                pipe = self.pipes[name]
                if self.current[id(pipe)] != name:       # switch mode: another adapter is running on the pipeline
                    if any(self.pipes[requests[j]["adapter"]] is pipe for j in running):
                        break
                    switches += self._apply(pipe, name)
                waiting.popleft()
                running[i] = (pipe, self._add(pipe, requests[i]["prompt"], self._config(requests[i]["max_tokens"])))
            if not running:
                time.sleep(max(0.0, requests[nxt]["at"] - (time.perf_counter() - t0)))
                continue
            while not by_id[turn[0]].has_non_finished_requests():
                turn.rotate(-1)
            pipe = by_id[turn[0]]
            turn.rotate(-1)
            pipe.step()
            steps += 1
            now = time.perf_counter() - t0
            for i, (p, h) in list(running.items()):
                if p is not pipe or not h.can_read():
                    continue
                got[i] += sum(len(o.generated_ids) for o in h.read().values())
                if ttft[i] is None and got[i]:
                    ttft[i] = now - requests[i]["at"]
                if got[i] >= requests[i]["max_tokens"]:
                    latency[i] = now - requests[i]["at"]
                    del running[i]
                    done += 1
            if not pipe.has_non_finished_requests() and any(p is pipe for p, _ in running.values()):
                raise RuntimeError("OpenVINO finished requests short of their max_tokens (dropped for lack of KV "
                                   "cache?)")
        wall = time.perf_counter() - t0
        fed = sum(len(r["prompt"]) + r["max_tokens"] - 1 for r in requests)
        return {"ok": True, "ttft": ttft, "latency": latency, "tokens": got, "wall": wall, "steps": steps,
                "adapter_switches": switches, "tokens_per_decode": fed / max(steps, 1), "slots": self.slots,
                "threads": self.threads, "info": self.info()}

    # ------------------------------------------------------------ log-probabilities with an adapter
    def prompt_logprobs(self, ids: list[int], adapter: str | None) -> np.ndarray:
        pipe = self.pipes[adapter]
        self._apply(pipe, adapter)
        c = self._config(1)
        c.echo = True          # the prompt tokens and their log-probabilities first (logprobs > 0 fails with LoRA)
        h = self._add(pipe, ids, c)
        while pipe.has_non_finished_requests():
            pipe.step()
        out = h.read_all()[0]
        if list(out.generated_ids[:len(ids)]) != list(ids):
            raise RuntimeError("echo did not return the prompt's tokens first")
        lp = np.asarray(out.generated_log_probs[1:len(ids)], np.float32)   # position 0 has no log-probability
        if not np.isfinite(lp).all():
            raise RuntimeError(f"OpenVINO returned {int((~np.isfinite(lp)).sum())} non-finite log-probabilities")
        return lp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="OpenVINO IR directory (openvino_model.xml) of optimum-cli")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PEFT_DIR", help="an adapter (repeatable)")
    p.add_argument("--mode", choices=("switch", "pipelines"), default="switch",
                   help="one pipeline switching adapters between batches, or one pipeline per adapter")
    p.add_argument("--base", action="store_true", help="also serve the base model (adapter null or --adapter absent)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, default=16, help="sequences running at once (llama-server's --parallel)")
    p.add_argument("--trace", type=Path, help="TRACE.json to replay")
    p.add_argument("--logprobs", type=Path, help="IDS.json: a token window whose prompt log-probabilities to save")
    p.add_argument("--adapter", default=None, help="with --logprobs: the adapter (none: the base model)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)

    def work() -> dict:
        if a.adapter is not None and a.adapter not in {s.partition("=")[0] for s in a.lora}:
            raise ValueError(f"--adapter {a.adapter!r} is not one of the --lora names")
        if a.mode == "pipelines" and (a.logprobs or a.base):
            raise ValueError("--logprobs and --base run in --mode switch (the replay's adapter switch is what "
                             "--logprobs checks)")
        a.base = a.base or (a.logprobs is not None and a.adapter is None)
        driver = OpenVinoLoraDriver(a)
        if a.trace:
            return driver.replay(json.loads(a.trace.read_text())["requests"])
        if a.logprobs and a.out:
            np.save(a.out, driver.prompt_logprobs(json.loads(a.logprobs.read_text()), a.adapter))
            return {"ok": True, "out": str(a.out)}
        raise ValueError("give --trace TRACE.json, or --logprobs IDS.json with --out OUT.npy")

    return answer_once(work)


if __name__ == "__main__":
    sys.exit(main())
