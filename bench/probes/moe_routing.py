"""How many distinct experts an MoE artifact's decode step touches, and the bytes such a step reads.

    .venv/bin/python bench/probes/moe_routing.py ARTIFACT [--batches 1,4,16] [--prompt 64] [--steps 32]

The bench's decode (B sequences of random prompt tokens, greedy, ignore_eos) on a copy of the artifact whose graph
also outputs each MoE layer's router top-k ids (the TopK nodes' second output, [rows, k]): the copy's directory
(beside the artifact) hard-links every file but model.onnx, rewritten with those outputs, and its manifest names the
new file's sha256. Each decode step (rows = B) and layer gives its distinct ids; printed per B: their mean (min-max)
over steps and layers, the count uniform routing would give (E (1 - (1 - k/E)^B)), and the bytes a step reads at
that mean (the routed experts' codes, scales and offsets, plus everything else the step reads once: attention,
norms, routers, the LM head), from the initializers' own sizes. Dev tooling.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


def _routing_copy(model, artifact: Path, out: Path) -> list[str]:
    """`out`: the artifact with each MoE layer's router top-k ids as graph outputs (added to `model`, its graph
    loaded without the external data); those outputs, in layer order."""
    import onnx

    from ortllm.runtime.artifact import file_entry

    top_ids = {n.output[1] for n in model.graph.node if n.op_type == "TopK"}
    ids = [i for n in model.graph.node if n.op_type == "MoE" for i in n.input if i in top_ids]
    for name in ids:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None))
    out.mkdir(parents=True, exist_ok=True)
    for f in artifact.iterdir():
        if f.name not in ("model.onnx", "manifest.json"):
            os.link(f, out / f.name)      # hard links: ORT refuses external data outside the model's dir
    onnx.save(model, str(out / "model.onnx"))
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["files"]["model.onnx"] = file_entry(out / "model.onnx")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return ids


def _bytes(model, experts: int) -> tuple[int, int]:
    """(one expert's gate|up and down codes, scales and offsets summed over the layers, every other initializer a
    step reads whole: not the tables a Gather reads rows of, the embedding) in bytes, from the graph's initializers
    (external data lengths)."""
    size = {}
    for init in model.graph.initializer:
        length = {e.key: e.value for e in init.external_data}.get("length")
        size[init.name] = int(length) if length is not None else len(init.raw_data)
    stacked = {i for n in model.graph.node if n.op_type == "MoE" for i in n.input
               if i.rsplit("/", 1)[-1].startswith("experts.") and ".q" in i}
    gathered = {i for n in model.graph.node if n.op_type.startswith("Gather") for i in n.input}
    other = sum(v for n, v in size.items() if n not in stacked and n not in gathered)
    return sum(size[i] for i in stacked) // experts, other


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--steps", type=int, default=32, help="decode steps a batch")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    import numpy as np
    import onnx

    from ortllm.runtime import Engine, SamplingParams
    from ortllm.runtime.model_runner import ModelRunner

    model = json.loads((a.artifact / "manifest.json").read_text())["model"]
    n_experts, k = model["num_experts"], model["num_experts_per_tok"]
    graph = onnx.load(str(a.artifact / "model.onnx"), load_external_data=False)
    expert_bytes, other_bytes = _bytes(graph, n_experts)
    with tempfile.TemporaryDirectory(dir=a.artifact.parent) as tmp:     # beside it: hard links
        ids = _routing_copy(graph, a.artifact, Path(tmp) / "art")
        seen: list[np.ndarray] = []                 # each run's [layers, rows, k] ids
        run = ModelRunner._run

        def _run(self):
            for name in ids:            # bound again each run: ORT allocates them for this run's rows
                self.io.bind_output(name, "cpu")
            run(self)
            outs = [o.numpy() for o in self.io.get_outputs()]
            got = [o for o in outs if o.dtype == np.int64 and o.ndim == 2 and o.shape[1] == k]
            seen.append(np.stack(got[-len(ids):]))
        ModelRunner._run = _run
        try:
            rng = np.random.default_rng(0)
            for b in (int(x) for x in a.batches.split(",")):
                with Engine.from_artifact(Path(tmp) / "art", max_num_seqs=b, threads=a.threads,
                                          spec_max_tokens=0) as engine:
                    prompts = [rng.integers(100, engine.vocab_size, a.prompt).tolist() for _ in range(b)]
                    seen.clear()
                    engine.generate(prompts, SamplingParams(max_tokens=a.steps + 1, temperature=0.0,
                                                            ignore_eos=True))
                steps = [s for s in seen if s.shape[1] == b][1:]        # decode steps (rows = B), the first dropped
                distinct = np.array([[len(np.unique(layer)) for layer in s] for s in steps])
                uniform = n_experts * (1 - (1 - k / n_experts) ** b)
                mean = float(distinct.mean())
                read = mean * expert_bytes + other_bytes       # expert_bytes: one expert of every layer
                print(f"B={b}: {len(steps)} steps x {len(ids)} layers, distinct experts a layer {mean:.1f} "
                      f"({distinct.min()}-{distinct.max()}; uniform routing {uniform:.1f}, of {n_experts}, top {k}); "
                      f"a step reads ~{read / 1e9:.3f} GB (experts {mean * expert_bytes / 1e9:.3f}, "
                      f"the rest {other_bytes / 1e9:.3f})")
        finally:
            ModelRunner._run = run
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
