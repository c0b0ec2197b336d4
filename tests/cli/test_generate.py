"""`ortllm generate` on the real SmolLM2 artifact (the default build: engine graph)."""
from __future__ import annotations

import subprocess
import sys


def test_chat_answers_paris(smollm2_engine):
    p = subprocess.run([sys.executable, "-m", "ortllm", "generate", str(smollm2_engine), "--chat",
                        "--prompt", "What is the capital of France?", "--max-tokens", "32"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout, p.stdout
