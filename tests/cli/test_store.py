"""The model store end to end on llama-tiny-random: the CLI verbs over a temporary ORTLLM_HOME, in process (two
pulls at once and a killed pull: in processes of their own)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ortllm.runtime.artifact import ArtifactError, load_artifact
from ortllm.runtime.hash_cache import HashCache
from ortllm.runtime.store import Store
from tests import cli_run


def ortllm(home: Path, *args):
    """`ortllm ARGS` over the store at `home`, in this process (tests/cli_run.py)."""
    return cli_run.ortllm(*args, env={"ORTLLM_HOME": str(home)})


def ok(proc):
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def user_error(proc, *needles):
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ortllm: error:"), proc.stderr
    for n in needles:
        assert n in line, (n, line)
    return line


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A store holding llama-tiny-random as tiny:fp32 (pulled once for the module)."""
    home = tmp_path_factory.mktemp("ortllm-home")
    ok(ortllm(home, "pull", "llama-tiny-random", "--name", "tiny:fp32"))
    return home


def test_round_trip_pull_list_show_cp_generate_rm(tmp_path):
    home = tmp_path / "home"
    out = ok(ortllm(home, "pull", "llama-tiny-random", "--quant", "int8"))
    assert "pulled llama-tiny-random:int8" in out
    assert "llama-tiny-random:int8" in ok(ortllm(home, "list"))
    shown = ok(ortllm(home, "show", "llama-tiny-random", "--verify"))     # one tag: the name alone resolves
    assert "quant int8" in shown and "every file re-hashed" in shown and "quality" in shown
    ok(ortllm(home, "cp", "llama-tiny-random:int8", "tiny:mine"))
    assert "(also: llama-tiny-random:int8)" in ok(ortllm(home, "show", "tiny:mine"))
    text = ok(ortllm(home, "generate", "tiny:mine", "--prompt", "hello", "--max-tokens", "4"))
    direct = ok(ortllm(home, "generate", Store(home).path("tiny:mine"), "--prompt", "hello", "--max-tokens", "4"))
    assert text == direct                                                   # a store name is the same artifact
    assert "freed 0 B" in ok(ortllm(home, "rm", "llama-tiny-random:int8"))  # tiny:mine still holds the files
    out = ok(ortllm(home, "rm", "tiny:mine"))
    assert "freed 0 B" not in out
    assert ok(ortllm(home, "list")).strip() == "NAME  ID  SIZE  QUANT  KV  ADAPTERS  CREATED"
    assert not any((home / "blobs").iterdir()) and not any((home / "views").iterdir())


def test_deduplication_in_bytes_on_disk(home, tmp_path):
    """Two names of one artifact cost nothing; a second build of other weights shares the tokenizer blobs."""
    store = Store(home)
    before = store.disk_bytes()
    ok(ortllm(home, "cp", "tiny:fp32", "tiny:alias"))
    assert store.disk_bytes() == before
    ok(ortllm(home, "pull", "llama-tiny-random", "--quant", "int8", "--name", "tiny:int8"))
    fp32, int8 = store.info(store.resolve("tiny:fp32")), store.info(store.resolve("tiny:int8"))
    shared = {n: s for n, s in fp32["files"].items() if int8["files"].get(n) == s}
    assert "tokenizer.json" in shared
    shared_bytes = sum(fp32["manifest"].files[n]["size"] for n in shared)
    grew = store.disk_bytes() - before
    assert grew <= int8["size"] - shared_bytes + 4096 * len(int8["files"]), (grew, int8["size"], shared_bytes)
    ok(ortllm(home, "rm", "tiny:int8", "tiny:alias"))
    assert store.disk_bytes() == before                                     # collected: back to tiny:fp32 alone


def test_garbage_collection_keeps_referenced_and_removes_orphans(home):
    store = Store(home)
    orphan = store.blobs / ("sha256-" + "0" * 64)
    orphan.write_bytes(b"left by a killed pull")
    stale_view = store.views / ("f" * 64)
    stale_view.mkdir()
    freed = store.gc()
    assert freed >= len(b"left by a killed pull") and not orphan.exists() and not stale_view.exists()
    load_artifact(store.path("tiny:fp32"), full=True)                        # everything it needs is still there


