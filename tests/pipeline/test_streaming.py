"""Streaming builds: tensors read on access (weights.LazyTensors) give the arrays the eager readers gave, row-chunked
quantization and packing give the same bytes, and a shape recipe's safetensors directory loads lazily."""
from __future__ import annotations

import numpy as np

from ortllm.pipeline import quant_grid
from ortllm.pipeline.families import split_fused
from ortllm.pipeline.qlinear_pack import _pack, pack
from ortllm.pipeline.quantize import RTNQuantizer
from ortllm.pipeline.recipes import get_recipe
from ortllm.pipeline.shape_weights import NO_FIDELITY, write_shape_dir
from ortllm.pipeline.sources import load_hf_dir, random_weights
from ortllm.pipeline.weights import LazyTensors, ModelConfig, expected_shapes


def test_random_weights_are_the_eager_generators_draws():
    """The lazy tensors are the very draws of one generator in expected_shapes order (the artifacts stay the same)."""
    recipe = get_recipe("llama-tiny-random")
    w = random_weights(recipe)
    assert isinstance(w.tensors, LazyTensors)
    rng = np.random.default_rng(int(recipe.source["seed"]))
    for name, shape in expected_shapes(w.config).items():
        if len(shape) == 1:
            want = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        else:
            scale = 1.0 if name == "model.embed_tokens.weight" else 1.0 / np.sqrt(shape[1])
            want = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        assert np.array_equal(w.tensors[name], want), name
    assert "fidelity_skipped" not in w.extra       # the test recipe keeps its in-build check
    assert get_recipe("tinyllama-1.1b-shape").source["fidelity_check"] is False   # its build says NO_FIDELITY
    assert "KLD" in NO_FIDELITY


def test_per_tensor_seeds_draw_each_tensor_from_its_own_seed_without_a_pass_first(monkeypatch):
    """per_tensor_seeds (the 30B shape recipe): tensor i is the draw of default_rng([seed, i]), made only when read
    (nothing is drawn to set the loaders up: a 30B model's pass took minutes), the same on every read; the shape
    recipes have their models' parameter counts (Qwen3-30B-A3B 30.5B, 3.35B active; OLMoE-1B-7B 6.9B, 1.28B)."""
    import dataclasses

    from ortllm.pipeline import sources

    base = get_recipe("llama-tiny-random")
    recipe = dataclasses.replace(base, source={**base.source, "per_tensor_seeds": True})
    drawn = []
    real = sources._random_tensor
    monkeypatch.setattr(sources, "_random_tensor", lambda rng, name, shape: drawn.append(name) or real(rng, name,
                                                                                                       shape))
    w = random_weights(recipe)
    assert drawn == [], "no tensor drawn before it is read"
    seed = int(base.source["seed"])
    for i, (name, shape) in enumerate(expected_shapes(w.config).items()):
        assert np.array_equal(w.tensors[name], real(np.random.default_rng([seed, i]), name, shape)), name
    name = "model.layers.1.mlp.down_proj.weight"
    assert np.array_equal(w.tensors[name], w.tensors[name])
    assert not np.array_equal(w.tensors[name], random_weights(base).tensors[name]), "another draw than the default"

    for recipe_name, experts, billions, active in (("qwen3-30b-a3b-shape", 128, 30.5, 3.35),
                                                   ("olmoe-1b-7b-shape", 64, 6.9, 1.28)):
        big = random_weights(get_recipe(recipe_name))
        shapes = expected_shapes(big.config)
        total = sum(int(np.prod(s)) for s in shapes.values())
        top = big.config.num_experts_per_tok
        inactive = sum(int(np.prod(s)) for n, s in shapes.items() if ".mlp.experts." in n) * (experts - top) // experts
        assert big.config.num_experts == experts and top == 8, recipe_name
        assert round(total / 1e9, 1) == billions and round((total - inactive) / 1e9, 2) == active, recipe_name
        assert big.extra["fidelity_skipped"] == NO_FIDELITY
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (2048,), "OLMoE's q norm is over the whole projection"


