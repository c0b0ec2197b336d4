"""pipeline/hub.py's choices without a network: which spec forms name what, which GGUF a quant tag or the default
picks, what a refusal names; and pipeline/gguf_header.py on GGUFs the gguf package writes (the end-to-end pulls
over HTTP are tests/cli/test_hub_pull.py)."""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.pipeline.errors import BuildError
from ortllm.pipeline.gguf_header import FIRST_READ, gguf_architecture
from ortllm.pipeline.hub import HubError, HubFile, HubSpec, _choose, missing_path_hint, parse_spec


@pytest.mark.parametrize("text, repo, selector, revision, endpoint", [
    ("hf.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Q4_K_M", "main", None),
    ("hf.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:latest", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", None, "main", None),
    ("huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", None, "main", None),
    ("hf://org/repo:model-q8_0.gguf", "org/repo", "model-q8_0.gguf", "main", None),
    ("https://huggingface.co/org/repo/resolve/main/sub%20dir/m.gguf", "org/repo", "sub dir/m.gguf", "main", None),
    ("https://hf.co/org/repo/blob/v1.0/m.gguf?download=true", "org/repo", "m.gguf", "v1.0", None),
    ("http://127.0.0.1:8080/org/repo/resolve/abc/m.gguf", "org/repo", "m.gguf", "abc", "http://127.0.0.1:8080"),
])
def test_spec_forms(text, repo, selector, revision, endpoint):
    assert parse_spec(text) == HubSpec(text, repo, selector, revision, endpoint)


def test_spec_keys():
    a = parse_spec("hf.co/Org/Repo:q4_k_m")
    assert a.key() == parse_spec("hf://org/repo:Q4_K_M").key() == parse_spec("huggingface.co/org/repo:Q4_K_M").key()
    assert a.key() != parse_spec("hf.co/org/repo:Q8_0").key() != parse_spec("hf.co/org/repo").key()
    assert parse_spec("hf.co/org/repo").key() == parse_spec("hf.co/org/repo:latest").key()


def test_missing_org_repo_path_hints_the_hub():
    assert "name it hf.co/Qwen/Qwen2.5-0.5B-Instruct" in str(missing_path_hint("Qwen/Qwen2.5-0.5B-Instruct"))
    assert missing_path_hint("models/tiny.gguf") is None and missing_path_hint("a/b/c") is None


def test_other_specs():
    assert parse_spec("smollm2-135m-instruct") is None and parse_spec("models/x.gguf") is None
    assert parse_spec("https://example.com/files/x.GGUF").url == "https://example.com/files/x.GGUF"
    with pytest.raises(HubError, match="names no repository: give hf.co/ORG/REPO"):
        parse_spec("hf.co/Qwen")
    with pytest.raises(HubError, match="neither a GGUF file's URL nor a hub file's"):
        parse_spec("https://example.com/model.bin")


def _files(*names: str) -> dict[str, HubFile]:
    return {n: HubFile(n, 1) for n in names}


GGUF_REPO = _files("README.md", "m-Q2_K.gguf", "m-Q8_0.gguf", "m-Q4_K_S.gguf", "m-Q4_K_M.gguf", "m-f16.gguf",
                   "mmproj-m-f16.gguf")


@pytest.mark.parametrize("selector, picked", [
    (None, "m-Q4_K_M.gguf"),                 # Ollama's default
    ("q8_0", "m-Q8_0.gguf"),                 # case-insensitive
    ("Q4_K", "m-Q4_K_M.gguf"),               # a tag that several names contain: the default order among them
    ("F16", "m-f16.gguf"),                   # never the vision projector
    ("m-Q2_K.gguf", "m-Q2_K.gguf"),          # a file by name
])
def test_gguf_choice(selector, picked):
    kind, files = _choose(HubSpec("x", "o/r", selector), GGUF_REPO)
    assert kind == "gguf" and [f.path for f in files] == [picked]


def test_default_order_without_q4_k_m():
    _, files = _choose(HubSpec("x", "o/r"), _files("m-Q8_0.gguf", "m-Q5_K_M.gguf", "m-f16.gguf"))
    assert files[0].path == "m-Q5_K_M.gguf"


def test_safetensors_repo_takes_what_the_build_reads():
    repo = _files("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md",
                  "generation_config.json", "onnx/model.onnx", "pytorch_model.bin", "m-Q4_K_M.gguf")
    kind, files = _choose(HubSpec("x", "o/r"), repo)
    assert kind == "hf"
    assert [f.path for f in files] == ["config.json", "generation_config.json", "tokenizer.json",
                                       "tokenizer_config.json", "model.safetensors"]
    assert _choose(HubSpec("x", "o/r", "Q4_K_M"), repo)[0] == "gguf"      # a tag picks the GGUF of a mixed repo


def test_refusals_name_what_exists():
    with pytest.raises(HubError, match="matches the quant tag 'IQ3_XS'; its GGUF files: m-Q2_K.gguf, m-Q4_K_M.gguf"):
        _choose(HubSpec("x", "o/r", "IQ3_XS"), GGUF_REPO)
    with pytest.raises(HubError, match="o/r has no file 'm-Q3_K.gguf'; its GGUF files: "):
        _choose(HubSpec("x", "o/r", "m-Q3_K.gguf"), GGUF_REPO)
    with pytest.raises(HubError, match="one of 3 parts of a split GGUF"):
        _choose(HubSpec("x", "o/r", "Q8_0"), _files("m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00002-of-00003.gguf"))
    with pytest.raises(HubError, match="it has pytorch_model.bin: convert them to safetensors"):
        _choose(HubSpec("x", "o/r"), _files("config.json", "pytorch_model.bin"))


def _write(path, arch: str, tokens: int = 0) -> bytes:
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    if tokens:
        w.add_token_list([f"t{i}" for i in range(tokens)])
    w.add_tensor("token_embd.weight", np.ones((64, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_gguf_architecture_from_the_first_bytes(tmp_path):
    data = _write(tmp_path / "a.gguf", "qwen3", tokens=5000)
    reads = []

    def read(n: int) -> bytes:
        reads.append(n)
        return data[:n]
    assert gguf_architecture(read, "a.gguf") == "qwen3" and reads == [FIRST_READ]


def test_gguf_header_errors(tmp_path):
    data = _write(tmp_path / "a.gguf", "llama")
    with pytest.raises(BuildError, match="is not a GGUF file"):
        gguf_architecture(lambda n: b"PK\x03\x04" + bytes(n), "x.zip")
    with pytest.raises(BuildError, match="ends inside its GGUF header"):
        gguf_architecture(lambda n: data[:30], "cut.gguf")
