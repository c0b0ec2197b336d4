"""The in-build check's reference logits are computed once per reference in a process (calibration/quality.py,
_REFERENCE_MEMO): a second build of the same weights reuses them and writes the very figures a fresh run does."""
from __future__ import annotations

import json

from ortllm.calibration import quality
from ortllm.cli.build import build_artifact
from ortllm.pipeline.build import BuildOptions


def _fidelity(out) -> dict:
    return json.loads((out / "quality.json").read_text())["fidelity"]


def test_a_second_build_reuses_the_reference_and_gives_the_same_figures(tmp_path):
    quality._REFERENCE_MEMO.update(key=None, logits={})
    build_artifact("llama-tiny-random", tmp_path / "int8", BuildOptions(quant="int8", quality_tokens=256),
                   log=lambda m: None)
    key, store = quality._REFERENCE_MEMO["key"], quality._REFERENCE_MEMO["logits"]
    assert key is not None and len(store) >= 1
    computed = {k: [a.copy() for a in v] for k, v in store.items()}

    build_artifact("llama-tiny-random", tmp_path / "int4", BuildOptions(quant="int4", quality_tokens=256),
                   log=lambda m: None)
    assert quality._REFERENCE_MEMO["key"] == key and quality._REFERENCE_MEMO["logits"] is store   # a hit
    assert store.keys() == computed.keys() and all(
        all((a == b).all() for a, b in zip(store[k], computed[k])) for k in computed)

    quality._REFERENCE_MEMO.update(key=None, logits={})          # the same build with the reference computed anew
    build_artifact("llama-tiny-random", tmp_path / "int4-fresh", BuildOptions(quant="int4", quality_tokens=256),
                   log=lambda m: None)
    assert quality._REFERENCE_MEMO["key"] == key
    assert _fidelity(tmp_path / "int4") == _fidelity(tmp_path / "int4-fresh")
    assert _fidelity(tmp_path / "int4")["tokens"] >= 255
