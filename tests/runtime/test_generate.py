"""`ortllm generate` on the real SmolLM2 artifact."""
from __future__ import annotations

import subprocess
import sys


def test_chat_answers_paris(smollm2_artifact):
    p = subprocess.run([sys.executable, "-m", "ortllm", "generate", str(smollm2_artifact), "--chat",
                        "--prompt", "What is the capital of France?", "--max-tokens", "32"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout, p.stdout
