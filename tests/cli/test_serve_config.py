"""`ortllm serve`'s options from every source: flag > ORTLLM_* env var > --config TOML file > default, shown by
--print-config; per-model sizes from the file; the API key never needs the command line."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from ortllm.cli import make_parser
from ortllm.cli.serve import engine_overrides, settings
from ortllm.runtime.errors import ConfigError
from ortllm.service.config import ServiceConfig
from tests.cli_run import ortllm


def _settings(tmp_path, argv, env=None, toml=None):
    if toml is not None:
        (tmp_path / "serve.toml").write_text(toml)
        argv = [*argv, "--config", str(tmp_path / "serve.toml")]
    a = make_parser().parse_args(["serve", *argv])
    return a, settings(a, env or {})


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    toml = 'artifact = "m"\nparallel = 4\nctx_size = 256\nkv_cache_size = "auto"\nhost = "127.0.0.2"\n'
    a, v = _settings(tmp_path, ["--parallel", "8"], {"ORTLLM_PARALLEL": "6", "ORTLLM_CTX_SIZE": "300"}, toml)
    assert v["parallel"] == (8, "flag")
    assert v["ctx_size"] == (300, "env ORTLLM_CTX_SIZE")
    assert v["kv_cache_size"] == ("auto", f"file {tmp_path / 'serve.toml'}")
    assert v["host"][0] == "127.0.0.2" and v["max_batch_tokens"] == (512, "default")
    assert a.artifact == [Path("m")] and a.parallel == 8
    assert engine_overrides({k: x for k, (x, _) in v.items()}) == {
        "max_model_len": 300, "max_num_seqs": 8, "memory_budget_bytes": "auto", "max_batch_tokens": 512,
        "max_queued": 256, "spec_max_tokens": 8, "decode_steps": 4, "max_slots": 16, "max_rank": 64,
        "max_adapters_per_batch": 16}

    a, v = _settings(tmp_path, ["m", "--kv-cache-size", "1.5", "--ray"], {"ORTLLM_RAY": "false"})
    assert v["kv_cache_size"] == (1.5, "flag") and v["ray"] == (True, "flag")
    assert engine_overrides({"kv_cache_size": 1.5})["memory_budget_bytes"] == int(1.5 * 2**30)


def test_bad_values_name_their_source(tmp_path):
    with pytest.raises(ConfigError, match="ORTLLM_PARALLEL: invalid value 'many'"):
        _settings(tmp_path, ["m"], {"ORTLLM_PARALLEL": "many"})
    with pytest.raises(ConfigError, match=r"unknown key 'paralel' \(did you mean 'parallel'\?\)"):
        _settings(tmp_path, ["m"], toml="paralel = 4\n")
    with pytest.raises(ConfigError, match="expected an integer; got 2.5"):
        _settings(tmp_path, ["m"], toml="parallel = 2.5\n")
    with pytest.raises(ConfigError, match="needs a model"):
        _settings(tmp_path, [])


def test_per_model_sizes_from_the_file(tmp_path):
    toml = ('artifact = ["a", "b"]\nparallel = 4\n[models.b]\nctx_size = 128\nkv_cache_size = 0.25\n'
            'parallel = 2\n')
    a, v = _settings(tmp_path, [], toml=toml)
    assert a.model_settings == {"b": {"max_model_len": 128, "memory_budget_bytes": 2**28, "max_num_seqs": 2}}
    config = ServiceConfig(models=(("a", Path("a")), ("b", Path("b"))), engine_overrides={"max_num_seqs": 4},
                           model_overrides={"b": a.model_settings["b"]})
    assert config.overrides_for("a", Path("a")) == {"max_num_seqs": 4}
    assert config.overrides_for("b", Path("b"))["max_num_seqs"] == 2
    with pytest.raises(ConfigError, match="a model's table takes"):
        _settings(tmp_path, [], toml='artifact = ["a"]\n[models.a]\nhost = "x"\n')


def test_print_config_shows_each_value_and_source(tmp_path, tiny_engine):
    (tmp_path / "serve.toml").write_text("parallel = 4\nmax_queued = 9\n")
    p = ortllm("serve", tiny_engine, "--config", tmp_path / "serve.toml", "--ctx-size", "64", "--print-config",
               env={"ORTLLM_PARALLEL": "6", "ORTLLM_API_KEY": "sesame"})
    assert p.returncode == 0, p.stderr
    rows = {ln.split()[0]: ln for ln in p.stdout.splitlines()}
    assert re.search(r"ctx_size\s+64\s+\(flag\)", rows["ctx_size"])
    assert re.search(r"parallel\s+6\s+\(env ORTLLM_PARALLEL\)", rows["parallel"])
    assert re.search(r"max_queued\s+9\s+\(file .*serve.toml\)", rows["max_queued"])
    assert re.search(r"max_batch_tokens\s+512\s+\(default\)", rows["max_batch_tokens"])
    assert "sesame" not in p.stdout and re.search(r"api_key\s+\*\*\*\s+\(env ORTLLM_API_KEY\)", rows["api_key"])


def test_api_key_from_a_file_never_on_the_command_line(tmp_path, tiny_engine):
    key = tmp_path / "key"
    key.write_text("open-sesame\n")
    exe = Path(sys.executable).with_name("ortllm")
    proc = subprocess.Popen([str(exe), "serve", str(tiny_engine), "--port", "0", "--api-key-file", str(key),
                             "--kv-cache-size", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = None
        end = time.monotonic() + 90
        while url is None and time.monotonic() < end:
            line = proc.stdout.readline()
            if m := re.search(r"at (http://127\.0\.0\.1:\d+) ", line):
                url = m.group(1)
            assert line or proc.poll() is None, "ortllm serve exited"
        assert url, "no URL printed"
        assert b"open-sesame" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert requests.get(url + "/v1/models", timeout=10).status_code == 401
        r = requests.get(url + "/v1/models", headers={"Authorization": "Bearer open-sesame"}, timeout=10)
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_api_key_from_the_env(tmp_path):
    a, v = _settings(tmp_path, ["m"], {"ORTLLM_API_KEY": "k1"})
    assert a.api_key == "k1" and v["api_key"][1] == "env ORTLLM_API_KEY"
    (tmp_path / "key").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        _settings(tmp_path, ["m", "--api-key-file", str(tmp_path / "key")])
