"""Mixture-of-experts families (Qwen3-MoE: 8 experts, top-2, renormalised, one dense layer among three) against
transformers, from small random models made with transformers' own classes (tests/reference/hf_families.py,
MOE_FAMILIES) built by `ortllm build` from their HF directories: the fp32 engine graph's logits over a prefill and
greedy decode steps, its greedy tokens, int8 / int4 builds (the MoE op) against the engine's own fp32 by KLD, each
row of a batch as it is alone, the fused expert layout of transformers 5, and the refusals.

The seeds are chosen so that no token's router has its k-th and (k+1)-th probabilities within 1e-3 (a near tie would
let float rounding pick another expert and flake); with the routes that stable, fp32 logits within 1e-5 x max|logit|
mean the same experts were picked (another expert moves a logit by O(1) on these weights).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ortllm.cli.build import build_artifact
from ortllm.pipeline.build import BuildOptions
from ortllm.pipeline.errors import BuildError
from ortllm.runtime.artifact import load_artifact
from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams
from tests.reference.hf_families import (MOE_FAMILIES, MOE_GGUF_ARCH, hf_logits, hf_logits_hooked, save_hf_dir,
                                         tiny_model, write_gguf)
from tests.reference.hf_llama import hf_greedy_logits

STEPS = 12
NAMES = sorted(MOE_FAMILIES)
MARGIN = 1e-3
DENSE_LAYERS = {"qwen3_moe": [1], "mixtral": [], "qwen2_moe": [0], "olmoe": [], "granitemoe": [],
                "granitemoeshared": []}     # the layers keeping a dense MLP
# PEFT targets in the MoE MLPs (Granite's experts are no nn.Linear: its router's, and its shared expert's, are)
EXPERT_MODULES = {"qwen3_moe": ["gate_proj", "down_proj"], "mixtral": ["w1", "w2"],
                  "qwen2_moe": ["shared_expert_gate", "down_proj"], "olmoe": ["gate_proj", "down_proj"],
                  "granitemoe": ["layer"], "granitemoeshared": ["shared_mlp.input_linear"]}
ROUTERS = (".gate", ".router.layer")    # the routers' module names (their outputs: the logits [T, E])


def _prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, n).tolist()


def router_margin(model, ids: list[int]) -> float:
    """The smallest gap between a token's k-th and (k+1)-th router probability over every sparse layer."""
    import torch
    gaps = []

    def hook(module, args, out):
        p = torch.softmax(out.float(), -1).sort(-1, descending=True).values
        k = model.config.num_experts_per_tok
        gaps.append(float((p[..., k - 1] - p[..., k]).min()))

    hf_logits_hooked(model, ids, ROUTERS, hook)
    return min(gaps)


@pytest.fixture(scope="module")
def family(request, tmp_path_factory):
    """(name, transformers model, its HF directory, prompt, transformers' greedy tokens) for the first seed whose
    routes over prompt + continuation keep a top-k margin of MARGIN."""
    name = request.param
    prompt = _prompt(32, seed=1)
    for seed in range(20):
        model = tiny_model(name, seed=seed)
        ref_tokens, _ = hf_greedy_logits(model, prompt, STEPS)
        if router_margin(model, prompt + ref_tokens) >= MARGIN:
            break
    else:
        raise AssertionError(f"{name}: no seed in 20 keeps the router's top-k margin >= {MARGIN}")
    return name, model, save_hf_dir(model, tmp_path_factory.mktemp(name) / "hf"), prompt, ref_tokens


@pytest.fixture(scope="module")
def fp32_art(family, tmp_path_factory):
    return _build(family[2], tmp_path_factory.mktemp("fp32") / "art")


def _build(src, out, **opts):
    build_artifact(str(src), out, BuildOptions(**opts), log=lambda m: None)
    return out


def _logits(art_dir, ids: list[int]) -> np.ndarray:
    """[len(ids), V]: one prefill of ids through the engine graph."""
    from ortllm.calibration.fidelity import EngineScorer
    return np.concatenate(list(EngineScorer(load_artifact(art_dir), len(ids)).logits(ids)))


def _greedy(art_dir, prompts: list[list[int]]) -> list[list[int]]:
    with Engine.from_artifact(art_dir) as engine:
        outs = engine.generate(prompts, SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True))
    return [o.token_ids for o in outs]


