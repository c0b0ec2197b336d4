"""`ortllm generate` on the real SmolLM2 artifact (the default build: engine graph), through main() in process."""
from __future__ import annotations

from tests.cli_run import ortllm


def test_chat_answers_paris(smollm2_engine):
    p = ortllm("generate", smollm2_engine, "--chat", "--prompt", "What is the capital of France?", "--max-tokens", "32")
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout, p.stdout
