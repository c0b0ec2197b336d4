"""Adapter mixes end to end (SamplingParams(adapters={...})): PEFT's add_weighted_adapter(combination_type="cat") on
the fp32 artifact (greedy tokens equal, logits within fp32 tolerance), the int4 artifact's QLinear against its own
single-adapter outputs combined in NumPy, batch invariance (bitwise), the one-adapter forms bit for bit, the prefix
cache's key, and the refusals."""
from __future__ import annotations

import numpy as np
import pytest

from ortllm.runtime.engine import Engine
from ortllm.runtime.errors import InvalidSamplingParams, UnknownAdapter
from ortllm.runtime.sampling_params import SamplingParams, adapter_cache_key
from ortllm.runtime.scheduler import ScheduledSeq
from tests.reference.peft_lora import make_peft_lora

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
# (name, rank, targets): different ranks and targets, so a mix's terms cover different projections
ADAPTERS = [("a0", 8, ATTN), ("a1", 16, MLP), ("a2", 4, ["q_proj", "v_proj", "down_proj"]), ("a3", 32, ATTN + MLP)]
MIXES = [{"a0": 0.7, "a1": 0.3}, {"a0": 1.0, "a2": -0.5, "a3": 0.6}, {"a3": 0.4}, {"a1": 1.5, "a2": 0.8, "a3": -1.0,
                                                                                  "a0": 0.25}]


def _greedy(n=12, **adapter):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **adapter)


def _prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(3, 512, n).tolist() for n in (9, 23, 35)]


def _with_adapters(art, tiny_weights, tmp_path_factory, adapted, seed0: int):
    """(`art` hard-linked with ADAPTERS and a DoRA adapter added, the folder of their PEFT dirs)."""
    base = tmp_path_factory.mktemp("mix")
    for k, (name, r, targets) in enumerate(ADAPTERS):
        make_peft_lora(tiny_weights, base / name, seed=seed0 + k, r=r, targets=targets)
    make_peft_lora(tiny_weights, base / "dora", seed=seed0 + 9, r=8, targets=ATTN, dora=True)
    return adapted(art, {name: base / name for name in [*(a[0] for a in ADAPTERS), "dora"]}), base


@pytest.fixture(scope="module")
def mixed_fp32(tiny_engine, tiny_weights, tmp_path_factory, adapted):
    """The tiny fp32 engine artifact with four LoRA adapters and a DoRA one, and one PeftModel holding the four."""
    from peft import PeftModel

    from ortllm.pipeline.hf_model import hf_model_from_weights
    art, base = _with_adapters(tiny_engine, tiny_weights, tmp_path_factory, adapted, 40)
    peft = PeftModel.from_pretrained(hf_model_from_weights(tiny_weights), base / "a0", adapter_name="a0")
    for name, _, _ in ADAPTERS[1:]:
        peft.load_adapter(base / name, adapter_name=name)
    return art, peft.eval()


def _peft_mix(peft, mix: dict[str, float]) -> str:
    name = "mix_" + "_".join(f"{k}{v:g}" for k, v in sorted(mix.items())).replace(".", "p").replace("-", "m")
    if name not in peft.peft_config:
        peft.add_weighted_adapter(list(mix), list(mix.values()), name, combination_type="cat")
    peft.set_adapter(name)
    return name


