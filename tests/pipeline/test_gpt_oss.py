"""gpt-oss against transformers, from a small random GptOssForCausalLM (tests/reference/hf_families.py, GPT_OSS: 3
layers sliding / full / sliding with a window of 8 over a 44-token prompt, 8 experts top-2, q/k/v/o, router and
expert biases, non-zero attention sinks, YaRN, gate|up scaled so the SwiGLU clamp at 7 fires) built by `ortllm build`
from its HF directory: the fp32 engine graph's logits over a prefill and greedy decode steps, its greedy tokens,
int8 / int4 builds (the MoE op, clamped SwiGLU with biases) against the engine's own fp32 by KLD, each row of a batch
as it is alone, and MXFP4 checkpoints read by dequantizing their experts exactly.

As in test_moe_families.py the seed is chosen so no token's router has its k-th and (k+1)-th logits within 1e-3.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest

from ortllm.pipeline.errors import BuildError
from tests.pipeline.test_moe_families import (STEPS, _build, _kld, _logits, _prompt,
                                              attention_lora_equals_peft, engine_matches_transformers,
                                              near_fp32_and_batch_invariant)
from tests.reference.hf_families import hf_logits, hf_logits_hooked, save_hf_dir, tiny_model
from tests.reference.hf_llama import hf_greedy_logits

MARGIN = 1e-3
PROMPT = 44


def router_margin(model, ids: list[int]) -> float:
    """The smallest gap between a token's k-th and (k+1)-th router logit over every layer (gpt-oss routes on the
    logits: top-k, then a softmax over those k)."""
    import torch
    gaps = []

    def hook(module, args, out):
        logits = torch.nn.functional.linear(args[0].reshape(-1, module.hidden_dim), module.weight, module.bias)
        top = logits.sort(-1, descending=True).values
        gaps.append(float((top[:, module.top_k - 1] - top[:, module.top_k]).min()))

    hf_logits_hooked(model, ids, ".router", hook)
    return min(gaps)


def clamped_share(model, ids: list[int]) -> float:
    """The share of the routed experts' gate / up values beyond the clamp (gate > 7 or |up| > 7)."""
    hits, total = [0], [0]

    def hook(module, args, kwargs, out):
        x = args[0].reshape(-1, module.hidden_size)
        idx = kwargs["router_indices"]
        for t in range(x.shape[0]):
            for e in idx[t].tolist():
                gu = x[t] @ module.gate_up_proj[e] + module.gate_up_proj_bias[e]
                g, u = gu[::2], gu[1::2]
                hits[0] += int((g > module.limit).sum() + (u.abs() > module.limit).sum())
                total[0] += gu.numel()

    hf_logits_hooked(model, ids, ".experts", hook, with_kwargs=True)     # under no_grad, as hf_logits runs
    return hits[0] / total[0]


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """(transformers model, its HF directory, prompt, transformers' greedy tokens) for the first seed whose routes
    over prompt + continuation keep a top-k margin of MARGIN."""
    prompt = _prompt(PROMPT, seed=1)
    for seed in range(20):
        model = tiny_model("gpt_oss", seed=seed)
        if router_margin(model, prompt) < MARGIN:       # the cheap rejection first: one forward of the prompt
            continue
        ref_tokens, _ = hf_greedy_logits(model, prompt, STEPS)
        if router_margin(model, prompt + ref_tokens) >= MARGIN:
            break
    else:
        raise AssertionError(f"gpt-oss: no seed in 20 keeps the router's top-k margin >= {MARGIN}")
    return model, save_hf_dir(model, tmp_path_factory.mktemp("gpt_oss") / "hf"), prompt, ref_tokens


@pytest.fixture(scope="module")
def fp32_art(family, tmp_path_factory):
    return _build(family[1], tmp_path_factory.mktemp("fp32") / "art")


def test_the_case_exercises_every_feature(family):
    """Not vacuous: the clamp fires on the routed experts, and zeroing the sinks or lifting the clamp moves
    transformers' logits by far more than the parity bound."""
    import copy

    import torch
    model, _, prompt, ref_tokens = family
    ids = prompt + ref_tokens
    assert clamped_share(model, ids) > 0.02
    ref = hf_logits(model, ids)
    no_sinks, no_clamp = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        for n, p in no_sinks.named_parameters():
            if n.endswith("sinks"):
                p.zero_()
    for m in no_clamp.modules():
        if hasattr(m, "limit"):
            m.limit = 1e9
    for other in (no_sinks, no_clamp):
        assert np.abs(hf_logits(other, ids) - ref).max() > 1e-2 * np.abs(ref).max()