def test_row_chunks_quantize_and_pack_the_same(monkeypatch):
    w = np.random.default_rng(0).standard_normal((20000, 64), dtype=np.float32)
    for bits, symmetric in ((4, False), (8, True)):
        quantizer = RTNQuantizer(bits, 32, symmetric)
        whole = quantizer.quantize(w)
        monkeypatch.setattr(quant_grid, "CHUNK_ABOVE", 1000)
        monkeypatch.setattr(quant_grid, "CHUNK_ELEMS", 64 * 3001)     # uneven chunks, the last one short
        chunked = quant_grid.quantize_by_rows(quantizer.quantize, w)
        monkeypatch.undo()
        assert np.array_equal(whole.data, chunked.data) and np.array_equal(whole.scales, chunked.scales)
        assert (whole.offsets is None) == (chunked.offsets is None)
        assert np.isclose(whole.max_rel, chunked.max_rel) and np.isclose(whole.rms_rel, chunked.rms_rel)
        a, b = _pack(whole), pack(chunked)                             # 20000 rows: packed 8192 at a time
        for x, y in ((a.codes, b.codes), (a.scales, b.scales), (a.offsets, b.offsets)):
            assert (x is None and y is None) or np.array_equal(x, y)


def test_shape_dir_loads_lazily_with_per_tensor_fixups(tmp_path):
    cfg = ModelConfig(**get_recipe("llama-tiny-random").architecture, bos_token_id=None, eos_token_ids=(0,))
    write_shape_dir(cfg, 7, tmp_path / "shape", log=lambda *_: None)
    w = load_hf_dir(tmp_path / "shape", digest="random-dir:test")
    assert isinstance(w.tensors, LazyTensors) and w.source_sha256 == "random-dir:test"
    shapes = expected_shapes(cfg)
    assert {n: w.tensors.shape(n) for n in w.tensors} == shapes
    emb = w.tensors["model.embed_tokens.weight"]
    assert emb.dtype == np.float32 and abs(float(emb.std()) - 1.0) < 0.05       # N(0, 1), fp16 on disk

    # Phi-3's fused split on lazy tensors gives the rows the eager split gives
    fused = {"model.layers.0.self_attn.qkv_proj.weight": np.concatenate(
        [w.tensors[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])}
    lazy = LazyTensors()
    lazy.add("model.layers.0.self_attn.qkv_proj.weight", fused["model.layers.0.self_attn.qkv_proj.weight"].shape,
             lambda: fused["model.layers.0.self_attn.qkv_proj.weight"])
    eager = dict(fused)
    split_fused(cfg, lazy)
    split_fused(cfg, eager)
    assert list(lazy) == list(eager)
    for name in eager:
        assert lazy.shape(name) == eager[name].shape and np.array_equal(lazy[name], eager[name])


def test_gpt_oss_20b_shape_is_gpt_oss_20b_with_its_experts_in_mxfp4(monkeypatch):
    """gpt-oss-20b-shape's config is what config.json gives gpt-oss-20b (transformers' GptOssConfig at 24 layers and
    32 experts, read by families.hf_config; its eos aside, the random sources' own), with its parameter counts:
    20.9B in all, 19.12B of them the experts'. Active per token, 4.19B as the other shapes count it (everything but
    the experts not routed to); OpenAI's 3.61B is that without the input embedding table (579M, a lookup: its
    count leaves it out, keeps the unembedding). The experts come as the hub's MXFP4 tensors, each expert
    projection with its MXFP4 grid, and nothing is drawn to set the loaders up."""
    import dataclasses

    import transformers

    from ortllm.pipeline import sources
    from ortllm.pipeline.families import hf_config

    drawn = []
    real = sources._random_tensor
    monkeypatch.setattr(sources, "_random_tensor", lambda rng, name, shape: drawn.append(name) or real(rng, name,
                                                                                                       shape))
    w = random_weights(get_recipe("gpt-oss-20b-shape"))
    assert drawn == [], "no tensor drawn before it is read"
    hf = transformers.GptOssConfig(num_hidden_layers=24, num_local_experts=32, swiglu_limit=7.0)
    assert dataclasses.replace(w.config, eos_token_ids=()) == hf_config(hf.to_dict())
    shapes = expected_shapes(w.config)
    total = sum(int(np.prod(s)) for s in shapes.values())
    experts = sum(int(np.prod(s)) for n, s in shapes.items() if ".mlp.experts." in n)
    active = total - experts * (32 - 4) // 32
    embedding = int(np.prod(shapes["model.embed_tokens.weight"]))
    assert (round(total / 1e9, 2), round(experts / 1e9, 2)) == (20.91, 19.12)
    assert (round(active / 1e9, 2), round((active - embedding) / 1e9, 2)) == (4.19, 3.61)
    assert {n: w.tensors.shape(n) for n in w.tensors} == shapes          # the hub's tensors fixed up to these
    mx = [n for n in shapes if ".mlp.experts." in n and n.endswith("_proj.weight")]
    assert len(mx) == 24 * 32 * 3 and w.extra["source_types"] == dict.fromkeys(mx, "MXFP4")
    assert set(w.extra["source_grids"]) == set(mx) and drawn == []
    assert w.extra["fidelity_skipped"] == NO_FIDELITY