def _kld(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean KL(p || q) over positions, natural log."""
    lp = p_logits - np.logaddexp.reduce(p_logits, -1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, -1, keepdims=True)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def engine_matches_transformers(name: str, model, prompt: list[int], ref_tokens: list[int], fp32_art) -> dict:
    """The fp32 build's logits over prompt + ref_tokens (transformers' greedy continuation) within 1e-5 x max|logit|
    of transformers', and its own greedy decode of prompt giving ref_tokens. Returns the build's config.json."""
    ids = prompt + ref_tokens
    ref, got = hf_logits(model, ids), _logits(fp32_art, ids)
    err, bound = np.abs(got - ref).max(), 1e-5 * np.abs(ref).max()
    assert err <= bound, f"{name}: max |dlogit| {err:.3g} > {bound:.3g}"
    assert _greedy(fp32_art, [prompt]) == [ref_tokens]
    return json.loads((fp32_art / "config.json").read_text())


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_engine_fp32_matches_transformers(family, fp32_art):
    """Logits of every position of prompt + transformers' greedy continuation (the decode steps' inputs) within
    1e-5 x max|logit| (measured 1.9e-6 of 4.3), and the engine's own greedy decode gives transformers' tokens."""
    name, model, _, prompt, ref_tokens = family
    cfg = engine_matches_transformers(name, model, prompt, ref_tokens, fp32_art)
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["dense_layers"]) == (8, 2, DENSE_LAYERS[name])


@pytest.mark.parametrize("family", NAMES, indirect=True)
@pytest.mark.parametrize("quant, max_kld", [("int8", 1e-3), ("int4", 3e-2)])
def test_quantized_against_the_engines_fp32(family, fp32_art, tmp_path, quant, max_kld):
    """int8 / int4 builds (the experts in the MoE op, the router fp32) against the fp32 engine graph of the same
    weights by mean KLD over prompt + continuation (measured: int8 1.2e-4, int4 0.014); and each row of a batch of
    three prompts decodes as it does alone (greedy tokens, on the batch-invariant ops)."""
    name, _, hf_dir, prompt, ref_tokens = family
    art = _build(hf_dir, tmp_path / "art", quant=quant, quality_tokens=64)
    graph = (art / "model.onnx").read_bytes()
    assert b"MoE" in graph
    near_fp32_and_batch_invariant(f"{name} {quant}", art, fp32_art, prompt, ref_tokens, max_kld)


def near_fp32_and_batch_invariant(what: str, art, fp32_art, prompt: list[int], ref_tokens: list[int],
                                  max_kld: float) -> None:
    """A quantized build `art` within max_kld (mean KLD over prompt + ref_tokens) of the fp32 build, and each row of
    a batch of three prompts decoding as it does alone (greedy tokens)."""
    ids = prompt + ref_tokens
    kld = _kld(_logits(fp32_art, ids), _logits(art, ids))
    assert kld <= max_kld, f"{what}: KLD vs fp32 {kld:.3g} > {max_kld}"
    prompts = [prompt, _prompt(7, seed=3), _prompt(19, seed=4)]
    alone = [_greedy(art, [p])[0] for p in prompts]
    assert _greedy(art, prompts) == alone
    for a in (art, fp32_art):
        plan_counts_the_adapter_slots(a)


def plan_counts_the_adapter_slots(art_dir) -> None:
    """The memory plan's adapter slots (runtime/memory_plan.py) are the A/B stacks the runner allocates at full size
    (max_loras x max_lora_rank), within their scales' share: none for the MLPs of sparse layers."""
    from ortllm.runtime.memory_plan import adapter_slot_bytes

    with Engine.from_artifact(art_dir) as engine:
        ad = engine.config.adapters
        engine.runner.resize_adapter_slots(ad.max_slots, ad.max_rank)
        stacks = sum(a.nbytes for n, a in engine.runner._arrays.items()
                     if n.startswith("lora.") and n.endswith((".a", ".b", ".a_scale", ".b_scale")))
        planned = adapter_slot_bytes(engine.artifact.model_config, engine.config,
                                     engine.artifact.manifest["build"]["quant"])
    assert abs(planned - stacks) <= 0.05 * stacks, (art_dir, planned, stacks)


@pytest.mark.parametrize("family", ["qwen3_moe"], indirect=True)
def test_fused_expert_layout(family, fp32_art, tmp_path):
    """transformers 5 stores a layer's experts fused (mlp.experts.gate_up_proj [E, 2I, H], gate rows first;
    mlp.experts.down_proj [E, H, I]): the same HF directory with them fused builds the same graph's logits."""
    from safetensors.numpy import load_file, save_file
    name, model, hf_dir, prompt, _ = family
    fused_dir = tmp_path / "hf"
    fused_dir.mkdir()
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            (fused_dir / f.name).write_bytes(f.read_bytes())
    t = load_file(str(hf_dir / "model.safetensors"))
    cfg = model.config
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts"
        if f"{p}.0.gate_proj.weight" not in t:
            continue
        e = range(cfg.num_experts)
        t[f"{p}.gate_up_proj"] = np.stack([np.concatenate([t.pop(f"{p}.{j}.gate_proj.weight"),
                                                           t.pop(f"{p}.{j}.up_proj.weight")]) for j in e])
        t[f"{p}.down_proj"] = np.stack([t.pop(f"{p}.{j}.down_proj.weight") for j in e])
    save_file(t, str(fused_dir / "model.safetensors"))
    art = _build(fused_dir, tmp_path / "art")
    np.testing.assert_array_equal(_logits(art, prompt), _logits(fp32_art, prompt))