def _logits(engine, prompt, spec) -> np.ndarray:
    """[len(prompt), V] every prompt row's logits with the AdapterSpec `spec`, in blocks 1.. of the pool."""
    names = [spec] if isinstance(spec, str) else [n for n, _ in spec or ()]
    slots, failed = engine.adapters.activate(names)
    assert not failed
    blocks = list(range(1, 1 + -(-len(prompt) // engine.runner.block_size)))
    return engine.runner.execute([ScheduledSeq("m", list(prompt), 0, blocks, True, spec)], slots,
                                 all_logits=True).copy()


def test_mixes_equal_peft_weighted_adapters(mixed_fp32):
    """Greedy tokens equal PEFT's cat-combined adapter (sum_i w_i * scale_i * B_i A_i, exactly the mix), and every
    prompt row's logits are within the fp32 artifact's tolerance (its slots hold A and B in float16)."""
    import torch
    art, peft = mixed_fp32
    with Engine.from_artifact(art, num_blocks=128) as engine:
        for mix in MIXES:
            _peft_mix(peft, mix)
            for p in _prompts():
                with torch.no_grad():
                    ref = peft.generate(input_ids=torch.tensor([p]), max_new_tokens=12, min_new_tokens=12,
                                        do_sample=False, pad_token_id=0)[0, len(p):].tolist()
                    ref_logits = peft(input_ids=torch.tensor([p])).logits[0].numpy()
                got = engine.generate([p], _greedy(adapters=mix))[0].token_ids
                assert got == ref, f"mix {mix} differs from PEFT's add_weighted_adapter(cat)"
                spec = SamplingParams(adapters=mix).validate().adapter_mix
                logits = _logits(engine, p, spec)
                np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=2e-3 * np.abs(ref_logits).max(),
                                           err_msg=f"mix {mix}")
        base = _logits(engine, _prompts()[0], None)
        assert np.abs(_logits(engine, _prompts()[0], SamplingParams(adapters=MIXES[0]).validate().adapter_mix)
                      - base).max() > 1e-2 * np.abs(base).max(), "the mix must change the logits"


def test_one_adapter_forms_are_the_same_bits(mixed_fp32):
    """adapter="a3", adapters={"a3": 1.0} and the one-term mix spec (("a3", 1.0),) fed through the weights input:
    the same logits, bit for bit."""
    art, _ = mixed_fp32
    p = _prompts()[1]
    with Engine.from_artifact(art, num_blocks=128) as engine:
        assert SamplingParams(adapters={"a3": 1.0}).validate().adapter_mix == "a3"
        plain = _logits(engine, p, "a3")
        np.testing.assert_array_equal(_logits(engine, p, (("a3", 1.0),)), plain)
        got = engine.generate([p, p], [_greedy(adapter="a3"), _greedy(adapters={"a3": 1.0})])
        assert got[0].token_ids == got[1].token_ids


def test_mixed_rows_are_batch_invariant(mixed_fp32):
    """Each mix alone and in one batch with the other mixes, single adapters and the base model: the same bits of
    logits (runner) and the same greedy tokens (engine)."""
    art, _ = mixed_fp32
    specs = [SamplingParams(adapters=m).validate().adapter_mix for m in MIXES] + ["a1", None, "a0"]
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 512, n).tolist() for n in (5, 17, 9, 30, 12, 21, 7)]
    with Engine.from_artifact(art, num_blocks=128, max_adapters_per_batch=4) as engine:
        alone = [_logits(engine, p, s) for p, s in zip(prompts, specs)]
        slots, _ = engine.adapters.activate([a for a, _, _ in ADAPTERS])
        seqs, start = [], 1
        for i, (p, s) in enumerate(zip(prompts, specs)):
            n = -(-len(p) // engine.runner.block_size)
            seqs.append(ScheduledSeq(f"s{i}", p, 0, list(range(start, start + n)), True, s))
            start += n
        together = engine.runner.execute(seqs, slots, all_logits=True)
        row = 0
        for i, p in enumerate(prompts):
            np.testing.assert_array_equal(together[row:row + len(p)], alone[i], err_msg=f"row {i} ({specs[i]})")
            row += len(p)
        params = [_greedy(adapters=m) for m in MIXES] + [_greedy(adapter="a1"), _greedy(), _greedy(adapter="a0")]
        one = [engine.generate([p], q)[0].token_ids for p, q in zip(prompts, params)]
        batch = engine.generate(prompts, params)
    assert [b.token_ids for b in batch] == one


def test_prefix_cache_keys_a_mix_by_content_and_weights(mixed_fp32):
    """KV computed under a mix is reused by the same mix only: another weight, or an adapter alone, misses."""
    assert adapter_cache_key((("a", 0.5), ("b", 0.25)), str.upper) == f"mix:A*{0.5.hex()},B*{0.25.hex()}"
    assert adapter_cache_key("a", str.upper) == "A"
    assert adapter_cache_key((("a", 0.5),), str.upper) != adapter_cache_key((("a", 0.25),), str.upper)
    art, _ = mixed_fp32
    p = np.random.default_rng(9).integers(3, 512, 70).tolist()
    with Engine.from_artifact(art, num_blocks=128, enable_prefix_cache=True) as engine:
        first = engine.generate([p], _greedy(2, adapters={"a0": 0.5, "a1": 0.5}))[0]
        same = engine.generate([p], _greedy(2, adapters={"a1": 0.5, "a0": 0.5}))[0]
        other = engine.generate([p], _greedy(2, adapters={"a0": 0.5, "a1": 0.25}))[0]
        single = engine.generate([p], _greedy(2, adapter="a0"))[0]
    assert first.cached_tokens == 0 and same.cached_tokens > 0
    assert other.cached_tokens == 0 and single.cached_tokens == 0


def test_bad_mixes_are_refused_with_clear_errors(mixed_fp32):
    art, _ = mixed_fp32
    with Engine.from_artifact(art, num_blocks=64, max_adapters_per_batch=2) as engine:
        with pytest.raises(InvalidSamplingParams, match="mixes at most 4 adapters; got 5"):
            engine.submit([5, 6], SamplingParams(adapters={f"x{i}": 0.1 for i in range(5)}))
        with pytest.raises(UnknownAdapter, match="adapters names 'nope', which is not an adapter of this model; "
                                                 "known adapters: a0, a1"):
            engine.submit([5, 6], SamplingParams(adapters={"a0": 0.5, "nope": 0.5}))
        with pytest.raises(InvalidSamplingParams, match="'dora' is a DoRA adapter; DoRA adapters cannot be mixed"):
            engine.submit([5, 6], SamplingParams(adapters={"a0": 0.5, "dora": 0.5}))
        with pytest.raises(InvalidSamplingParams, match="DoRA adapters cannot be mixed or weighted"):
            engine.submit([5, 6], SamplingParams(adapters={"dora": 0.5}))
        for w in (float("nan"), float("inf")):
            with pytest.raises(InvalidSamplingParams, match=r"adapters\['a0'\] must be a finite number"):
                engine.submit([5, 6], SamplingParams(adapters={"a0": w}))
        with pytest.raises(InvalidSamplingParams, match="runs at most 2 in a step"):
            engine.submit([5, 6], SamplingParams(adapters={"a0": 0.5, "a1": 0.5, "a2": 0.5}))
        with pytest.raises(InvalidSamplingParams, match="not both"):
            engine.submit([5, 6], SamplingParams(adapter="a0", adapters={"a1": 0.5}))
        # DoRA alone (adapter= or adapters= at weight 1) still runs
        assert len(engine.generate([[5, 6]], _greedy(2, adapters={"dora": 1.0}))[0].token_ids) == 2


# ---------------------------------------------------------------- int4: QLinear's mix on the artifact's own weights

@pytest.fixture(scope="module")
def mixed_int4(tiny_int4, tiny_weights, tmp_path_factory, adapted):
    return _with_adapters(tiny_int4, tiny_weights, tmp_path_factory, adapted, 60)[0]


def _qlinear_node_session(art, node_name_part: str):
    """One QLinear node of the artifact's graph (its packed weights, attributes, every input it reads) as a
    session of its own: its activations (x, and the residual of a "residual" epilogue) and the engine's bound inputs
    (slot stacks, token_adapter, weights) are fed. Returns (session, activation input names, bound input names)."""
    import onnx
    from onnx import helper

    from ortllm.bench.op_graphs import session
    model = onnx.load(str(art / "model.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "QLinear" and node_name_part in n.name)
    inits = {i.name: i for i in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input}
    acts = [n for n in node.input if n and n not in inits and n not in graph_inputs]   # x [, residual]
    ins = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in acts]
    ins += [graph_inputs[n] for n in dict.fromkeys(node.input) if n in graph_inputs]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in node.output if o]
    g = helper.make_graph([node], "one_qlinear", ins, outs, initializer=[inits[n] for n in node.input if n in inits])
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    onnx.external_data_helper.load_external_data_for_model(m, str(art))
    return session(m.SerializeToString(), threads=2), acts, [i.name for i in ins[len(acts):]], node


@pytest.mark.isa_paths
def test_int4_qlinear_mix_is_the_weighted_sum_of_single_adapter_deltas(mixed_int4):
    """On the int4 artifact's q|k|v and down_proj QLinear nodes (linear in the LoRA term: no SwiGLU), with the
    adapters as the engine wrote them into its slots: y(mix) - y(base) = sum_i w_i (y(adapter i alone) - y(base))
    per output, within float32 steps; the same on the AVX2 path (isa_paths)."""
    with Engine.from_artifact(mixed_int4, num_blocks=64) as engine:
        names = [a for a, _, _ in ADAPTERS]
        slots, failed = engine.adapters.activate(names)
        assert not failed
        arrays = engine.runner._arrays
        rng = np.random.default_rng(3)
        for part in ("layers.0/attn/q_k_v", "layers.1/mlp/down"):
            sess, acts, fed, node = _qlinear_node_session(mixed_int4, part)
            T = 6
            attr = {a.name: a.i for a in node.attribute if a.name in ("K", "N")}
            xs = {n: rng.standard_normal((T, attr["K"] if i == 0 else attr["N"]), np.float32)
                  for i, n in enumerate(acts)}
            const = {n: arrays[n] for n in fed if n in arrays}

            def run(ta, wt, rows=T):
                return np.concatenate([o.reshape(rows, -1) for o in sess.run(None, {
                    **{n: v[:rows] for n, v in xs.items()}, "token_adapter": ta, "token_adapter_weight": wt,
                    **const})], axis=1)

            none = np.full((T, 1), -1, np.int32)
            y0 = run(none, np.ones((T, 1), np.float32)).astype(np.float64)
            mix = {"a0": 0.7, "a2": -0.45, "a3": 1.3}
            ta = np.tile(np.array([[slots[n] for n in mix]], np.int32), (T, 1))
            wt = np.tile(np.array([list(mix.values())], np.float32), (T, 1))
            combined = sum(w * (run(np.full((T, 1), slots[n], np.int32), np.ones((T, 1), np.float32)) - y0)
                           for n, w in mix.items())
            delta = run(ta, wt) - y0
            err = np.sqrt(np.mean(np.square(delta - combined)))
            assert np.sqrt(np.mean(np.square(combined))) > 1e-3, part
            assert err < 1e-4 * np.sqrt(np.mean(np.square(combined))) + 1e-6, (part, err)
            # and a row alone gives the bits it has beside base and single-adapter rows
            mixed_batch = np.concatenate([ta[:2], np.array([[slots["a1"], -1, -1], [-1, -1, -1]], np.int32)])
            wts = np.concatenate([wt[:2], np.array([[1, 0, 0], [0, 0, 0]], np.float32)])
            np.testing.assert_array_equal(run(mixed_batch, wts, 4)[:1], run(ta[:1], wt[:1], 1))


@pytest.mark.isa_paths
def test_int4_mixed_batch_equals_each_alone(mixed_int4):
    rng = np.random.default_rng(8)
    prompts = [rng.integers(3, 512, n).tolist() for n in (6, 19, 27, 11, 4)]
    params = [_greedy(adapters=MIXES[1]), _greedy(adapter="a2"), _greedy(adapters=MIXES[3]), _greedy(),
              _greedy(adapters=MIXES[0])]
    with Engine.from_artifact(mixed_int4, num_blocks=128, max_adapters_per_batch=4) as engine:
        one = [engine.generate([p], q)[0].token_ids for p, q in zip(prompts, params)]
        batch = engine.generate(prompts, params)
    assert [b.token_ids for b in batch] == one
    assert len({tuple(t) for t in one}) == len(one)
