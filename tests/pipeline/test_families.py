"""Model families (Qwen2, Qwen3, Mistral, Llama 3, Phi-3, Gemma 3, Helium, Granite) against transformers, from small
random models made with transformers' own classes (tests/reference/hf_families.py) and read back by `ortllm build`
from their HF directories: fp32 portable and engine graphs (logits within 1e-3 x max|logit|, the same greedy
tokens), int8 engine builds served, a PEFT LoRA adapter through the engine, and the readers' errors.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from ortllm.cli.build import build_artifact
from ortllm.pipeline.build import BuildOptions
from ortllm.pipeline.errors import BuildError
from ortllm.runtime.artifact import load_artifact
from ortllm.runtime.engine import Engine
from ortllm.runtime.portable_model import PortableModel
from ortllm.runtime.sampling_params import SamplingParams
from tests.reference.hf_families import FAMILIES, GGUF_ARCH, hf_logits, save_hf_dir, tiny_model, write_gguf
from tests.reference.hf_llama import hf_greedy_logits

STEPS = 16
NAMES = sorted(FAMILIES)


def _assert_close(got: np.ndarray, ref: np.ndarray, what: str, rel: float = 1e-3) -> None:
    err, bound = np.abs(got - ref).max(), rel * np.abs(ref).max()
    assert err <= bound, f"{what}: max |dlogit| {err:.3g} > {bound:.3g} ({rel:g} x max|logit|)"


def _prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, n).tolist()


@pytest.fixture(scope="module")
def family(request, tmp_path_factory):
    """(name, transformers model, its HF directory)."""
    name = request.param
    model = tiny_model(name)
    return name, model, save_hf_dir(model, tmp_path_factory.mktemp(name) / "hf")


def _build(src, out, **opts):
    build_artifact(str(src), out, BuildOptions(**opts), log=lambda m: None)
    return out


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_portable_fp32_matches_transformers(family, tmp_path):
    """32 prompt tokens and 16 greedy steps (past Mistral's and Gemma's windows: the mask's window is checked)."""
    name, model, hf_dir = family
    prompt = _prompt(32)
    ref_tokens, ref_logits = hf_greedy_logits(model, prompt, STEPS)
    art = load_artifact(_build(hf_dir, tmp_path / "art", graph="portable"))
    assert art.model.arch == {"llama3": "llama"}.get(name, name)
    tokens, logits = PortableModel.from_artifact(art).greedy_logits(prompt, STEPS)
    _assert_close(logits, ref_logits, f"{name} portable vs transformers")
    assert tokens == ref_tokens


def _engine_check(name, model, art_dir, rel, min_top1):
    """Logits of every position of prompt + transformers' greedy continuation (one prefill through the engine
    graph), and the engine's own greedy tokens."""
    from ortllm.calibration.fidelity import EngineScorer
    prompt = _prompt(32, seed=1)                 # 48 positions: past Mistral's and Gemma's windows
    ref_tokens, _ = hf_greedy_logits(model, prompt, STEPS)
    ref = hf_logits(model, prompt + ref_tokens)
    got = np.concatenate(list(EngineScorer(load_artifact(art_dir), len(ref)).logits(prompt + ref_tokens)))
    _assert_close(got, ref, f"{name} engine vs transformers", rel)
    top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
    assert top1 >= min_top1, f"{name}: top-1 agreement {top1:.3f} < {min_top1}"
    with Engine.from_artifact(art_dir) as engine:
        out = engine.generate([prompt], SamplingParams(max_tokens=STEPS, temperature=0, ignore_eos=True))[0]
    return out.token_ids, ref_tokens


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_engine_fp32_matches_transformers(family, tmp_path):
    name, model, hf_dir = family
    tokens, ref_tokens = _engine_check(name, model, _build(hf_dir, tmp_path / "art"), 1e-3, 1.0)
    assert tokens == ref_tokens


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_engine_int8_is_served(family, tmp_path):
    """int8 builds (QLinear, SmoothQuant) through the engine: close to transformers' fp32 (random weights have
    close logits, so greedy tokens may part; the quality report measured in the build says by how much)."""
    name, model, hf_dir = family
    art = _build(hf_dir, tmp_path / "art", quant="int8", quality_tokens=64)
    quality = json.loads((art / "quality.json").read_text())
    assert quality["fidelity"]["top1_agreement"] >= 0.8, quality["fidelity"]
    tokens, _ = _engine_check(name, model, art, 0.05, 0.85)
    assert len(tokens) == STEPS


# PEFT's target names per family: Phi-3's transformers model fuses q|k|v and gate|up into one Linear each (the
# adapter import splits them, runtime/adapter_files.py)
LORA_TARGETS = {"phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}
# the random LoRA's size per family: the tiny random Llama 3 repeats one token, which half-size LoRA weights leave be;
# Granite's residual_multiplier scales every block's output, its LoRA's with it
LORA_SIZE = {"llama3": 2.0, "granite": 2.0}


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_lora_equals_peft(family, tmp_path):
    """A PEFT LoRA on every target of the family's transformers model, added to the engine artifact: the same
    greedy tokens as PEFT."""
    import torch
    from peft import LoraConfig, get_peft_model

    from ortllm.runtime.adapter_files import add_adapter
    name, model, hf_dir = family
    art = _build(hf_dir, tmp_path / "art")
    torch.manual_seed(5)
    targets = LORA_TARGETS.get(name, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, target_modules=targets,
                                                           init_lora_weights=False))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_" in n:
                p.mul_(LORA_SIZE.get(name, 0.5))
    peft.save_pretrained(tmp_path / "lora")
    add_adapter(art, tmp_path / "lora", "ad")
    prompt = _prompt(24, seed=2)
    ref_tokens, _ = hf_greedy_logits(peft.eval(), prompt, 12)
    base_tokens, _ = hf_greedy_logits(model, prompt, 12)
    assert ref_tokens != base_tokens, "the adapter should change the greedy tokens"
    with Engine.from_artifact(art) as engine:
        got = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                       adapter="ad"))[0].token_ids
    assert got == ref_tokens


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_hf_model_from_weights_is_the_source_model(family):
    """The way back (LoRA training, references): our loaded weights in the family's transformers model give the
    source model's logits (Phi-3's projections fused again, Gemma's norms as 1 + w)."""
    from ortllm.pipeline.hf_model import hf_model_from_weights
    from ortllm.pipeline.sources import load_path
    name, model, hf_dir = family
    ids = _prompt(40, seed=3)
    back = hf_model_from_weights(load_path(hf_dir))
    assert type(back) is type(model)
    _assert_close(hf_logits(back, ids), hf_logits(model, ids), "transformers of our weights vs the source", 1e-5)


