"""`ortllm pull hf.co/ORG/REPO[:QUANT|:FILE]` end to end: the real CLI in processes of its own, the real huggingface_hub
client over real HTTP against a hub on 127.0.0.1 (tests/hub_server.py), serving llama-tiny-random as a GGUF repo
and as a sharded safetensors repo, and repos of an architecture ortllm does not build."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ortllm.runtime.store import Store
from tests.cli_run import ortllm_process
from tests.hub_server import FakeHub

TOKEN = "hf_ortllm_test_token"


# ---------------------------------------------------------------- the repositories

def _gguf(weights, path: Path, name: str, padding: int = 0) -> bytes:
    """llama-tiny-random as llama.cpp's converter writes it (F32, q/k rows permuted, gpt2 byte tokenizer);
    `padding` bytes of an unread metadata string make the file as long as a test needs."""
    import gguf

    from ortllm.pipeline.tokenizer import _bytes_to_unicode

    cfg = weights.config
    names = gguf.TensorNameMap(gguf.MODEL_ARCH.LLAMA, cfg.num_layers)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    for add, v in ((w.add_context_length, cfg.max_position_embeddings), (w.add_embedding_length, cfg.hidden_size),
                   (w.add_block_count, cfg.num_layers), (w.add_feed_forward_length, cfg.intermediate_size),
                   (w.add_head_count, cfg.num_heads), (w.add_head_count_kv, cfg.num_kv_heads),
                   (w.add_key_length, cfg.head_dim), (w.add_value_length, cfg.head_dim),
                   (w.add_rope_dimension_count, cfg.head_dim), (w.add_vocab_size, cfg.vocab_size)):
        add(v)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    tokens = _bytes_to_unicode() + ["\u0120\u0120"] + [f"<extra_{i}>" for i in range(cfg.vocab_size - 257)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3] * (cfg.vocab_size - 257))
    w.add_token_merges(["\u0120 \u0120"])
    w.add_eos_token_id(257)
    if padding:
        w.add_string("test.padding", "x" * padding)
    for hf_name, t in weights.tensors.items():
        if hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            n = cfg.num_heads if "q_proj" in hf_name else cfg.num_kv_heads
            t = t.reshape(n, 2, t.shape[0] // n // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
        w.add_tensor(names.get_name(hf_name, try_suffixes=(".weight",)), np.ascontiguousarray(t, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _gpt2_gguf(path: Path) -> bytes:
    """A GGUF of an architecture ortllm does not build, with a real-sized header (a token list) before its weights."""
    import gguf
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_token_list([f"token{i}" for i in range(4000)])
    w.add_tensor("token_embd.weight", np.ones((256, 256), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    from safetensors.numpy import save, save_file

    from ortllm.pipeline.recipes import get_recipe
    from ortllm.pipeline.sources import random_weights
    from ortllm.pipeline.tokenizer import write_byte_tokenizer

    root = tmp_path_factory.mktemp("hub-repos")
    weights = random_weights(get_recipe("llama-tiny-random"))
    cfg = weights.config

    st = root / "st"                           # config.json, the byte tokenizer, two shards and their index
    write_byte_tokenizer(st, cfg.vocab_size)
    (st / "config.json").write_text(json.dumps(cfg.to_hf_config()))
    (st / "generation_config.json").write_text(json.dumps({"eos_token_id": 258}))
    names = sorted(weights.tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: weights.tensors[k] for k in keys}, str(st / shard))
    (st / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    safetensors_repo = {p.name: p.read_bytes() for p in st.iterdir()}
    safetensors_repo["README.md"] = b"# tiny\n"
    safetensors_repo["pytorch_model.bin"] = b"not fetched: the safetensors are"
    safetensors_repo["consolidated.safetensors"] = b"not fetched: the index names the shards"

    gguf_repo = {"README.md": b"# tiny GGUF\n",
                 "tiny-random-Q8_0.gguf": _gguf(weights, root / "q8.gguf", "tiny Q8_0"),
                 # longer than huggingface_hub's download chunk (10 MiB), so that a cut download keeps a whole chunk
                 "tiny-random-Q4_K_M.gguf": _gguf(weights, root / "q4.gguf", "tiny Q4_K_M", padding=11 << 20),
                 "tiny-random-f16.gguf": _gguf(weights, root / "f16.gguf", "tiny F16"),
                 "mmproj-tiny-f16.gguf": b"a vision projector: never picked"}
    gpt2_gguf = _gpt2_gguf(root / "gpt2.gguf")
    gpt2_st = {"config.json": json.dumps({"model_type": "gpt2", "n_layer": 1}).encode(),
               "model.safetensors": save({"wte.weight": np.ones((256, 256), np.float32)})}
    return {"tiny/tiny-random-GGUF": gguf_repo, "tiny/tiny-random": safetensors_repo,
            "other/gpt2-GGUF": {"gpt2-Q4_K_M.gguf": gpt2_gguf}, "other/gpt2": gpt2_st}


@pytest.fixture()
def hub(repos):
    with FakeHub() as h:
        for repo_id, files in repos.items():
            h.add(repo_id, files)
        for name in ("tiny-random-Q8_0.gguf", "tiny-random-Q4_K_M.gguf"):
            h.plain[name] = repos["tiny/tiny-random-GGUF"][name]
        h.plain["gpt2.gguf"] = repos["other/gpt2-GGUF"]["gpt2-Q4_K_M.gguf"]
        yield h


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """One Hugging Face cache for the module: what one test downloads, the offline test finds."""
    return tmp_path_factory.mktemp("hf-home")


def ortllm(hub: FakeHub, home: Path, hf_home: Path, *args, offline: bool = False, timeout: int = 300):
    """`ortllm ARGS` against the hub, in a process of its own (not through main() in this one: huggingface_hub reads
    HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE once, when it is imported)."""
    env = {"ORTLLM_HOME": str(home), "HF_HOME": str(hf_home), "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN,
           "HF_HUB_OFFLINE": "1" if offline else "0", "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    return ortllm_process(*args, env=env, timeout=timeout, unset=("HF_HUB_CACHE",))


def hf_download(hub: FakeHub, hf_home: Path, repo_id: str, filename: str):
    """huggingface_hub's own hf_hub_download in a process of the tests' environment."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    code = "import sys; from huggingface_hub import hf_hub_download; print(hf_hub_download(*sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, repo_id, filename], capture_output=True, text=True,
                          timeout=120, env=env)


