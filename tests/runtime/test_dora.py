"""DoRA adapters (PEFT use_dora=True) end to end: the engine's greedy tokens equal PEFT's merged model, base / LoRA /
DoRA rows in one batch equal each alone (fp32 and int4 artifacts), the scale over the base weights as the artifact
holds them, and the refusals."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.engine import Engine
from ortllm.runtime.errors import AdapterFileError
from ortllm.runtime.sampling_params import SamplingParams
from tests.cli_run import ortllm
from tests.reference.peft_lora import make_peft_lora

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL = ATTN + ["gate_proj", "up_proj", "down_proj"]
# (name, rank, targets, dora): DoRA at ranks 8..64 beside plain LoRA adapters
ADAPTERS = [("d8", 8, ATTN, True), ("d16", 16, ALL, True), ("d64", 64, ["q_proj", "v_proj", "down_proj"], True),
            ("l8", 8, ALL, False)]


def _greedy(n=12, adapter=None):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, adapter=adapter)


def _prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(3, 512, n).tolist() for n in (9, 23, 31, 4, 40, 15)]


def _add_all(tmp_path_factory, adapted, weights, art, seed0=0):
    """(artifact: `art` hard-linked with ADAPTERS added, folder of their PEFT dirs, {name: PEFT model})."""
    base = tmp_path_factory.mktemp("dora")
    models = {name: make_peft_lora(weights, base / name, seed=seed0 + k, r=r, targets=targets, dora=dora)
              for k, (name, r, targets, dora) in enumerate(ADAPTERS)}
    return adapted(art, {name: base / name for name in models}), base, models


@pytest.fixture(scope="module")
def dora_fp32(tiny_engine, tiny_weights, tmp_path_factory, adapted):
    return _add_all(tmp_path_factory, adapted, tiny_weights, tiny_engine)


@pytest.fixture(scope="module")
def dora_int4(tiny_int4, tiny_weights, tmp_path_factory, adapted):
    return _add_all(tmp_path_factory, adapted, tiny_weights, tiny_int4, seed0=40)


def test_engine_equals_peft_merged_model(dora_fp32):
    """Greedy tokens of each DoRA adapter (ranks 8, 16, 64) through the engine equal PEFT's merged model's (and the
    unmerged PeftModel's), on the fp32 artifact: the LoRA parity tests' bar."""
    import copy

    import torch
    art, _, models = dora_fp32
    prompts = _prompts()[:3]
    with Engine.from_artifact(art, num_blocks=128) as engine:
        for name, model in models.items():
            merged = copy.deepcopy(model).merge_and_unload().eval()
            for p in prompts:
                with torch.no_grad():
                    ids = torch.tensor([p])
                    ref = merged.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                          pad_token_id=0)[0, len(p):].tolist()
                    unmerged = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                              pad_token_id=0)[0, len(p):].tolist()
                got = engine.generate([p], _greedy(adapter=name))[0].token_ids
                assert unmerged == ref
                assert got == ref, f"adapter {name} differs from PEFT's merged model"


def test_dora_logprobs_equal_peft_merged_model(dora_fp32, tiny_weights):
    """Beyond tokens: the engine's top-5 logprobs at the next position with a DoRA adapter are within 2e-3 of PEFT's
    merged model's (fp32 artifacts hold A and B in float16 slots: ~4e-4 here), and the magnitude vectors matter:
    PEFT's model with the same A, B as plain LoRA is more than 10x further off."""
    import copy

    import torch
    art, _, models = dora_fp32
    p = _prompts()[4]
    model = models["d16"]
    merged = copy.deepcopy(model).merge_and_unload().eval()
    cfg = copy.deepcopy(model.peft_config["default"])
    cfg.use_dora = False
    with torch.no_grad():
        ref = torch.log_softmax(merged(torch.tensor([p])).logits[0, -1], -1).numpy()
    with Engine.from_artifact(art, num_blocks=128) as engine:
        out = engine.generate([p], SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, adapter="d16"))[0]
    top = out.logprobs[0]
    assert top.top_ids == np.argsort(-ref)[:5].tolist()
    err = np.abs(np.asarray(top.top_logprobs) - ref[top.top_ids]).max()
    assert err < 2e-3, err
    from peft import get_peft_model

    from ortllm.pipeline.hf_model import hf_model_from_weights
    plain = get_peft_model(hf_model_from_weights(tiny_weights), cfg)
    lora = {n: v for n, v in model.state_dict().items() if "lora_A" in n or "lora_B" in n}
    missing = plain.load_state_dict(lora, strict=False)
    assert not missing.unexpected_keys and all("lora_" not in k for k in missing.missing_keys)
    with torch.no_grad():
        lora_ref = torch.log_softmax(plain.eval()(torch.tensor([p])).logits[0, -1], -1).numpy()
    effect = np.abs(lora_ref[top.top_ids] - ref[top.top_ids]).max()
    assert effect > 10 * max(err, 2e-4), (effect, err)