@pytest.mark.parametrize("family", NAMES, indirect=True)
def test_hf_dir_of_our_weights_loads_as_the_source_model(family, tmp_path):
    """write_hf_dir (the peers' and optimum's input: ci/install_peers.sh, --exporter optimum): our loaded weights
    as a transformers directory that from_pretrained reads with the source model's logits: as LlamaForCausalLM where
    the model has only llama's features (Phi-3 unfused, Helium), else as the source's own class (Gemma 3, Qwen)."""
    from transformers import AutoModelForCausalLM

    from ortllm.pipeline.optimum_export import write_hf_dir
    from ortllm.pipeline.sources import load_path
    name, model, hf_dir = family
    write_hf_dir(load_path(hf_dir), tmp_path / "hf")
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype="float32").eval()
    assert type(back) is type(model) or (type(back).__name__ == "LlamaForCausalLM" and name in ("phi3", "helium"))
    ids = _prompt(40, seed=4)
    _assert_close(hf_logits(back, ids), hf_logits(model, ids), f"{name}: transformers on write_hf_dir's dir", 1e-5)


@pytest.mark.parametrize("family", sorted(GGUF_ARCH), indirect=True)
def test_gguf_round_trip_matches_transformers(family, tmp_path):
    """The model written as llama.cpp's converter writes a GGUF (gguf's tensor name map, llama's permuted q/k rows,
    Llama 3's rope_freqs, Phi-3's fused tensors), read back by `ortllm build`: transformers' logits. (36 positions:
    within Mistral's window, which llama.cpp's llama architecture does not carry.)"""
    name, model, _ = family
    gguf_path = write_gguf(model, name, tmp_path / f"{name}.gguf")
    art = load_artifact(_build(gguf_path, tmp_path / "art", graph="portable"))
    ids = _prompt(36, seed=4)
    logits, _ = PortableModel.from_artifact(art).forward(np.asarray([ids]), PortableModel.from_artifact(art)
                                                         .empty_past(), 0)
    _assert_close(logits[0], hf_logits(model, ids), f"{name} GGUF vs transformers")


def test_unknown_model_type_names_the_supported(tmp_path):
    from ortllm.pipeline.families import hf_config
    with pytest.raises(BuildError, match="model_type 'bert' is not supported; supported: gemma3_text, gpt_oss, "
                                         "granite, granitemoe, granitemoeshared, helium, llama"):
        hf_config({"model_type": "bert"})


def test_unknown_gguf_architecture_names_the_supported(tmp_path):
    import gguf
    from ortllm.pipeline.sources import load_path
    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(BuildError, match="GGUF architecture 'bert' is not supported; supported: gemma3, gpt-oss, "
                                         "granite, granitemoe, llama, olmoe, phi3"):
        load_path(path)