def ok(proc) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    return proc.stdout


def user_error(proc, *needles) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ortllm: error:"), proc.stderr
    for n in needles:
        assert n in line, (n, line)
    return line


def _cache_blobs(hf_home: Path, repo_id: str) -> dict[str, Path]:
    blobs = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}" / "blobs"
    return {p.name: p for p in blobs.iterdir()} if blobs.is_dir() else {}


# ---------------------------------------------------------------- downloads that build

def test_gguf_quant_pull_resumes_a_cut_download_builds_and_generates(hub, repos, hf_home, tmp_path):
    """`:q4_k_m` picks tiny-random-Q4_K_M.gguf (case-insensitive); the server drops the connection 1 MiB past the
    first 10 MiB chunk once, and the pull resumes with a Range request from the end of what it wrote (huggingface_hub
    writes whole chunks: the bytes of the broken chunk are fetched again); the hub's sha256 is checked, the build
    lands in the store as NAME:TAG with the hub spec as its source, and the model generates."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    home = tmp_path / "home"
    gguf_file = "tiny-random-Q4_K_M.gguf"
    size = len(repos["tiny/tiny-random-GGUF"][gguf_file])
    cut = DOWNLOAD_CHUNK_SIZE + (1 << 20)
    assert size > cut
    hub.cut(gguf_file, at=cut)
    proc = ortllm(hub, home, hf_home, "pull", "hf.co/tiny/tiny-random-GGUF:q4_k_m", "--no-progress")
    assert "pulled tiny-random-q4_k_m:fp32" in ok(proc)
    assert "interrupted" in proc.stderr and "resuming" in proc.stderr, proc.stderr
    header, *gets = [r for r in hub.served("/lfs/") if r.method == "GET"]
    assert header.range == "bytes=0-4095" and header.sent == (0, 4095)         # the architecture check
    assert gets[0].range is None and gets[0].sent == (0, cut - 1)              # the cut
    resumed = DOWNLOAD_CHUNK_SIZE
    assert gets[1].range == f"bytes={resumed}-" and gets[1].status == 206 and gets[1].sent == (resumed, size - 1)
    assert len(gets) == 2
    assert not [r for r in hub.requests if "Q8_0" in r.path or "f16" in r.path or "mmproj" in r.path]
    assert all(r.auth == f"Bearer {TOKEN}" for r in hub.requests if not r.path.startswith("/lfs/"))   # HF_TOKEN
    sha = hashlib.sha256(repos["tiny/tiny-random-GGUF"][gguf_file]).hexdigest()
    assert sha in _cache_blobs(hf_home, "tiny/tiny-random-GGUF")           # in huggingface_hub's cache
    info = Store(home).info(Store(home).resolve("tiny-random-q4_k_m:fp32"))
    assert info["entry"]["source"] == "hf.co/tiny/tiny-random-GGUF:q4_k_m"       # what `pull --force` repeats
    assert info["manifest"].source["desc"] == f"gguf:{gguf_file}"
    text = ok(ortllm(hub, home, hf_home, "generate", "hf://tiny/tiny-random-GGUF:Q4_K_M", "--prompt", "hello",
                     "--max-tokens", "3", "--temperature", "0"))          # the spec names what it pulled
    assert text.strip()


def test_safetensors_repo_pull_fetches_what_the_build_reads(hub, repos, hf_home, tmp_path):
    """No quant: the safetensors weights: config.json first (its architecture checked), the tokenizer and
    generation config, and exactly the shards the index names (not consolidated.safetensors, not the .bin,
    not the README), each checked against the hub's sha256 or git blob id; then the build, from a directory of
    exactly those files."""
    home = tmp_path / "home"
    ok(ortllm(hub, home, hf_home, "pull", "hf://tiny/tiny-random", "--name", "tiny-st:fp32", "--no-progress"))
    fetched = [r.path.rsplit("/", 1)[-1] for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]
    lfs = {hashlib.sha256(d).hexdigest(): n for n, d in repos["tiny/tiny-random"].items()}
    fetched += [lfs[r.path.rsplit("/", 1)[-1]] for r in hub.requests if r.method == "GET" and "/lfs/" in r.path]
    assert fetched[0] == "config.json"
    assert sorted(fetched) == sorted(["config.json", "model.safetensors.index.json", "generation_config.json",
                                      "tokenizer.json", "tokenizer_config.json", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors"])
    info = Store(home).info(Store(home).resolve("tiny-st:fp32"))
    assert info["manifest"].source["desc"] == "hf:tiny-random" and info["manifest"].model.num_layers == 2
    assert info["entry"]["source"] == "hf://tiny/tiny-random"


def test_offline_pull_builds_from_the_cache(hub, hf_home, tmp_path):
    """HF_HUB_OFFLINE=1: the file list and the files come from huggingface_hub's cache (checked against their blob
    names, the hub's hashes) and the server sees no request; what the cache lacks is an error saying so."""
    home = tmp_path / "home"
    gguf_file = "tiny-random-Q4_K_M.gguf"
    ok(hf_download(hub, hf_home, "tiny/tiny-random-GGUF", gguf_file))    # as an earlier online pull leaves it
    hub.requests.clear()
    out = ok(ortllm(hub, home, hf_home, "pull", "hf.co/tiny/tiny-random-GGUF", "--name", "off:fp32",
                    "--no-progress", offline=True))
    assert "pulled off:fp32" in out and hub.requests == []
    assert Store(home).info(Store(home).resolve("off:fp32"))["manifest"].source["desc"] == f"gguf:{gguf_file}"
    user_error(ortllm(hub, home, hf_home, "pull", "hf.co/tiny/never-pulled", offline=True),
               "HF_HUB_OFFLINE", "tiny/never-pulled", "not in the Hugging Face cache", "pull it once online")
    user_error(ortllm(hub, home, hf_home, "pull", "hf.co/tiny/tiny-random-GGUF:Q8_0", offline=True),
               "no GGUF file of tiny/tiny-random-GGUF matches the quant tag 'Q8_0'", gguf_file)
    assert hub.requests == []


