"""The peers of the lora-trace scenario: each runs its driver (bench/peers/llamacpp_lora_driver.py,
openvino_lora_driver.py) once per call, in the peer's venv, on the weights the decode scenarios use and the
adapters' PEFT directories; trace_peer picks one by its --peers name."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .adapter_trace import TRACE_SLOTS, trace_summary
from .errors import BenchError


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
