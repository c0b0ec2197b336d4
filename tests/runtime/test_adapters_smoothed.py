"""Adapters on SmoothQuant'ed artifacts (the default int8 build): the projections after a norm read x / s and multiply
W * s, so a LoRA on them must use diag(s) A (runtime/smoothing.py). Regression tests for the bug where the engine
used the adapter's A as trained: on the tiny model (s in 0.74..1.33) the LoRA effect's logprob error was 0.029 rms
on the smoothed build against 0.014 with --smooth 0; with the rescale 0.013."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ortllm.runtime import contract as C
from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.engine import Engine
from ortllm.runtime.errors import AdapterFileError
from ortllm.runtime.sampling_params import SamplingParams
from tests.artifact_copies import linked_copy, own_file
from tests.reference.peft_lora import make_peft_lora

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMOOTHED_TARGETS = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]


@pytest.fixture(scope="module")
def builds(tiny_build, tiny_weights, tmp_path_factory, adapted):
    """The tiny model as int8 engine artifacts, smoothed (the default: alpha 0.5) and with --smooth 0, each with a
    LoRA (r 8) and a DoRA (r 16) adapter on every projection; their PEFT models, and the folder of their PEFT dirs."""
    base = tmp_path_factory.mktemp("smoothed")
    models = {"lora": make_peft_lora(tiny_weights, base / "lora", seed=5, r=8, targets=ALL),
              "dora": make_peft_lora(tiny_weights, base / "dora", seed=6, r=16, targets=ALL, dora=True)}
    arts = {name: adapted(tiny_build(graph="engine", quant="int8", smooth=smooth), {a: base / a for a in models})
            for name, smooth in (("smoothed", None), ("plain", 0.0))}
    return arts, models, base


def _prompts():
    rng = np.random.default_rng(1)
    return [rng.integers(3, 512, n).tolist() for n in (40, 33, 57)]


def _peft_logprobs(model, p, adapter: bool) -> np.ndarray:
    """log p(p[t + 1] | p[:t + 1]) under PEFT's model, with or without its adapter."""
    import contextlib

    import torch
    with torch.no_grad(), (contextlib.nullcontext() if adapter else model.disable_adapter()):
        lp = torch.log_softmax(model(torch.tensor([p])).logits[0], -1).numpy()
    return lp[np.arange(len(p) - 1), p[1:]]


def _effect_error(art, adapter: str, model) -> tuple[float, float]:
    """(rms of the engine's adapter effect on the prompt tokens' logprobs minus PEFT's, rms of PEFT's effect)."""
    errs, effects = [], []
    with Engine.from_artifact(art, num_blocks=64) as engine:
        for p in _prompts():
            got = {}
            for a in (None, adapter):
                out = engine.generate([p], SamplingParams(max_tokens=1, prompt_logprobs=True, adapter=a))[0]
                got[a] = np.array([t.logprob for t in out.prompt_logprobs[1:]])
            ref = _peft_logprobs(model, p, True) - _peft_logprobs(model, p, False)
            errs.append(got[adapter] - got[None] - ref)
            effects.append(ref)
    rms = lambda v: float(np.sqrt(np.mean(np.concatenate(v) ** 2)))  # noqa: E731
    return rms(errs), rms(effects)


@pytest.mark.parametrize("adapter", ["lora", "dora"])
def test_adapter_effect_on_smoothed_build_equals_plain_builds(builds, adapter):
    """The adapter's effect on every prompt token's logprob through the engine, against PEFT's: on the smoothed int8
    build within 1.2x of the --smooth 0 build's error (int8 LoRA stacks and int8 compute: ~0.014 rms of an effect of
    ~0.24). Without the rescale the smoothed build's LoRA error was 2x the plain one's."""
    arts, models, _ = builds
    smoothed, effect = _effect_error(arts["smoothed"], adapter, models[adapter])
    plain, _ = _effect_error(arts["plain"], adapter, models[adapter])
    assert effect > 0.1, effect
    assert smoothed <= 1.2 * plain, (smoothed, plain)
    assert smoothed < 0.1 * effect, (smoothed, effect)


def test_smoothed_build_stores_its_rescales_and_slots_hold_them(builds):
    """The smoothed build's smoothing.safetensors gives each of q, k, v, gate, up an input scale (the norm's s: the
    same within a norm's group, not all 1), and the int8 slot stacks hold diag(s) A and B as the file holds them."""
    from safetensors.numpy import load_file

    from tests.reference.qlinear import LORA_CHUNK, lora_a, lora_b
    arts, _, _ = builds
    art = arts["smoothed"]
    scales = load_file(str(art / C.SMOOTHING))
    assert sorted(scales) == sorted(C.smoothing_name(i, t, "in") for i in range(2) for t in SMOOTHED_TARGETS)
    assert C.SMOOTHING not in json.loads((arts["plain"] / C.MANIFEST).read_text())["files"]
    for i in range(2):
        s_q, s_gate = scales[C.smoothing_name(i, "q_proj", "in")], scales[C.smoothing_name(i, "gate_proj", "in")]
        assert not np.allclose(s_q, 1.0) and not np.allclose(s_gate, 1.0)
        for t in ("k_proj", "v_proj"):
            np.testing.assert_array_equal(scales[C.smoothing_name(i, t, "in")], s_q)
        np.testing.assert_array_equal(scales[C.smoothing_name(i, "up_proj", "in")], s_gate)
    stored = load_file(str(art / "adapters" / "lora.safetensors"))
    with Engine.from_artifact(art, num_blocks=64) as engine:
        slots, failed = engine.adapters.activate(["lora"])
        assert not failed
        arrays = engine.runner._arrays
        for i in range(2):
            for t in ALL:
                a, b = stored[f"layers.{i}.{t}.a"], stored[f"layers.{i}.{t}.b"]
                s = scales.get(C.smoothing_name(i, t, "in"), np.ones(a.shape[0], np.float32))
                want = a * s[:, None]
                (k, r), n = a.shape, b.shape[1]
                arr = {w: arrays[C.lora_stack_name(t, w)][i, slots["lora"]] for w in ("a", "a_scale", "b", "b_scale")}
                qa, sa = lora_a(arr["a"], arr["a_scale"], k, r, r)
                step = np.repeat(sa, LORA_CHUNK, axis=0)[:k]
                assert (np.abs(qa * step - want) <= step / 2 * 1.001 + 1e-12).all(), (i, t)
                step_b = arr["b_scale"].astype(np.float64)
                assert (np.abs(lora_b(arr["b"], r, n) * step_b - b) <= step_b / 2 * 1.001 + 1e-12).all(), (i, t)