@pytest.mark.isa_paths
def test_engine_fp32_matches_transformers(family, fp32_art):
    """Logits of every position of prompt + transformers' greedy continuation within 1e-5 x max|logit|, and the
    engine's own greedy decode gives transformers' tokens."""
    model, _, prompt, ref_tokens = family
    cfg = engine_matches_transformers("gpt-oss", model, prompt, ref_tokens, fp32_art)
    assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_router"], cfg["swiglu_limit"]) == \
        (8, 2, "topk_softmax", 7.0)
    assert cfg["layer_types"] == ["sliding", "full", "sliding"] and cfg["sliding_window"] == 8
    assert cfg["rope_scaling"]["type"] == "yarn" and cfg["attention_sinks"] and cfg["o_proj_bias"]


@pytest.mark.isa_paths
@pytest.mark.parametrize("quant, max_kld", [("int8", 5e-3), ("int4", 0.25)])
def test_quantized_against_the_engines_fp32(family, fp32_art, tmp_path, quant, max_kld):
    """int8 / int4 builds (the experts in the MoE op with its clamped SwiGLU and biases, the router fp32) against
    the fp32 engine graph by mean KLD over prompt + continuation (measured: int8 0.0018, int4 0.132); each row of a
    batch of three prompts decodes as it does alone. The bounds are wider than Qwen3-MoE's because this model is
    that sensitive to its weights' rounding, not the engine: transformers itself with every projection and expert
    rounded to 4-bit min-max blocks of 32 (router, embeddings and head kept) is at KLD 0.134 from its fp32 logits
    on the same tokens (Qwen3-MoE's tiny model: 0.022, its engine int4 0.014); and quantization noise in the
    router's input flips some of the routes the fp32 seed keeps 1e-3 apart (int8 over seeds 1-11: 0.002-0.034)."""
    _, hf_dir, prompt, ref_tokens = family
    art = _build(hf_dir, tmp_path / "art", quant=quant, quality_tokens=64)
    assert b"clamped_swiglu" in (art / "model.onnx").read_bytes()
    near_fp32_and_batch_invariant(f"gpt-oss {quant}", art, fp32_art, prompt, ref_tokens, max_kld)


