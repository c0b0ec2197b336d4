"""The README's front door, run as a user would on the test model, so it cannot rot: the two-command quick
start is what the README says, `ortllm --help` (the installed command, as a process), a build of llama-tiny-random,
generate, and the README's own curl request (its path and JSON body, read from the README) to a live
`ortllm serve` on 127.0.0.1."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import requests

from tests.cli_run import ortllm

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _installed_ortllm(*args, timeout=300) -> subprocess.CompletedProcess:
    """The `ortllm` command the install puts beside the interpreter (`python -m ortllm` where there is none), as a
    process: the suite's test of the entry point itself. The other commands go through main() in process."""
    exe = Path(sys.executable).with_name("ortllm")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "ortllm"]
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _blocks() -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", README, re.S)


def test_quick_start_is_the_two_make_commands():
    assert "make serve\nmake test\n" in _blocks()


def test_help_build_generate(tmp_path):
    helped = _installed_ortllm("--help")
    assert helped.returncode == 0
    for verb in ("build", "generate", "serve", "batch", "eval", "adapters", "bench"):
        assert verb in helped.stdout and f"ortllm {verb}" in README
    out = tmp_path / "tiny"
    built = ortllm("build", "llama-tiny-random", "--out", out)
    assert built.returncode == 0, built.stderr[-2000:]
    assert (out / "manifest.json").is_file()
    gen = ortllm("generate", out, "--prompt", "Hello", "--max-tokens", "8")
    assert gen.returncode == 0 and gen.stdout.strip(), gen.stderr[-2000:]


def _readme_curl() -> tuple[str, dict]:
    """The path and JSON body of the README's curl example."""
    curl = next(b for b in _blocks() if b.startswith("curl "))
    words = shlex.split(curl.replace("\\\n", " "))
    url = next(w for w in words if "127.0.0.1:8000" in w)
    return url.split("127.0.0.1:8000", 1)[1], json.loads(words[words.index("-d") + 1])


def test_readme_request_to_a_live_server(tiny_engine):
    path, body = _readme_curl()
    proc = subprocess.Popen([sys.executable, "-m", "ortllm", "serve", str(tiny_engine), "--host", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
            if m:
                url = m.group(1)
                break
        assert url, proc.stderr.read()[-2000:] if proc.poll() is not None else "no URL printed"
        r = requests.post(url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] >= 1
    finally:
        proc.terminate()
        proc.wait(timeout=60)



def test_layout_names_every_top_level_folder():
    """The README's Layout section names each folder `git ls-files` has at the top level, and no other."""
    layout = README.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    folders = {f.split("/")[0] for f in files if "/" in f}
    named = set(re.findall(r"`(\.?[a-z_]+)/", layout))          # `pipeline/`, `bench/peers/`, `.ci/run`
    assert folders <= named, f"folders the Layout leaves out: {sorted(folders - named)}"
    bullets = set(re.findall(r"^- `([a-z_]+)/`", layout, re.M))
    assert bullets <= folders, f"the Layout names folders the repository does not have: {sorted(bullets - folders)}"