def test_corrupted_blob_is_refused_naming_the_file_and_the_repair(tmp_path):
    home = tmp_path / "home"
    ok(ortllm(home, "pull", "llama-tiny-random", "--name", "tiny:fp32"))
    store = Store(home)
    view = store.path("tiny:fp32")
    ok(ortllm(home, "generate", "tiny:fp32", "--prompt", "hi", "--max-tokens", "2"))   # hashes now cached
    data = view / "model.onnx.data"
    blob = data.resolve() if data.is_symlink() else next(b for b in store.blobs.iterdir()
                                                          if b.stat().st_ino == data.stat().st_ino)
    st = blob.stat()
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:                   # same size, one byte flipped, mtime put back
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    line = user_error(ortllm(home, "generate", "tiny:fp32", "--prompt", "hi", "--max-tokens", "2"),
                      "model.onnx.data", "does not match its sha256", "ortllm pull llama-tiny-random --name "
                      "tiny:fp32 --force")
    assert str(blob.name) in line or str(view) in line or "sha256-" in line
    with pytest.raises(ArtifactError, match="model.onnx.data"):
        load_artifact(view)
    ok(ortllm(home, "pull", "llama-tiny-random", "--name", "tiny:fp32", "--force"))     # the repair it names
    load_artifact(store.path("tiny:fp32"), full=True)
    ok(ortllm(home, "generate", "tiny:fp32", "--prompt", "hi", "--max-tokens", "2"))


def test_hash_cache_trusts_only_unchanged_files(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLLM_HOME", str(tmp_path / "home"))
    f = tmp_path / "f.bin"
    f.write_bytes(b"a" * 1000)
    cache = HashCache.default()
    first = cache.sha256(f)
    assert cache.misses == 1 and cache.sha256(f) == first and cache.hits == 1
    cache.save()
    st = f.stat()
    f.write_bytes(b"b" * 1000)                                # same size, mtime put back: ctime still moves
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert HashCache(cache.file).sha256(f) != first
    assert HashCache(cache.file).sha256(f, full=True) == HashCache(cache.file).sha256(f)


def test_two_concurrent_pulls_of_one_name(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "ORTLLM_HOME": str(home)}
    cmd = [sys.executable, "-m", "ortllm", "pull", "llama-tiny-random", "--name", "tiny:race"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = "".join(o + e for o, e in outs)
    assert said.count("pulled tiny:race") == 1 and "is in the store" in said, said
    store = Store(home)
    assert store.names() == ["tiny:race"]
    load_artifact(store.path("tiny:race"), full=True)
    assert not list((home / "tmp").iterdir())
    assert not [b for b in store.blobs.iterdir() if b.name.startswith(".tmp")]


def test_interrupted_pull_leaves_nothing_listed(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "ORTLLM_HOME": str(home)}
    p = subprocess.Popen([sys.executable, "-m", "ortllm", "pull", "llama-tiny-random", "--name", "tiny:cut"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((home / "tmp").glob("pull-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)                            # no cleanup at all
    p.wait(timeout=30)
    assert ok(ortllm(home, "list")).strip().splitlines() == ["NAME  ID  SIZE  QUANT  KV  ADAPTERS  CREATED"]
    user_error(ortllm(home, "show", "tiny:cut"), "no model 'tiny:cut'")
    Store(home).gc()                                          # what the next `ortllm rm` does
    assert not list((home / "tmp").iterdir())


def test_bad_names_and_read_only_store_models(home):
    user_error(ortllm(home, "generate", "tiny:fp3", "--prompt", "x"), "no model 'tiny:fp3'", "closest: tiny:fp32")
    user_error(ortllm(home, "show", "nothing-like-it"), "no model 'nothing-like-it'", "ortllm list")
    user_error(ortllm(home, "cp", "tiny:fp32", "Bad Name"), "not a store name")
    user_error(ortllm(home, "adapters", "remove", "tiny:fp32", "x"), "read-only", "ortllm pull DIR --name tiny:fp32")
    assert "is in the store" in ok(ortllm(home, "pull", "llama-tiny-random", "--name", "tiny:fp32"))


def test_rm_of_a_served_model_is_refused(home):
    """A server registers what it serves (servers/<pid>.json); `ortllm rm` refuses those names, `ps` lists them."""
    store = Store(home)
    ok(ortllm(home, "cp", "tiny:fp32", "tiny:held"))
    store.register_server({"url": "http://127.0.0.1:1", "models": [
        {"name": "tiny:held", "loaded": True, "bytes": 123456, "in_flight": 0, "last_used": time.time()}]})
    try:
        assert "tiny:held" in ok(ortllm(home, "ps"))
        user_error(ortllm(home, "rm", "tiny:held"), "served by a running server", f"pid {os.getpid()}")
    finally:
        store.unregister_server()
    ok(ortllm(home, "rm", "tiny:held"))
    assert "no running ortllm server" in ok(ortllm(home, "ps"))


def test_pull_of_an_artifact_directory(tiny_engine, tmp_path):
    home = tmp_path / "home"
    ok(ortllm(home, "pull", tiny_engine, "--name", "tiny:dir"))
    store = Store(home)
    src = json.loads((tiny_engine / "manifest.json").read_text())
    assert store.info(store.resolve("tiny:dir"))["manifest"].to_dict() == src
