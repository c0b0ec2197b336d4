"""What the embeddings' graph output costs generation: decode tok/s at B = 1 of one engine artifact as built (with
the hidden_states nodes: a Gather and the final norm, on no rows in a generation step) against a copy of it
with those nodes, their input and output stripped (its runner told not to bind them). One process, the two
engines alternating request by request, so both see the same machine load; half the rounds with one engine loaded
first, half with the other (the load order alone moved the rates by ~10% on a busy host). docs/service.md
records the figures.

    .venv/bin/python bench/probes/embed_decode_ab.py ARTIFACT [--rounds 10] [--new-tokens 128]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path


def strip_copy(src: Path, dst: Path) -> None:
    """dst: src with the /model/hidden_* nodes, hidden_indices and hidden_states removed (manifest updated)."""
    import onnx

    from ortllm.runtime import contract as C

    shutil.copytree(src, dst)
    path = dst / C.MODEL
    m = onnx.load(str(path), load_external_data=False)       # weights stay in model.onnx.data, untouched
    g = m.graph
    keep = [n for n in g.node if not n.name.startswith("/model/hidden_")]
    del g.node[:]
    g.node.extend(keep)
    for coll, name in ((g.input, C.HIDDEN_INDICES), (g.output, C.HIDDEN_STATES)):
        del coll[[x.name for x in coll].index(name)]
    for x in [x for x in g.initializer if x.name.startswith("/model/hidden_")]:
        g.initializer.remove(x)
    onnx.save(m, str(path))
    manifest = json.loads((dst / C.MANIFEST).read_text())
    data = path.read_bytes()
    manifest["files"][C.MODEL] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (dst / C.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--new-tokens", type=int, default=128)
    a = p.parse_args(argv)

    import numpy as np

    from ortllm.runtime import contract as C
    from ortllm.runtime import engine as engine_module
    from ortllm.runtime.engine import Engine
    from ortllm.runtime.model_runner import ModelRunner
    from ortllm.runtime.sampling_params import SamplingParams

    class WithoutHidden(ModelRunner):
        def _bind_step_input(self, name, value, shape):
            if name != C.HIDDEN_INDICES:
                super()._bind_step_input(name, value, shape)

        def _bind_hidden(self, rows):
            self.hidden = self._hidden[:0]

    def load(path: Path, runner) -> Engine:
        engine_module.ModelRunner = runner
        try:
            return Engine.from_artifact(path, max_num_seqs=1, spec_max_tokens=0)
        finally:
            engine_module.ModelRunner = ModelRunner

    rates: dict[str, list[float]] = {"without": [], "with": []}
    params = SamplingParams(max_tokens=a.new_tokens, temperature=0.0, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        stripped = Path(tmp) / "stripped"
        strip_copy(a.artifact, stripped)
        paths = {"without": (stripped, WithoutHidden), "with": (a.artifact, ModelRunner)}
        for first in ("without", "with"):
            engines = {}
            try:
                for name in (first, "with" if first == "without" else "without"):
                    engines[name] = load(*paths[name])
                prompt = np.random.default_rng(0).integers(100, engines["with"].vocab_size, 64).tolist()
                for r in range(a.rounds // 2):
                    for name in (("without", "with") if r % 2 == 0 else ("with", "without")):
                        h = engines[name].submit(prompt, params)
                        h.result()
                        t = h.token_times
                        rates[name].append((len(t) - 1) / (t[-1] - t[0]))
            finally:
                for e in engines.values():
                    e.close()
    for name, v in rates.items():
        print(f"{name} hidden_states: median {statistics.median(v):.1f} tok/s (min {min(v):.1f}, max {max(v):.1f})")
    print(f"ratio with / without: {statistics.median(rates['with']) / statistics.median(rates['without']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
