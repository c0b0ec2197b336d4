"""`ortllm run`: one-shot (a prompt or stdin) and an interactive session driven in a real terminal (tmux send-keys /
capture-pane): streamed replies, history, multi-line input, /set, Ctrl-C stopping a reply and not the session,
/bye. The session runs SmolLM2 (the smallest real chat model of the fixtures): the tiny random model answers in a
few milliseconds, too fast for a Ctrl-C to land inside a reply. One-shot runs go through main() in process."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_run import ortllm


def test_one_shot_from_an_argument_and_from_stdin(tiny_engine, tiny_artifact):
    a = ortllm("run", tiny_engine, "hello there", "--temperature", "0", "--max-tokens", "8", "--threads", "1")
    b = ortllm("run", tiny_engine, "--temperature", "0", "--max-tokens", "8", "--threads", "1", stdin="hello there")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout and a.stdout.strip()
    p = ortllm("run", tiny_engine, "hi", "--temperature", "-1")
    assert p.returncode == 1 and "temperature" in p.stderr and "Traceback" not in p.stderr
    p = ortllm("run", tiny_artifact, "hi")
    assert p.returncode == 1 and "portable artifact" in p.stderr


class Terminal:
    """One tmux session running a command; keys in, screen text out."""

    def __init__(self, command: str, name: str):
        self.name = name
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "200", "-y", "60", command], check=True)

    def send(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def line(self, text: str) -> None:
        self.send("-l", text)
        self.send("Enter")

    def screen(self) -> str:
        p = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-2000", "-t", self.name], capture_output=True,
                           text=True)
        return p.stdout

    def alive(self) -> bool:
        return subprocess.run(["tmux", "has-session", "-t", self.name], capture_output=True).returncode == 0

    def wait(self, cond, what: str, timeout: float = 120) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            screen = self.screen()
            if cond(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{what}; the screen:\n{self.screen()}")

    def prompts(self) -> int:
        return sum(ln.startswith(">>>") for ln in self.screen().splitlines())

    def wait_prompt(self, n: int, what: str) -> str:
        """Until the n-th `>>> ` prompt is on screen (the answer before it is complete)."""
        return self.wait(lambda s: sum(ln.startswith(">>>") for ln in s.splitlines()) >= n, what)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (make test installs it with apt-get)")
def test_interactive_session_in_a_terminal(smollm2_engine, tmp_path):
    exe = Path(sys.executable).with_name("ortllm")
    log = tmp_path / "stderr.log"
    term = Terminal(f"env PYTHONUNBUFFERED=1 {exe} run {smollm2_engine} --temperature 0 --max-tokens 24 "
                    f"--threads 1 2>{log}", f"ortllm-run-{os.getpid()}")
    try:
        term.wait_prompt(1, "no prompt")
        term.line("What is the capital of France? One word.")
        screen = term.wait_prompt(2, "no answer")
        assert "Paris" in screen.split("One word.", 1)[1], screen

        term.line("/set temperature 0.2")
        term.wait(lambda s: "set temperature = 0.2" in s, "/set did not answer")
        term.line("/set top_p 7")
        term.wait(lambda s: "error: top_p" in s, "a bad /set value was not refused")
        term.line("/show")
        term.wait(lambda s: "temperature = 0.2" in s and "top_p = 0.95" in s, "/show")

        n = term.prompts()
        term.line('"""')                        # a multi-line message
        term.line("Repeat these two words:")
        term.line('apple banana"""')
        term.wait_prompt(n + 1, "no answer to the multi-line message")
        term.line("/history")
        screen = term.wait(lambda s: "user: Repeat these two words:\napple banana" in s, "history")
        assert "user: What is the capital of France? One word." in screen

        term.line("/set max_tokens 400")
        term.line("/set temperature 0")
        term.wait(lambda s: "set temperature = 0.0" in s, "/set temperature 0")
        n = term.prompts()
        term.line("Write a long story about a dragon.")
        term.wait(lambda s: s.rstrip().splitlines()[-1] != "", "no reply started", timeout=60)
        time.sleep(0.5)
        term.send("C-c")                                   # stops the reply, not the session
        term.wait(lambda s: "[stopped]" in s, "Ctrl-C did not stop the reply")
        term.wait_prompt(n + 1, "no prompt after Ctrl-C")
        assert term.alive()
        term.send("C-c")                                   # at the prompt: a hint, still alive
        term.wait(lambda s: "(Ctrl-D or /bye to leave)" in s, "Ctrl-C at the prompt")
        term.line("/bye")
        term.wait(lambda s: not term.alive(), "/bye did not end the session", timeout=30)
        assert "Traceback" not in log.read_text()
    finally:
        term.close()