def _mxfp4(rng, e: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random MXFP4 blocks [E, N, K/32, 16] (every code) and e8m0 scales [E, N, K/32] around 2^-3."""
    return (rng.integers(0, 256, (e, n, k // 32, 16)).astype(np.uint8),
            rng.integers(127 - 5, 127 - 1, (e, n, k // 32)).astype(np.uint8))


@pytest.fixture(scope="module")
def mxfp4_dirs(tmp_path_factory):
    """(config, root): the tiny model (an expert width of 64, as MXFP4's blocks of 32 need) as the hub's MXFP4
    layout (mlp.experts.{gate_up,down}_proj_blocks / _scales, quantization_config mxfp4) in root / "mxfp4", and as
    a checkpoint holding the fp32 dequantized experts in root / "plain" (checked against transformers'
    convert_moe_packed_tensors)."""
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from ortllm.pipeline.families import mxfp4_dequantize
    root = tmp_path_factory.mktemp("mxfp4")
    model = tiny_model("gpt_oss", seed=1, intermediate_size=64)
    hf_dir, c = save_hf_dir(model, root / "hf"), model.config
    rng = np.random.default_rng(0)
    t = load_file(str(hf_dir / "model.safetensors"))
    packed, plain = dict(t), dict(t)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts"
        for proj, n, k in (("gate_up_proj", 2 * c.intermediate_size, c.hidden_size),
                           ("down_proj", c.hidden_size, c.intermediate_size)):
            blocks, scales = _mxfp4(rng, c.num_local_experts, n, k)
            ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                             dtype=torch.float32).numpy()
            ours = mxfp4_dequantize(blocks, scales)
            np.testing.assert_array_equal(ours, ref)
            del packed[f"{p}.{proj}"]
            packed |= {f"{p}.{proj}_blocks": blocks, f"{p}.{proj}_scales": scales}
            plain[f"{p}.{proj}"] = ours
    for name, tensors, extra in (("plain", plain, {}), ("mxfp4", packed, {"quant_method": "mxfp4"})):
        src = root / name
        shutil.copytree(hf_dir, src)
        save_file(tensors, str(src / "model.safetensors"))
        if extra:
            cfg = json.loads((src / "config.json").read_text())
            (src / "config.json").write_text(json.dumps(cfg | {"quantization_config": extra}))
    return c, root


def _expert_report(art, c) -> dict:
    report = json.loads((art / "quality.json").read_text())["tensors"]
    experts = {n: r for n, r in report.items() if ".mlp.experts." in n}
    assert len(experts) == c.num_hidden_layers * c.num_local_experts * 3
    return experts


def _expert_bytes(art) -> int:
    """The bytes of the MoE ops' expert codes, scales and offsets in the artifact's graph."""
    import onnx
    from onnx import helper
    graph = onnx.load(str(art / "model.onnx"), load_external_data=False).graph
    return sum(int(np.prod(t.dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
               for t in graph.initializer if "/experts." in t.name and ".q" in t.name)


def test_mxfp4_checkpoint_builds_its_exact_dequantization(mxfp4_dirs, tmp_path):
    """The MXFP4 checkpoint dequantized exactly as transformers' convert_moe_packed_tensors does (mxfp4_dirs), and
    its build gives the same logits, bit for bit, as the build of the checkpoint holding the dequantized fp32
    experts; int8 and int4 builds both keep the experts exact: int8 on MXFP4's own grid (25 levels of 2^(s - 128) a
    block: no second rounding, 9 bits a weight with d and m), int4 in the MoE op's mxfp4 format (the source's codes
    into the 2 x e2m1 table: 4.5 bits a weight), so the int4 artifact's expert bytes are half the int8 one's."""
    c, root = mxfp4_dirs
    prompt = _prompt(PROMPT, seed=1)
    arts = {name: _logits(_build(root / name, tmp_path / f"{name}_art"), prompt) for name in ("plain", "mxfp4")}
    np.testing.assert_array_equal(arts["mxfp4"], arts["plain"])
    built = {}
    for quant, algo, bpw in (("int8", "source grid (MXFP4)", 9.0), ("int4", "source codes (MXFP4)", 4.5)):
        built[quant] = art = _build(root / "mxfp4", tmp_path / f"mxfp4_{quant}", quant=quant, quality_tokens=16)
        for n, r in _expert_report(art, c).items():
            assert (r["algo"], r["max_rel"], r["bits_per_weight"]) == (algo, 0, bpw), (quant, n, r)
            assert (r.get("format") == "mxfp4") == (quant == "int4") and "fallback" not in r
    assert (b'weight_format' in (built["int4"] / "model.onnx").read_bytes()) and \
        b'weight_format' not in (built["int8"] / "model.onnx").read_bytes()
    assert _expert_bytes(built["int4"]) * 2 == _expert_bytes(built["int8"])
    cfg = json.loads((root / "hf" / "config.json").read_text())
    refused = tmp_path / "fp8"
    shutil.copytree(root / "plain", refused)
    (refused / "config.json").write_text(json.dumps(cfg | {"quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(BuildError, match="quant_method 'fp8' is not read; supported: none"):
        _build(refused, tmp_path / "refused")


def test_mxfp4_int4_build_is_the_exact_int8_one(mxfp4_dirs, tmp_path):
    """The int4 build's mxfp4 experts compute what the exact int8 experts do, bit for bit: with the attention kept
    int8 as in the int8 build (the rest of the two plans the same), the logits over prompt + continuation are equal
    (the integer dots are the same exact sums, d the same power of two, int8's m is 0). Against the fp32 build that
    build is then only the activations' int8 rounding away (KLD within int8's bound, under a third of the same plan's
    with the experts re-quantized to int4 from the plain checkpoint; measured 0.0016 against 0.116), and each row of
    a batch decodes as it does alone. (Within fp32 tolerance of the fp32 build it cannot be: QLinear rounds its
    activations to int8 codes per block, exact weights or not.)"""
    c, root = mxfp4_dirs
    prompt = _prompt(PROMPT, seed=1)
    keep = ("model.layers.*.self_attn.*=int8",)
    int8 = _build(root / "mxfp4", tmp_path / "int8", quant="int8", quality_tokens=16)
    mx = _build(root / "mxfp4", tmp_path / "mx", quant="int4", keep=keep, quality_tokens=16)
    np.testing.assert_array_equal(_logits(mx, prompt), _logits(int8, prompt))
    fp32 = _build(root / "plain", tmp_path / "fp32")
    requant = _build(root / "plain", tmp_path / "requant", quant="int4", keep=keep, quality_tokens=16)
    ref = _logits(fp32, prompt)
    kld, kld_requant = _kld(ref, _logits(mx, prompt)), _kld(ref, _logits(requant, prompt))
    assert kld < kld_requant / 3, (kld, kld_requant)
    near_fp32_and_batch_invariant("gpt-oss int4 mxfp4, attention int8", mx, fp32, prompt, [], 5e-3)


def test_gpt_oss_20b_config_and_its_yarn_tables():
    """gpt-oss-20b's config (transformers' GptOssConfig at 24 layers, 32 experts: alternating sliding 128 / full,
    YaRN factor 32 over 4096 without truncation) reads as gpt-oss; its RoPE frequencies and attention factor are
    transformers' own (ROPE_INIT_FUNCTIONS["yarn"]; a few of the 32 a float32 ulp off, torch's pow rounding its own
    way: 2 on an AVX2 host, 5 on an AMX Xeon) and so are the cos / sin tables, which carry the factor: each entry is
    the cos / sin of its fp32 angle to within 1e-6, equal to torch's where the frequencies are, and where a frequency
    is an ulp off within what that moves the fp32 angle at position p (p x df and the angle's own rounding, ~4.9e-4
    at 4095 rad: over 1e-4 on some hosts)."""
    import torch
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ortllm.pipeline.families import hf_config
    from ortllm.pipeline.graph_blocks import rope_inv_freq, rope_tables
    hf = transformers.GptOssConfig(num_hidden_layers=24, num_local_experts=32, swiglu_limit=7.0)
    cfg = hf_config(hf.to_dict())
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.sliding_window) == (32, 4, 2880,
                                                                                                         128)
    assert cfg.layer_types == ("sliding", "full") * 12 and cfg.attention_bias and cfg.o_proj_bias and cfg.moe_bias
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    assert cfg.rope_scaling["attention_factor"] == pytest.approx(factor, rel=1e-12)
    for kind in ("sliding", "full"):          # one rotary embedding for both layer types
        np.testing.assert_allclose(rope_inv_freq(cfg, kind), inv.numpy(), rtol=2e-7, atol=0)
    cos, sin = rope_tables(cfg, "full", max_pos=4096)
    ours = np.outer(np.arange(4096, dtype=np.float32), rope_inv_freq(cfg, "full")).astype(np.float64)
    np.testing.assert_allclose(cos, np.cos(ours) * factor, rtol=0, atol=1e-6)
    np.testing.assert_allclose(sin, np.sin(ours) * factor, rtol=0, atol=1e-6)
    ang = torch.outer(torch.arange(4096, dtype=torch.float32), inv)
    df = np.abs(rope_inv_freq(cfg, "full").astype(np.float64) - inv.numpy().astype(np.float64))
    # where a frequency differs, the fp32 angles differ by p x df plus one rounding of the angle; else they are equal
    moved = factor * np.where(df > 0, np.arange(4096)[:, None] * df + np.spacing(ours.astype(np.float32)), 0) + 1e-6
    assert (np.abs(cos - (ang.cos() * factor).numpy()) <= moved).all()
    assert (np.abs(sin - (ang.sin() * factor).numpy()) <= moved).all()


def test_lora_on_the_attention(family, fp32_art, tmp_path):
    """A PEFT LoRA on q/k/v/o of the gpt-oss model (o_proj with its bias) gives PEFT's greedy tokens through the
    engine (PEFT itself cannot target gpt-oss's router or its fused experts: they are no Linear modules)."""
    model, _, prompt, _ = family
    attention_lora_equals_peft(model, fp32_art, prompt, tmp_path)


def test_mxfp4_falls_back_to_exact_int8_where_fp16_cannot_hold_a_scale():
    """A layer's MXFP4 experts go mxfp4 when every block scale 2^(e - 128) is an fp16 number; one that is not (2^-30)
    sends the layer's experts to int8 on MXFP4's grid, and the report says why; a layer whose experts are not all
    MXFP4 does the same (the MoE op takes one format a layer); a layer without MXFP4 is quantized as before."""
    from ortllm.pipeline.families import mxfp4_grid
    from ortllm.pipeline.quantize import QuantPlan
    from tests.custom_ops.test_mxfp4 import mxfp4_source
    rng = np.random.default_rng(0)
    names = [f"model.layers.0.mlp.experts.{e}.{p}.weight" for e in range(2) for p in ("gate_proj", "up_proj",
                                                                                          "down_proj")]
    ws, exps = {}, {}
    for n in names:
        ws[n], scale = mxfp4_source(rng, 64, 64)
        exps[n] = (np.log2(scale) + 128).astype(np.uint8)          # the e8m0 bytes mxfp4_grid reads
    plan = QuantPlan(quant="int4", source_types={n: "MXFP4" for n in names},
                     source_grids={n: mxfp4_grid(exps[n]) for n in names})
    assert plan.expert_format(names) == ("mxfp4", None)
    q = plan.quantize(names[0], ws[names[0]], plan.expert_format(names))
    assert (q.format, q.bits, q.max_rel, plan.report[names[0]]["format"]) == ("mxfp4", 4, 0.0, "mxfp4")
    tiny = dict(exps)
    tiny[names[4]] = exps[names[4]].copy()
    tiny[names[4]][0, 0] = 128 - 30
    low = QuantPlan(quant="int4", source_types={n: "MXFP4" for n in names},
                    source_grids={n: mxfp4_grid(tiny[n]) for n in names})
    form = low.expert_format(names)
    assert form[0] == "int8" and names[4] in form[1] and "no fp16 number" in form[1]
    q = low.quantize(names[0], ws[names[0]], form)
    assert (q.format, q.bits, q.max_rel) == ("affine", 8, 0.0)
    assert low.report[names[0]]["algo"] == "source grid (MXFP4)" and low.report[names[0]]["fallback"] == form[1]
    mixed = QuantPlan(quant="int4", source_types={n: "MXFP4" for n in names[1:]},
                      source_grids={n: mxfp4_grid(exps[n]) for n in names[1:]})
    assert mixed.expert_format(names)[0] == "int8"
    assert QuantPlan(quant="int4").expert_format(names) == (None, None)
    assert QuantPlan(quant="int8", source_types={n: "MXFP4" for n in names},
                     source_grids={n: mxfp4_grid(exps[n]) for n in names}).expert_format(names) == (None, None)
    off = ws[names[0]].copy()
    off[0, 0] = 5 * plan.source_grids[names[0]][0][0, 0]                 # between the table's 4 and 6
    with pytest.raises(BuildError, match=r"not on its MXFP4 grid .* --keep 'model.layers.0.mlp.experts.\*=int8'"):
        plan.quantize(names[0], off, plan.expert_format(names))


def _shape_cut():
    """gpt-oss-20b-shape cut to build in seconds (2 layers sliding / full, 4 experts top 2, hidden and expert width 64,
    a 512-token vocabulary), its source and every other key the recipe's."""
    import dataclasses

    from ortllm.pipeline.recipes import get_recipe
    recipe = get_recipe("gpt-oss-20b-shape")
    a = recipe.architecture
    cut = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 64, "num_layers": 2, "num_heads": 4,
           "num_kv_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "sliding_window": 8,
           "layer_types": a["layer_types"][:2], "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 64}
    return recipe, dataclasses.replace(recipe, name="gpt-oss-20b-shape-cut", architecture={**a, **cut})


def test_gpt_oss_20b_shape_draws_the_hubs_mxfp4_tensors_and_int4_keeps_their_codes(tmp_path, monkeypatch):
    """The shape recipe's random source (cut to 2 layers of 4 experts) is a hub checkpoint's tensors drawn from
    (seed, index) when read, never before: written as a safetensors directory with the config.json the recipe's keys
    stand for, load_hf_dir reads the same config, the same tensors and grids. Its dequantized experts are the size of
    the other projections (std within 2x of 1 / sqrt(K)), and its int4 build keeps every expert's MXFP4 codes in the
    MoE op's mxfp4 format (error 0, 4.5 bits a weight), as a real gpt-oss checkpoint's."""
    from safetensors.numpy import save_file

    from ortllm.cli.build import build_artifact
    from ortllm.pipeline import sources
    from ortllm.pipeline.build import BuildOptions
    from ortllm.pipeline.families import hf_config, mxfp4_hub_shapes
    from ortllm.pipeline.shape_weights import NO_FIDELITY
    from ortllm.pipeline.weights import expected_shapes
    recipe, cut = _shape_cut()
    drawn = []
    real = sources._random_tensor
    monkeypatch.setattr(sources, "_random_tensor", lambda rng, name, shape: drawn.append(name) or real(rng, name,
                                                                                                       shape))
    w = sources.random_weights(cut)
    assert drawn == [], "no tensor drawn before it is read"
    cfg, seed = w.config, int(recipe.source["seed"])
    hub = mxfp4_hub_shapes(cfg)
    assert hub["model.layers.0.mlp.experts.gate_up_proj_blocks"] == (4, 128, 2, 16)
    assert hub["model.layers.0.mlp.experts.down_proj_scales"] == (4, 64, 2)
    assert not any(".mlp.experts.0." in n or ".mlp.gate." in n for n in hub)

    src = tmp_path / "hub"
    src.mkdir()
    save_file({n: real(np.random.default_rng([seed, i]), n, s) for i, (n, s) in enumerate(hub.items())},
              str(src / "model.safetensors"))
    a = cut.architecture
    r = {k: v for k, v in a["rope_scaling"].items() if k not in ("type", "attention_factor")}
    config = {"model_type": "gpt_oss", "vocab_size": a["vocab_size"], "hidden_size": a["hidden_size"],
              "intermediate_size": a["moe_intermediate_size"], "num_hidden_layers": a["num_layers"],
              "num_attention_heads": a["num_heads"], "num_key_value_heads": a["num_kv_heads"],
              "head_dim": a["head_dim"], "max_position_embeddings": a["max_position_embeddings"],
              "rope_theta": a["rope_theta"], "rms_norm_eps": a["rms_norm_eps"], "tie_word_embeddings": False,
              "sliding_window": a["sliding_window"], "layer_types": [f"{t}_attention" for t in a["layer_types"]],
              "rope_scaling": {"rope_type": "yarn", **r}, "num_local_experts": a["num_experts"],
              "num_experts_per_tok": a["num_experts_per_tok"], "swiglu_limit": a["swiglu_limit"],
              "eos_token_id": 0, "quantization_config": {"quant_method": "mxfp4"}}     # eos: the random sources'
    (src / "config.json").write_text(json.dumps(config))
    assert cfg == hf_config(config)
    from_hub = sources.load_hf_dir(src)
    assert set(from_hub.tensors) == set(w.tensors) == set(expected_shapes(cfg))
    for name in w.tensors:
        np.testing.assert_array_equal(w.tensors[name], from_hub.tensors[name], err_msg=name)
    assert w.extra["source_types"] == from_hub.extra["source_types"] and len(w.extra["source_grids"]) == 2 * 4 * 3
    for name in w.extra["source_grids"]:
        for ours, theirs in zip(w.extra["source_grids"][name], from_hub.extra["source_grids"][name]):
            np.testing.assert_array_equal(ours, theirs, err_msg=name)
    for name in ("model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.0.mlp.experts.0.down_proj.weight"):
        std = float(w.tensors[name].std()) * np.sqrt(w.tensors.shape(name)[1])
        assert 0.5 < std < 2, (name, std)

    monkeypatch.setattr(sources, "known_recipes", lambda: {cut.name: cut})
    drawn.clear()
    art = tmp_path / "int4"
    build_artifact(cut.name, art, BuildOptions(quant="int4", quality_tokens=16), log=lambda m: None)
    assert set(drawn) == set(hub), "the build reads the hub's tensors, each drawn when read"
    fused = Counter(n for n in drawn if ".mlp.experts." in n)
    assert fused == {n: 1 for n in hub if ".mlp.experts." in n}, "a layer's fused experts read once, not per expert"
    quality = json.loads((art / "quality.json").read_text())
    experts = {n: r for n, r in quality["tensors"].items() if ".mlp.experts." in n}
    assert len(experts) == 2 * 4 * 3 and quality["fidelity_skipped"] == NO_FIDELITY
    for n, r in experts.items():
        assert (r["algo"], r["max_rel"], r["bits_per_weight"], r["format"]) == ("source codes (MXFP4)", 0, 4.5,
                                                                               "mxfp4"), (n, r)
        assert "fallback" not in r
    graph = (art / "model.onnx").read_bytes()
    assert b"weight_format" in graph and b"clamped_swiglu" in graph