def test_plain_url_pull_resumes_checks_and_keeps_the_file(hub, repos, hf_home, tmp_path):
    """A GGUF at a plain URL (no repository): the server's sha256 ETag is checked, a cut download resumes with a
    Range request, no HF_TOKEN is sent to a host that is not the hub's, and the file kept in
    $ORTLLM_HOME/downloads serves the next pull of the URL without the network."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    home = tmp_path / "home"
    name = "tiny-random-Q4_K_M.gguf"
    url = f"{hub.url}/files/{name}"
    hub.cut(name, at=DOWNLOAD_CHUNK_SIZE + 4096)
    proc = ortllm(hub, home, hf_home, "pull", url, "--no-progress", "--name", "url:fp32")
    ok(proc)
    assert "resuming" in proc.stderr
    gets = [r for r in hub.served("/files/") if r.method == "GET"]
    assert [r.range for r in gets] == ["bytes=0-4095", None, f"bytes={DOWNLOAD_CHUNK_SIZE}-"]
    assert all(r.auth is None for r in hub.requests)
    kept = [p for p in (home / "downloads").rglob("*") if p.is_file()]
    assert [p.name for p in kept] == [name] and kept[0].read_bytes() == repos["tiny/tiny-random-GGUF"][name]
    hub.requests.clear()
    out = ortllm(hub, home, hf_home, "pull", url, "--name", "url:fp32", offline=True)
    assert "url:fp32 is in the store" in ok(out) and hub.requests == []


# ---------------------------------------------------------------- refusals: cheap, nothing is built

def test_corrupted_download_fails_its_sha256_check_and_is_removed(hub, repos, hf_home, tmp_path):
    """A file whose bytes differ from the hub's sha256 (same size, one byte flipped in transit) is refused, named,
    and removed from the cache, so the next pull downloads it anew: a hub file's URL (into huggingface_hub's
    cache), and a plain URL whose server publishes the sha256 as its ETag (into $ORTLLM_HOME/downloads)."""
    home = tmp_path / "home"
    name = "tiny-random-Q8_0.gguf"
    hub.corrupt(name)
    url = f"{hub.url}/tiny/tiny-random-GGUF/resolve/main/{name}"
    user_error(ortllm(hub, home, hf_home, "pull", url, "--no-progress"),
               f"tiny/tiny-random-GGUF/{name} failed its sha256 check", "removed", "run the same command again")
    sha = hashlib.sha256(repos["tiny/tiny-random-GGUF"][name]).hexdigest()
    assert sha not in _cache_blobs(hf_home, "tiny/tiny-random-GGUF")
    hub.corrupt(name)
    url = f"{hub.url}/files/{name}"
    user_error(ortllm(hub, home, hf_home, "pull", url, "--no-progress"), f"{url} failed its sha256 check", "removed")
    assert [p.name for p in (home / "downloads").rglob("*") if p.is_file()] == []
    assert [r.range for r in hub.served("/files/") if r.method == "GET"] == ["bytes=0-4095", None]


def test_missing_repo_file_or_quant_names_what_exists(hub, hf_home, tmp_path):
    home = tmp_path / "home"
    user_error(ortllm(hub, home, hf_home, "pull", "hf.co/tiny/tiny-random-GGUF:Q3_K_S"),
               "no GGUF file of tiny/tiny-random-GGUF matches the quant tag 'Q3_K_S'",
               "tiny-random-Q4_K_M.gguf, tiny-random-Q8_0.gguf, tiny-random-f16.gguf")
    user_error(ortllm(hub, home, hf_home, "pull", "hf.co/tiny/tiny-random-GGUF:tiny-random-Q5_0.gguf"),
               "tiny/tiny-random-GGUF has no file 'tiny-random-Q5_0.gguf'", "tiny-random-Q4_K_M.gguf")
    user_error(ortllm(hub, home, hf_home, "pull", "hf.co/tiny/no-such-repo"),
               "no model repository tiny/no-such-repo on", "HF_TOKEN")
    user_error(ortllm(hub, home, hf_home, "pull", "hf.co/tiny"), "names no repository", "hf.co/ORG/REPO")
    for verb in (("pull",), ("build", "--out", tmp_path / "out")):
        user_error(ortllm(hub, home, hf_home, verb[0], "tiny/tiny-random-GGUF", *verb[1:]),
                   "tiny/tiny-random-GGUF is neither a local path nor a recipe", "name it hf.co/tiny/tiny-random-GGUF")
    user_error(ortllm(hub, home, hf_home, "generate", "hf.co/tiny/tiny-random-GGUF", "--prompt", "hi"),
               "hf.co/tiny/tiny-random-GGUF is not in the store: run `ortllm pull hf.co/tiny/tiny-random-GGUF` first")
    assert not [r for r in hub.requests if "/lfs/" in r.path]


def test_unsupported_architecture_is_refused_before_any_weight_byte(hub, repos, hf_home, tmp_path):
    """A GGUF's architecture is read from its first KiB by a Range request (the server sent nothing past the
    header); a safetensors repo's from config.json (its weights never requested). Also for a plain URL, and for
    `ortllm build`."""
    import gguf

    from ortllm.pipeline.families import GGUF_ARCHS

    home = tmp_path / "home"
    local = tmp_path / "gpt2.gguf"
    local.write_bytes(repos["other/gpt2-GGUF"]["gpt2-Q4_K_M.gguf"])
    data_offset = gguf.GGUFReader(local).data_offset          # where its weights begin
    supported = ", ".join(sorted(GGUF_ARCHS))
    for spec in ("hf.co/other/gpt2-GGUF", f"{hub.url}/files/gpt2.gguf"):
        hub.requests.clear()
        user_error(ortllm(hub, home, hf_home, "pull", spec), "architecture 'gpt2'", supported,
                   "nothing of its weights was downloaded")
        bodies = [r for r in hub.requests if r.sent is not None]
        assert bodies and all(r.range and r.range.startswith("bytes=0-") for r in bodies), hub.requests
        assert max(r.sent[1] for r in bodies) < data_offset, (hub.requests, data_offset)
    hub.requests.clear()
    for verb in (("pull",), ("build", "--out", tmp_path / "out")):             # `ortllm build` downloads too
        hub.requests.clear()
        user_error(ortllm(hub, home, hf_home, verb[0], "hf.co/other/gpt2", *verb[1:]),
                   "model_type 'gpt2' is not supported", "weights were not downloaded")
        fetched = {r.path for r in hub.requests if r.method == "GET" and "/resolve/" in r.path}
        assert fetched <= {"/other/gpt2/resolve/main/config.json"}    # the second time, it is in the cache already
        assert not hub.served("/lfs/")