def test_lora_on_rescaled_projections_is_exact_in_fp32(tiny_weights):
    """runtime/smoothing.py's map, in float64 over pipeline/smooth.py's rescales (norm-side and --smooth-down): each
    layer's MLP and q, k, v with a LoRA on every projection compute the same on the smoothed weights with the mapped
    adapter as on the original ones with the adapter as trained; and the DoRA base weight comes back."""
    from ortllm.pipeline.smooth import adapter_scales, smooth_weights
    from ortllm.pipeline.weights import norm_names
    from ortllm.runtime.smoothing import Smoothing
    cfg = tiny_weights.config
    rng = np.random.default_rng(0)
    rms = {}

    def channel_rms(name):    # outlier channels, as after a real norm; one draw per input
        return rms.setdefault(name, rng.uniform(0.01, 30.0, tiny_weights.tensors[name].shape[1]))

    smoothed, report = smooth_weights(tiny_weights, 0.5, channel_rms, down_alpha=0.5)
    smoothing = Smoothing(adapter_scales(cfg, report))
    r, roles = 4, norm_names(cfg)
    h = rng.standard_normal((5, cfg.hidden_size))
    for i in range(cfg.num_layers):
        w = {t: f"model.layers.{i}.{'self_attn' if t in ALL[:4] else 'mlp'}.{t}.weight" for t in ALL}
        lora = {}
        for t in ALL:
            n_out, n_in = tiny_weights.tensors[w[t]].shape
            lora[f"layers.{i}.{t}.a"] = rng.standard_normal((n_in, r)).astype(np.float32)
            lora[f"layers.{i}.{t}.b"] = rng.standard_normal((r, n_out)).astype(np.float32)
        mapped = smoothing.to_artifact(lora)

        def proj(ws, ad, t, x):
            return x @ ws.tensors[w[t]].T.astype(np.float64) + x @ ad[f"layers.{i}.{t}.a"] @ ad[f"layers.{i}.{t}.b"]

        def norm(ws, role, x):
            g = ws.tensors[f"model.layers.{i}.{roles[role]}.weight"].astype(np.float64)
            return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_norm_eps) * g

        def layer(ws, ad):
            x = norm(ws, "attn_in", h)
            qkv = [proj(ws, ad, t, x) for t in ("q_proj", "k_proj", "v_proj")]
            x = norm(ws, "mlp_in", h)
            a = proj(ws, ad, "gate_proj", x) * proj(ws, ad, "up_proj", x)     # the rescale is linear in the gate
            return [*qkv, proj(ws, ad, "down_proj", a)]

        for want, got in zip(layer(tiny_weights, lora), layer(smoothed, mapped)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
        for t in ALL:
            back = smoothing.model_weight(smoothed.tensors[w[t]].astype(np.float64), i, t)
            np.testing.assert_allclose(back, tiny_weights.tensors[w[t]], rtol=1e-5, atol=1e-7)
        assert not np.allclose(mapped[f"layers.{i}.down_proj.a"], lora[f"layers.{i}.down_proj.a"])
        assert not np.allclose(mapped[f"layers.{i}.up_proj.b"], lora[f"layers.{i}.up_proj.b"])


def test_smoothed_artifact_without_its_rescales_is_refused(builds, tmp_path):
    """A smoothed artifact built before the rescales were stored: adapters are refused with what to do, at add time
    and when the engine would load one."""
    arts, _, peft_dirs = builds
    old = linked_copy(arts["smoothed"], tmp_path / "old")
    manifest = json.loads((old / C.MANIFEST).read_text())
    del manifest["files"][C.SMOOTHING]
    (old / C.SMOOTHING).unlink()
    own_file(old / C.MANIFEST).write_text(json.dumps(manifest))      # not through the link into the build
    with pytest.raises(AdapterFileError, match="does not hold smoothing.safetensors.*rebuild"):
        add_adapter(old, peft_dirs / "lora", "again")
    with Engine.from_artifact(old, num_blocks=64) as engine:
        out = engine.generate([_prompts()[0]], SamplingParams(max_tokens=2, adapter="lora"))[0]
    assert out.finish_reason == "error" and "rebuild" in out.error
