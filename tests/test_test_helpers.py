"""The suite's own helpers: a hard-linked artifact copy that a test can damage without damaging the original
(tests/artifact_copies.py), and the CLI in process (tests/cli_run.py) reporting what the process would."""
from __future__ import annotations

import os

from tests.artifact_copies import ONNX_READS, linked_copy, own_file
from tests.cli_run import ortllm, ortllm_process


def test_linked_copy_shares_bytes_until_a_file_is_owned(tmp_path):
    src = tmp_path / "src"
    (src / "adapters").mkdir(parents=True)
    (src / "manifest.json").write_text("{}")
    (src / "adapters" / "a.safetensors").write_bytes(b"abc")
    (src / "model.onnx.data").write_bytes(b"weights")
    dst = linked_copy(src, tmp_path / "dst", copied=ONNX_READS)
    assert os.path.samefile(src / "manifest.json", dst / "manifest.json")
    assert os.path.samefile(src / "adapters" / "a.safetensors", dst / "adapters" / "a.safetensors")
    assert not os.path.samefile(src / "model.onnx.data", dst / "model.onnx.data")     # onnx reads it: a copy
    assert (dst / "model.onnx.data").read_bytes() == b"weights"
    own_file(dst / "manifest.json").write_text('{"damaged": true}')
    assert (src / "manifest.json").read_text() == "{}" and (src / "manifest.json").stat().st_nlink == 1


def test_cli_in_process_gives_the_status_and_restores_the_environment(tmp_path):
    helped = ortllm("--help")
    assert helped.returncode == 0 and "VERB" in helped.stdout
    bad = ortllm("no-such-verb")             # the parser's exit (SystemExit), not this process's
    assert bad.returncode == 1 and "VERB must be one of" in bad.stderr
    assert (bad.returncode, bad.stderr) == (lambda p: (p.returncode, p.stderr))(ortllm_process("no-such-verb"))
    before = dict(os.environ)
    gone = ortllm("show", "tiny:none", env={"ORTLLM_HOME": str(tmp_path / "home")})
    assert gone.returncode == 1 and gone.stderr.startswith("ortllm: error:") and "tiny:none" in gone.stderr
    assert dict(os.environ) == before