def _mixed_equals_alone(art):
    names = [None, *(a[0] for a in ADAPTERS)]
    jobs = [(p, names[i % len(names)]) for i, p in enumerate(_prompts() * 2)]   # 12 requests: base, 3 DoRA, 1 LoRA
    with Engine.from_artifact(art, num_blocks=128, max_adapters_per_batch=4) as engine:
        alone = [engine.generate([p], _greedy(adapter=a))[0].token_ids for p, a in jobs]
        mixed = engine.generate([p for p, _ in jobs], [_greedy(adapter=a) for _, a in jobs])
    assert [m.token_ids for m in mixed] == alone
    assert len({tuple(t) for t in alone}) > len(_prompts()), "adapters should change the outputs"


def test_mixed_batch_equals_alone_fp32(dora_fp32):
    """Base rows, LoRA rows and DoRA rows of three ranks in one batch (MultiLoRA): each equals its request alone."""
    _mixed_equals_alone(dora_fp32[0])


@pytest.mark.isa_paths
def test_mixed_batch_equals_alone_int4(dora_int4):
    """The same on the int4 artifact (QLinear's DoRA epilogue), bitwise as every QLinear row is."""
    _mixed_equals_alone(dora_int4[0])


def test_scale_is_over_the_artifacts_dequantized_weights(dora_int4):
    """On a quantized artifact g = m / ||W_hat + s B A|| with W_hat the weight QLinear multiplies by: the runtime's
    reader of the packed layout equals the pipeline's unpacker on every projection, and the stored g is the formula's
    value (PEFT's get_weight_norm) to float32 rounding."""
    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file

    from ortllm.pipeline.qlinear_pack import PackedWeight, dequantize_packed
    from ortllm.runtime.adapter_files import target_shapes
    from ortllm.runtime.artifact import read_manifest
    from ortllm.runtime.base_weights import BaseWeights
    art, base, _ = dora_int4
    manifest = read_manifest(art)
    shapes = target_shapes(manifest.model)
    graph = onnx.load(str(art / "model.onnx"), load_external_data=False).graph
    inits = {t.name: t for t in graph.initializer}
    reader = BaseWeights(art, shapes)
    checked = 0
    for node in graph.node:
        if node.op_type != "QLinear" or not any(a.name == "lora_layer" for a in node.attribute):
            continue
        at = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        arr = [numpy_helper.to_array(inits[n], base_dir=str(art)) if n else None for n in list(node.input)[1:4]]
        packed = PackedWeight(at["N"], at["K"], at["bits"], at["block_size"], arr[0], arr[1], arr[2])
        want = dequantize_packed(packed)[:, :at["K"]]
        layer, col = at["lora_layer"], 0
        for pos in (7, 12, 17):
            if pos >= len(node.input) or not node.input[pos]:
                continue
            target = node.input[pos].split(".")[1]
            width = shapes[target][1]
            np.testing.assert_array_equal(reader.weight(layer, target), want[col:col + width])
            col += width
            checked += 1
    assert checked == 2 * 7
    cfg = json.loads((base / "d16" / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    peft = load_file(str(base / "d16" / "adapter_model.safetensors"))
    stored = load_file(str(art / "adapters" / "d16.safetensors"))
    for i in range(2):
        for t in ALL:
            prefix = f"base_model.model.model.layers.{i}.{'self_attn' if t in ATTN else 'mlp'}.{t}"
            a, b = peft[f"{prefix}.lora_A.weight"], peft[f"{prefix}.lora_B.weight"]
            m = next(v for k, v in peft.items() if k.startswith(prefix + ".lora_magnitude_vector"))
            w = reader.weight(i, t).astype(np.float64)
            g = m / np.linalg.norm(w + scale * (b.astype(np.float64) @ a), axis=1)
            np.testing.assert_allclose(stored[f"layers.{i}.{t}.g"], g, rtol=2e-7)


def test_manifest_and_cli_say_dora(dora_fp32, tiny_weights, tmp_path):
    art, _, _ = dora_fp32
    entry = json.loads((art / "manifest.json").read_text())["adapters"]
    assert entry["d8"]["dora"] is True and "dora" not in entry["l8"]
    make_peft_lora(tiny_weights, tmp_path / "p", seed=3, r=32, targets=["v_proj"], dora=True)
    run = ortllm("adapters", "add", art, tmp_path / "p", "--name", "cli-dora")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("added cli-dora: DoRA rank 32")
    listed = ortllm("adapters", "list", art)
    assert "cli-dora\tDoRA rank 32" in listed.stdout and "l8\tLoRA rank 8" in listed.stdout


def test_dora_refusals(dora_fp32, tiny_weights, tmp_path):
    """use_dora without magnitude vectors, magnitude vectors without use_dora, a wrong-sized magnitude: each a clear
    AdapterFileError; the CLI prints one line. (SmoothQuant'ed artifacts take DoRA adapters:
    tests/runtime/test_adapters_smoothed.py.)"""
    from safetensors.numpy import load_file, save_file
    art, _, _ = dora_fp32
    good = tmp_path / "good"
    make_peft_lora(tiny_weights, good, seed=5, r=8, targets=["q_proj"], dora=True)

    def variant(name, cfg_patch=None, tensors_patch=None):
        d = tmp_path / name
        shutil.copytree(good, d)
        if cfg_patch:
            cfg = json.loads((d / "adapter_config.json").read_text()) | cfg_patch
            (d / "adapter_config.json").write_text(json.dumps(cfg))
        if tensors_patch:
            t = tensors_patch(load_file(str(d / "adapter_model.safetensors")))
            save_file(t, str(d / "adapter_model.safetensors"))
        return d

    no_dora_flag = variant("flag", {"use_dora": False})
    with pytest.raises(AdapterFileError, match="lora_magnitude_vector tensors .* does not set use_dora"):
        add_adapter(art, no_dora_flag, "bad")
    no_mag = variant("nomag", tensors_patch=lambda t: {k: v for k, v in t.items() if "magnitude" not in k})
    with pytest.raises(AdapterFileError, match=r"use_dora true \(DoRA\) but the weights hold no lora_magnitude"):
        add_adapter(art, no_mag, "bad")
    short = variant("short", tensors_patch=lambda t: {k: (v[:5] if "magnitude" in k else v) for k, v in t.items()})
    with pytest.raises(AdapterFileError, match="lora_magnitude_vector has shape \\[5\\]"):
        add_adapter(art, short, "bad")
    run = ortllm("adapters", "add", art, no_mag, "--name", "x")
    assert run.returncode == 1 and run.stderr.startswith("ortllm: error: ") and "Traceback" not in run.stderr
