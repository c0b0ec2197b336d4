"""LoRA adapters end to end: PEFT parity, isolation in mixed batches, slot churn, damaged files."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from ortllm.runtime.adapter_files import add_adapter, list_adapters, remove_adapter
from ortllm.runtime.errors import AdapterFileError
from ortllm.runtime.engine import Engine
from ortllm.runtime.errors import UnknownAdapter
from ortllm.runtime.sampling_params import SamplingParams
from tests.artifact_copies import linked_copy
from tests.reference.peft_lora import make_peft_lora as _peft

TARGET_SETS = [["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"],
               ["q_proj", "v_proj", "down_proj"], ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                    "down_proj"]]


def _greedy(n=12, adapter=None):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, adapter=adapter)


@pytest.fixture(scope="module")
def with_adapters(tiny_engine, tiny_weights, tmp_path_factory, adapted):
    """The tiny engine artifact (its files hard-linked) with 5 adapters (ranks 4..32), their PEFT models, and the
    folder of their PEFT dirs."""
    peft = tmp_path_factory.mktemp("peft")
    models = {}
    for k, (r, targets) in enumerate([(8, TARGET_SETS[0]), (16, TARGET_SETS[1]), (4, TARGET_SETS[2]),
                                      (32, TARGET_SETS[3]), (8, TARGET_SETS[3])]):
        models[f"ad{k}"] = _peft(tiny_weights, peft / f"ad{k}", seed=k, r=r, targets=targets, rslora=(k == 4))
    return adapted(tiny_engine, {name: peft / name for name in models}), models, peft


def _prompts():
    rng = np.random.default_rng(3)
    return [rng.integers(3, 512, n).tolist() for n in (7, 20, 33, 12, 41, 5, 26)]


def test_engine_equals_peft(with_adapters):
    import torch
    art, models, _ = with_adapters
    prompts = _prompts()[:3]
    with Engine.from_artifact(art, num_blocks=128) as engine:
        for name, model in models.items():
            for p in prompts:
                with torch.no_grad():
                    ref = model.generate(torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                         pad_token_id=0)[0, len(p):].tolist()
                got = engine.generate([p], _greedy(adapter=name))[0].token_ids
                assert got == ref, f"adapter {name} differs from PEFT + transformers"


def test_slot_ranks_are_zero_on_targets_an_adapter_leaves_alone(with_adapters):
    """MultiLoRA skips a slot where its rank is 0: an adapter on q,k,v,o must not cost gate/up/down anything."""
    from ortllm.runtime import contract as C
    art, _, _ = with_adapters
    with Engine.from_artifact(art, num_blocks=128) as engine:
        slots, failed = engine.adapters.activate(["ad0"])            # rank 8 on q, k, v, o
        assert not failed
        ranks = {t: int(engine.runner._arrays[C.lora_rank_name(t)][slots["ad0"]]) for t in C.LORA_TARGETS}
    assert ranks == {"q_proj": 8, "k_proj": 8, "v_proj": 8, "o_proj": 8, "gate_proj": 0, "up_proj": 0, "down_proj": 0}


def test_mixed_batch_equals_alone(with_adapters):
    art, models, _ = with_adapters
    names = [None, *models]
    jobs = [(p, names[i % len(names)]) for i, p in enumerate(_prompts() * 2)]   # 14 requests, 5 adapters + base
    with Engine.from_artifact(art, num_blocks=128, max_adapters_per_batch=4) as engine:
        alone = [engine.generate([p], _greedy(adapter=a))[0].token_ids for p, a in jobs]
        mixed = engine.generate([p for p, _ in jobs], [_greedy(adapter=a) for _, a in jobs])
    assert [m.token_ids for m in mixed] == alone
    assert len({tuple(t) for t in alone}) > len(_prompts()), "adapters should change the outputs"


@pytest.fixture(scope="module")
def adapted_int4(tiny_int4, tiny_weights, tmp_path_factory, adapted):
    """The tiny model as an int4 engine artifact (its projections are QLinear: int8 LoRA stacks, contract 7) with
    adapters of ranks 8, 5 (odd) and 32 on every target."""
    peft = tmp_path_factory.mktemp("peft-int4")
    for k, r in enumerate((8, 5, 32)):
        _peft(tiny_weights, peft / f"q{k}", seed=30 + k, r=r, targets=TARGET_SETS[3])
    return adapted(tiny_int4, {f"q{k}": peft / f"q{k}" for k in range(3)})


def test_int8_stacks_hold_each_adapter_within_half_a_step(adapted_int4):
    """QLinear's slots hold the adapter's A and B as int8 codes with float16 scales (runtime/lora_stacks.py, layouts
    decoded by the NumPy reference) at [layer, slot] of each target's stack of every layer: every weight within half
    its scale, ranks per target, zeros elsewhere."""
    from safetensors.numpy import load_file

    from ortllm.runtime import contract as C
    from tests.reference.qlinear import LORA_CHUNK, lora_a, lora_b
    with Engine.from_artifact(adapted_int4, num_blocks=64) as engine:
        slots, failed = engine.adapters.activate(["q1", "q2"])
        assert not failed
        arrays = engine.runner._arrays
        for name in ("q1", "q2"):
            tensors = load_file(str(adapted_int4 / "adapters" / f"{name}.safetensors"))
            s = slots[name]
            for i in range(2):
                for target in C.LORA_TARGETS:
                    a, b = tensors[f"layers.{i}.{target}.a"], tensors[f"layers.{i}.{target}.b"]
                    (k, r), n = a.shape, b.shape[1]
                    arr = {w: arrays[C.lora_stack_name(target, w)][i, s] for w in ("a", "a_scale", "b", "b_scale")}
                    assert arr["a"].dtype == np.int8 and int(arrays[C.lora_rank_name(target)][s]) == r
                    qa, sa = lora_a(arr["a"], arr["a_scale"], k, r, r)
                    step_a = np.repeat(sa, LORA_CHUNK, axis=0)[:k]
                    assert (np.abs(qa * step_a - a) <= step_a / 2 * 1.001 + 1e-12).all(), (name, i, target, "a")
                    step_b = arr["b_scale"].astype(np.float64)
                    assert (np.abs(lora_b(arr["b"], r, n) * step_b - b) <= step_b / 2 * 1.001 + 1e-12).all()
                    assert not arr["a"].reshape(-1)[k * r:].any() and not arr["b"][-(-r // 4) * 4:].any()


def test_int8_stacks_mixed_batch_equals_alone(adapted_int4):
    """On the QLinear artifact, each adapter's greedy tokens in a mixed batch (with base rows) equal its tokens
    alone, and the adapters change them."""
    names = [None, "q0", "q1", "q2"]
    jobs = [(p, names[i % len(names)]) for i, p in enumerate(_prompts() * 2)]
    with Engine.from_artifact(adapted_int4, num_blocks=128, max_adapters_per_batch=3) as engine:
        alone = [engine.generate([p], _greedy(adapter=a))[0].token_ids for p, a in jobs]
        mixed = engine.generate([p for p, _ in jobs], [_greedy(adapter=a) for _, a in jobs])
    assert [m.token_ids for m in mixed] == alone
    assert len({tuple(t) for t in alone}) > len(_prompts()), "adapters should change the outputs"


def test_churn_through_two_slots_with_bad_requests(with_adapters, tmp_path):
    """10 adapters through 2 slots, 3 requests each; meanwhile 25 requests for unknown adapters and 5 for an
    adapter whose file was damaged after load are refused with typed errors, and the good ones all succeed."""
    art, models, base = with_adapters
    churn = linked_copy(art, tmp_path / "churn")
    for name in models:                      # 5 more adapters: the same weights under other names
        add_adapter(churn, base / name, name + "-copy")
    add_adapter(churn, base / "ad1", "doomed")
    names = [*models, *(n + "-copy" for n in models)]
    p = _prompts()[1]
    with Engine.from_artifact(churn, num_blocks=128) as engine:
        expected = {a: engine.generate([p], _greedy(adapter=a))[0].token_ids for a in models}
    with Engine.from_artifact(churn, num_blocks=128, max_slots=2, max_adapters_per_batch=2) as engine:
        doomed = churn / "adapters" / "doomed.safetensors"
        raw = bytearray(doomed.read_bytes())
        raw[-10] ^= 0xFF
        doomed.write_bytes(bytes(raw))       # after the engine verified the artifact
        handles, unknown = [], 0
        for round_ in range(3):
            handles += [(a, engine.submit(p, _greedy(adapter=a))) for a in names]
            for k in range(9 if round_ < 2 else 7):
                with pytest.raises(UnknownAdapter):
                    engine.submit(p, _greedy(adapter=f"missing-{round_}-{k}"))
                unknown += 1
        bad = [engine.submit(p, _greedy(adapter="doomed")) for _ in range(5)]
        for a, h in handles:
            assert h.result(120).token_ids == expected[a.removesuffix("-copy")], a
        for h in bad:
            out = h.result(120)
            assert out.finish_reason == "error" and "sha256" in out.error
        assert unknown == 25 and len(handles) == 30
        assert engine.generate([p], _greedy(adapter="ad3"))[0].token_ids == expected["ad3"]
        stats = engine.stats()
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_bad_peft_dirs_are_refused(with_adapters, tiny_weights, tmp_path):
    import json
    art, _, _ = with_adapters
    good = tmp_path / "good"
    _peft(tiny_weights, good, seed=9, r=4, targets=["q_proj"])
    cases = {
        "use_dora": (True, "DoRA"),
        "bias": ("all", "bias"),
        "modules_to_save": (["lm_head"], "modules_to_save"),
        "r": (128, "ranks 1..64"),
    }
    for field, (value, needle) in cases.items():
        bad = tmp_path / field
        shutil.copytree(good, bad)
        cfg = json.loads((bad / "adapter_config.json").read_text())
        cfg[field] = value
        (bad / "adapter_config.json").write_text(json.dumps(cfg))
        with pytest.raises(AdapterFileError, match=needle):
            add_adapter(art, bad, "bad")
    from safetensors.numpy import load_file, save_file
    huge = tmp_path / "huge"                 # a value float16 (the session's slot stacks) cannot hold
    shutil.copytree(good, huge)
    tensors = load_file(str(huge / "adapter_model.safetensors"))
    key = next(k for k in tensors if "lora_B" in k)
    tensors[key][0, 0] = 1e5
    save_file(tensors, str(huge / "adapter_model.safetensors"))
    with pytest.raises(AdapterFileError, match=r"lora_B has max \|value\| 100000, outside float16"):
        add_adapter(art, huge, "bad")
    with pytest.raises(AdapterFileError, match="adapter_config.json"):
        add_adapter(art, tmp_path, "bad")
    with pytest.raises(AdapterFileError, match="name"):
        add_adapter(art, good, "../escape")
    assert "bad" not in list_adapters(art)


def test_add_and_remove_round_trip(tiny_engine, tiny_weights, tmp_path):
    from ortllm.runtime.artifact import load_artifact
    art = tmp_path / "art"
    linked_copy(tiny_engine, art)
    _peft(tiny_weights, tmp_path / "p", seed=1, r=8, targets=["v_proj"])
    add_adapter(art, tmp_path / "p", "x")
    load_artifact(art)                                   # manifest covers the adapter file
    with pytest.raises(AdapterFileError, match="already has"):
        add_adapter(art, tmp_path / "p", "x")
    remove_adapter(art, "x")
    assert not (art / "adapters" / "x.safetensors").exists()
    load_artifact(art)
    with pytest.raises(AdapterFileError, match="no adapter named"):
        remove_adapter(art, "x")


def test_generate_cli_with_adapter(with_adapters):
    from tests.cli_run import ortllm
    art, _, _ = with_adapters
    run = lambda *a: ortllm("generate", art, "--prompt", "abc", "--max-tokens", "8", *a)  # noqa: E731
    base, tuned, bad = run(), run("--adapter", "ad1"), run("--adapter", "nope")
    assert base.returncode == 0 and tuned.returncode == 0, (base.stderr, tuned.stderr)
    with Engine.from_artifact(art, num_blocks=64) as engine:
        want = engine.generate(["abc"], SamplingParams(max_tokens=8, temperature=0.0, adapter="ad1"))[0].text
    assert tuned.stdout == want + "\n" and tuned.stdout != base.stdout
    assert bad.returncode == 1 and "unknown adapter 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def _long_prompt():
    """~60 tokens: three full KV blocks of 16 that the prefix cache keeps after the request ends."""
    return np.random.default_rng(11).integers(3, 512, 60).tolist()


def test_readded_adapter_name_never_reuses_kv_of_the_old_weights(tiny_engine, tiny_weights, tmp_path):
    """Regression (issue 22): the prefix cache keyed KV blocks by the adapter's *name*. Retire `x`, remove it,
    add other weights under the name `x`: the same prompt hit the blocks computed with the old weights, and
    the text differed from a fresh engine's with the new `x`. Blocks are now keyed by the adapter's sha256."""
    art = tmp_path / "art"
    linked_copy(tiny_engine, art)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    _peft(tiny_weights, tmp_path / "old", seed=21, r=8, targets=targets)
    _peft(tiny_weights, tmp_path / "new", seed=22, r=8, targets=targets)
    prompt = _long_prompt()
    add_adapter(art, tmp_path / "old", "x")
    with Engine.from_artifact(art, num_blocks=64) as engine:
        old = engine.generate([prompt], _greedy(12, "x"))[0].token_ids
        engine.retire_adapter("x")
        engine.adapters.sweep(set())                      # what the idle engine thread does
        remove_adapter(art, "x")
        engine.add_adapter("x", add_adapter(art, tmp_path / "new", "x"))
        got = engine.generate([prompt], _greedy(12, "x"))[0].token_ids
        hit_rate = engine.stats()["prefix_cache_hit_rate"]
    with Engine.from_artifact(art, num_blocks=64) as fresh:
        want = fresh.generate([prompt], _greedy(12, "x"))[0].token_ids
    assert want != old, "the two adapters must give different text for this test to mean anything"
    assert got == want
    assert hit_rate == 0.0                                # nothing computed with the old x was taken


def test_readding_a_retiring_adapter_survives_the_sweep(tiny_engine, tiny_weights, tmp_path):
    """Regression (issue 22): AdapterRegistry.add did not clear the retiring state, so re-adding a name that
    was still retiring was undone by the next sweep (the new adapter vanished: unknown adapter)."""
    art = tmp_path / "art"
    linked_copy(tiny_engine, art)
    _peft(tiny_weights, tmp_path / "p", seed=5, r=8, targets=["v_proj"])
    add_adapter(art, tmp_path / "p", "x")
    with Engine.from_artifact(art, num_blocks=64) as engine:
        # On the registry itself: the idle engine thread waits on its condition and nobody notifies it, so
        # the only sweep is ours, after the re-add (as when a request in flight still held the old x).
        engine.adapters.retire("x")
        with pytest.raises(UnknownAdapter):
            engine.submit([5, 6, 7], _greedy(4, "x"))
        engine.adapters.add("x", add_adapter(art, tmp_path / "p", "x", force=True))
        engine.adapters.sweep(set())
        assert engine.adapters.names() == ["x"]
        assert len(engine.generate([[5, 6, 7]], _greedy(4, "x"))[0].token_ids) == 4
