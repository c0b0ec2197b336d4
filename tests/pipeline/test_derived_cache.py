"""Files a build derives from its inputs alone, kept for the next build of the same inputs (pipeline/derived_cache.py):
a GGUF's converted tokenizer and the tokenizer graphs checked against it come back byte for byte with the same
value, a damaged entry is made again, and ORTLLM_DERIVED_CACHE=0 writes nothing."""
from __future__ import annotations

import json

from ortllm.pipeline.derived_cache import cached
from ortllm.pipeline.gguf_reader import open_gguf
from ortllm.pipeline.tokenizer import write_tokenizer_from_gguf_cached
from ortllm.pipeline.tokenizer_graphs import write_tokenizer_graphs_cached
from ortllm.runtime.artifact import sha256_file


def _bytes(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_a_gguf_tokenizer_and_its_graphs_come_back_the_same(smollm2_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLLM_HOME", str(tmp_path / "home"))
    reader, digest = open_gguf(smollm2_gguf), sha256_file(smollm2_gguf)
    said = []
    runs = {}
    for run in ("first", "second"):
        out = tmp_path / run
        out.mkdir()
        info = write_tokenizer_from_gguf_cached(reader, digest, out, log=said.append)
        graphs = write_tokenizer_graphs_cached(out, info.files, log=said.append)
        runs[run] = info, graphs, _bytes(out)
    assert runs["first"] == runs["second"]
    info, graphs, files = runs["second"]
    assert graphs == {"tokenizer.onnx": "written", "detokenizer.onnx": "written"} and "tokenizer.onnx" in files
    assert info.vocab_size == 49152 and "tokenizer.json" in files
    assert len(said) == 2 and all("earlier build of the same inputs" in m for m in said)   # the second run only


def test_a_damaged_entry_is_made_again_and_the_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTLLM_HOME", str(tmp_path / "home"))
    made = []

    def make(d):
        made.append(d)
        (d / "f.txt").write_text("derived")
        return {"n": len(made)}, ["f.txt"]

    for i in range(2):
        (tmp_path / f"o{i}").mkdir()
        assert cached("t", ["k"], tmp_path / f"o{i}", make) == {"n": 1}
    entry = next((tmp_path / "home" / "derived" / "t").iterdir())
    assert json.loads((entry / "entry.json").read_text())["value"] == {"n": 1}
    (entry / "f.txt").write_text("damaged")
    (tmp_path / "o2").mkdir()
    assert cached("t", ["k"], tmp_path / "o2", make) == {"n": 2}          # its sha256 differs: made again
    assert (tmp_path / "o2" / "f.txt").read_text() == "derived" == (entry / "f.txt").read_text()
    monkeypatch.setenv("ORTLLM_DERIVED_CACHE", "0")
    (tmp_path / "o3").mkdir()
    assert cached("t", ["other"], tmp_path / "o3", make) == {"n": 3}
    assert len(list((tmp_path / "home" / "derived" / "t").iterdir())) == 1