@pytest.mark.parametrize("family", sorted(MOE_GGUF_ARCH), indirect=True)
def test_gguf_matches_the_hf_build(family, fp32_art, tmp_path):
    """The model written as llama.cpp's converter writes it (F32; experts stacked [E, ...] in ffn_*_exps, Granite's
    split from its fused input_linear, the router ffn_gate_inp, the shared experts' ffn_*_shexp and Qwen2-MoE's gate
    ffn_gate_inp_shexp, Qwen3-MoE's dense layer as ffn_gate / ffn_up / ffn_down, Granite's multipliers as keys and its
    q/k rows permuted as for llama, Mixtral as arch llama) builds the HF directory's graph: the same config and the
    same logits (over 40 positions: within Mixtral's window, which llama.cpp's llama architecture does not carry)."""
    name, model, _, prompt, ref_tokens = family
    art = _build(write_gguf(model, name, tmp_path / f"{name}.gguf"), tmp_path / "art")
    keys = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_router", "norm_topk_prob",
            "dense_layers", "shared_expert_intermediate_size", "shared_expert_gate", "attention_bias", "qk_norm",
            "qk_norm_whole", "embedding_scale", "attention_scale", "residual_multiplier", "logits_scaling")
    got, want = (json.loads((a / "config.json").read_text()) for a in (art, fp32_art))
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
    ids = (prompt + ref_tokens)[:40]
    np.testing.assert_array_equal(_logits(art, ids), _logits(fp32_art, ids))


@pytest.mark.parametrize("family", ["qwen3_moe"], indirect=True)
def test_int4_from_a_gguf_with_wider_expert_types(family, fp32_art, tmp_path):
    """A GGUF whose experts mix types (Q4_K_M keeps ffn_down_exps Q6_K beside Q4_K; here ffn_gate_exps Q8_0, the rest
    F32) builds int4 with every expert in the MoE op at one bit width (the int4 source mix, which keeps a tensor of a
    wider type int8, leaves the experts alone: the op takes one width), within the int4 KLD bound of the fp32
    graph."""
    import gguf
    name, model, _, prompt, ref_tokens = family
    q8 = {"ffn_gate_exps.weight": gguf.GGMLQuantizationType.Q8_0}      # [E, I, H]: rows of H = 64, two blocks
    art = _build(write_gguf(model, name, tmp_path / f"{name}.gguf", types=q8), tmp_path / "art", quant="int4",
                 quality_tokens=64)
    graph = (art / "model.onnx").read_bytes()
    assert b"experts.gate_up.qcodes4" in graph and b"experts.gate_up.qcodes8" not in graph
    ids = prompt + ref_tokens
    kld = _kld(_logits(fp32_art, ids), _logits(art, ids))
    assert kld <= 3e-2, f"{name} int4 from a mixed GGUF: KLD vs fp32 {kld:.3g}"


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_refusals_name_what_to_do(family, tmp_path):
    _, _, hf_dir, _, _ = family
    with pytest.raises(BuildError, match="portable graph has no mixture-of-experts MLP yet"):
        _build(hf_dir, tmp_path / "a", graph="portable")
    with pytest.raises(BuildError, match="MoE model builds without a calibration pass"):
        _build(hf_dir, tmp_path / "b", quant="int8", smooth=0.5)


ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def attention_lora_equals_peft(model, fp32_art, prompt: list[int], tmp_path) -> Path:
    """A PEFT LoRA (seeded, non-zero B) on q/k/v/o of `model`, added to a copy of its fp32 build as "attn": the
    engine's greedy tokens with it equal PEFT's (and differ from the base model's). Returns the copy."""
    import copy
    import shutil

    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from ortllm.runtime.adapter_files import add_adapter

    art = tmp_path / "art"
    shutil.copytree(fp32_art, art)
    torch.manual_seed(5)
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                           target_modules=ATTENTION))
    peft.save_pretrained(tmp_path / "attn")
    add_adapter(art, tmp_path / "attn", "attn")
    peft = PeftModel.from_pretrained(copy.deepcopy(model), tmp_path / "attn").eval()
    ref_tokens, _ = hf_greedy_logits(peft, prompt, STEPS)
    assert ref_tokens != hf_greedy_logits(model, prompt, STEPS)[0], "the adapter should change the greedy tokens"
    with Engine.from_artifact(art) as engine:
        got = engine.generate([prompt], SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True,
                                                       adapter="attn"))[0].token_ids
    assert got == ref_tokens
    return art


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_lora_on_the_attention_and_refused_on_experts(family, fp32_art, tmp_path):
    """A PEFT LoRA on the attention projections of the MoE model gives PEFT's greedy tokens through the engine; one
    that targets the experts (PEFT's module names match every expert's) is refused by name."""
    import copy

    from peft import LoraConfig, get_peft_model

    from ortllm.runtime.adapter_files import AdapterFileError, add_adapter
    name, model, _, prompt, _ = family
    art = attention_lora_equals_peft(model, fp32_art, prompt, tmp_path)
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=EXPERT_MODULES[name],
                                                           init_lora_weights=False))
    peft.save_pretrained(tmp_path / "mlp")
    with pytest.raises(AdapterFileError, match=r"targets a mixture-of-experts MLP .* q_proj, k_proj, v_proj, o_proj"):
        add_adapter(art, tmp_path / "mlp", "mlp")
