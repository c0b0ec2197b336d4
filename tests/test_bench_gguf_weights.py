"""bench/gguf_weights.py, the GGUF writer of a model's weights for llama.cpp (the MoE shape recipes' peers): tiny
mixture-of-experts models of every family ortllm reads from a GGUF (tests/reference/hf_families.MOE_FAMILIES,
transformers' own classes) written as Q4_0 / Q8_0 / F32 GGUFs and read back by ortllm's own GGUF source
(pipeline/sources.load_gguf): the config equal, every tensor equal to the source's after the file type's
quantization (gguf-py's dequantize); the Q6_K head against its error bound; and the writer's peak RSS on a reduced
Qwen3-30B-A3B shape of ~290 MB of fp32, measured in a child process. gpt-oss (llama.cpp's `gpt-oss` arch) from a
tiny hub-style MXFP4 checkpoint: the mxfp4 file's experts are the source's own codes and exponents in ggml's layout
(gguf-py's and ggml's own decoding), and llama.cpp runs the F32 and mxfp4 files as ortllm's fp32 engine does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from ortllm.bench.errors import BenchError
from ortllm.bench.gguf_weights import config_mismatch, q6_k_quantize, write_weights_gguf
from ortllm.pipeline.families import gguf_tensor_names
from ortllm.pipeline.sources import load_path
from tests.reference.hf_families import MOE_GGUF_ARCH, save_hf_dir, tiny_model

REPO = Path(__file__).resolve().parents[1]
# every expert / projection row a multiple of 32 (Q4_0 / Q8_0 blocks): experts of 64 (OLMoE's, Granite's and
# Mixtral's are intermediate_size), hidden 64 (so the head's Q6_K, rows of 256, falls back to Q8_0 as llama.cpp does)
WIDTHS = {"qwen3_moe": dict(moe_intermediate_size=64), "qwen2_moe": dict(moe_intermediate_size=64),
          "olmoe": dict(intermediate_size=64), "granitemoe": dict(intermediate_size=64),
          "granitemoeshared": dict(intermediate_size=64),
          "mixtral": dict(intermediate_size=64, sliding_window=None)}     # a window: test_refusals_...
# the writer's GGUF tensor type of each kind of tensor, per file type, on these models (the head: Q8_0, see WIDTHS)
EXPECTED_TYPES = {"q4_0": {"matrix": "Q4_0", "embd": "Q4_0", "head": "Q8_0"},
                  "q8_0": {"matrix": "Q8_0", "embd": "Q8_0", "head": "Q8_0"},
                  "f32": {"matrix": "F32", "embd": "F32", "head": "F32"}}


@pytest.fixture(scope="module", params=sorted(MOE_GGUF_ARCH))
def moe_hf(request, tmp_path_factory):
    name = request.param
    return name, load_path(save_hf_dir(tiny_model(name, **WIDTHS[name]), tmp_path_factory.mktemp(name) / "hf"))


def _kind(gname: str) -> str:
    if gname in ("token_embd.weight", "output.weight"):
        return {"token_embd.weight": "embd", "output.weight": "head"}[gname]
    return "matrix"


def _requantized(arr: np.ndarray, qtype: str) -> np.ndarray:
    """arr through the GGUF type qtype and back (gguf-py: the same rounding as ggml's reference quantizers)."""
    if qtype == "F32":
        return arr
    qt = gguf.GGMLQuantizationType[qtype]
    return gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(arr, np.float32), qt), qt).reshape(
        arr.shape)


@pytest.mark.parametrize("kind", ["q4_0", "q8_0", "f32"])
def test_a_moe_gguf_reads_back_as_its_source_quantized(moe_hf, kind, tmp_path):
    name, src = moe_hf
    out = tmp_path / f"{name}-{kind}.gguf"
    summary = write_weights_gguf(src, out, kind, log=None)
    assert out.is_file() and not out.with_name(out.name + ".tmp").exists()
    back = load_path(out)
    assert config_mismatch(src.config, back.config) == [], name
    assert back.config.num_experts == 8 and set(back.tensors) == set(src.tensors)

    reader = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    arch = reader.fields["general.architecture"].contents()
    assert arch == {"mixtral": "llama", "granitemoeshared": "granitemoe"}.get(name, name.replace("_", "")), arch
    layer0 = {n.split(".", 2)[2] for n in types if n.startswith("blk.0.")}
    sparse = next(i for i in range(src.config.num_layers) if src.config.sparse_layer(i))
    stacked = [t for t in reader.tensors if t.name.startswith(f"blk.{sparse}.ffn_") and t.name.endswith("_exps.weight")]
    assert sorted(t.name.split(".")[2] for t in stacked) == ["ffn_down_exps", "ffn_gate_exps", "ffn_up_exps"]
    for t in stacked:                                   # GGUF dims innermost first: [H, I, E] / [I, H, E]
        assert int(t.shape[-1]) == 8, (t.name, t.shape)
    assert types[f"blk.{sparse}.ffn_gate_inp.weight"] == "F32"       # the router: as llama.cpp keeps it
    for gname, qtype in types.items():
        if gname.endswith("ffn_gate_inp.weight") or gname.endswith("ffn_gate_inp_shexp.weight"):
            continue
        dims = [int(n) for n in next(t for t in reader.tensors if t.name == gname).shape]    # innermost (K) first
        want = "F32" if len(dims) == 1 else EXPECTED_TYPES[kind][_kind(gname)]
        if want != "F32" and dims[0] % 32:
            want = "F16"        # a dense layer's down_proj, K = intermediate_size 176: no whole blocks of 32
        assert qtype == want, (gname, qtype, want)
    assert sum(summary["tensors"].values()) == len(types) and summary["bytes"] == out.stat().st_size
    assert layer0 >= {"attn_q.weight", "attn_k.weight", "attn_norm.weight"}

    # every tensor as the reader gives it (un-permuted, experts split) equals the source's after the file's type;
    # the GGUF type a tensor went through is the one of the file tensor it lives in
    to_gguf = {h: g for g, h in gguf_tensor_names(back.config).items()}
    for hname in src.tensors:
        parts = hname.split(".")        # an expert's model.layers.N.mlp.experts.E.gate_proj.weight: its stack's name
        qtype = types[to_gguf[hname if hname in to_gguf else ".".join(parts[:5] + parts[6:7])]]
        want = _requantized(src.tensors[hname], qtype)
        assert np.array_equal(back.tensors[hname], want), (name, kind, hname, qtype)


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "llama3", "granite"])
def test_dense_families_round_trip_exactly(name, tmp_path):
    """The dense families ortllm reads from a GGUF too, as F32: the same config and bit-equal tensors (Llama 3's q/k
    rows permuted and back, its RoPE scaling as rope_freqs, its tied head left out; Granite's multipliers)."""
    src = load_path(save_hf_dir(tiny_model(name), tmp_path / "hf"))
    write_weights_gguf(src, tmp_path / "m.gguf", "f32", log=None)
    back = load_path(tmp_path / "m.gguf")
    assert config_mismatch(src.config, back.config) == []
    assert set(back.tensors) == set(src.tensors)
    assert all(np.array_equal(back.tensors[n], src.tensors[n]) for n in src.tensors)


def test_q6_k_is_ggmls_grid_within_its_error_bound():
    """The head's Q6_K (q6_k_quantize, a port of ggml's quantize_row_q6_K_ref): gguf-py's dequantize reads it back
    with each value the codes -32..31 reach within half a step of its group's scale (d * scale / 2; the int8 group
    scales round, so a few of a group's largest values clip, as in ggml), the rms error at 6 bits' size (~1/4 of
    Q8_0's); a zero row stays zero. test_q6_k_is_ggmls_own compares the bytes with ggml's."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 512)).astype(np.float32) * np.linspace(0.1, 3, 512, dtype=np.float32)
    x[3] = 0
    q = q6_k_quantize(x)
    assert q.dtype == np.uint8 and q.shape == (6, 2 * 210)
    y = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q6_K).reshape(x.shape)
    assert np.array_equal(y[3], x[3])
    blocks = q.reshape(-1, 210)
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)            # [nb, 1]
    sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)               # [nb, 16]
    step = np.repeat(np.abs(d * sc), 16, axis=1).reshape(x.shape)
    inside = np.abs(x) <= 31 * step
    assert inside.mean() > 0.9 and (np.abs(y - x)[inside] <= step[inside] / 2 + 1e-6).all()
    q8 = gguf.GGMLQuantizationType.Q8_0
    rms = lambda a: float(np.sqrt(((a - x) ** 2).mean()))      # noqa: E731
    r8 = rms(gguf.quants.dequantize(gguf.quants.quantize(x, q8), q8).reshape(x.shape))
    assert 2 * r8 < rms(y) < 6 * r8, (rms(y), r8)


def test_refusals_say_what_cannot_be_written(tmp_path):
    from ortllm.bench.gguf_weights import load_weights

    with pytest.raises(BenchError, match="--type must be one of"):
        write_weights_gguf(load_weights("llama-tiny-random"), tmp_path / "x.gguf", "q5_k")
    with pytest.raises(BenchError, match="not a ModelConfig field"):
        load_weights("qwen3-30b-a3b-shape", {"num_expertz": 4})
    gpt = load_path(save_hf_dir(tiny_model("gpt_oss", swiglu_limit=5.0), tmp_path / "gpt-oss"))
    with pytest.raises(BenchError, match=r"would not carry its config \(swiglu_limit: model 5.0, GGUF 7.0"):
        write_weights_gguf(gpt, tmp_path / "g.gguf", "mxfp4")        # llama.cpp's gpt-oss clamps at 7
    phi3 = load_path(save_hf_dir(tiny_model("phi3"), tmp_path / "phi3"))
    with pytest.raises(BenchError, match="its GGUF fix-up split_fused has no inverse"):
        write_weights_gguf(phi3, tmp_path / "p.gguf", "q8_0")
    windowed = load_path(save_hf_dir(tiny_model("mixtral"), tmp_path / "mixtral"))     # llama's keys have no window
    with pytest.raises(BenchError, match=r"would not carry its config \(sliding_window: model 40, GGUF None"):
        write_weights_gguf(windowed, tmp_path / "m.gguf", "q8_0")
    assert not list(tmp_path.glob("*.gguf*")), "refused before a file is made"


# a reduced Qwen3-30B-A3B shape (its recipe's seeded per-tensor draws): 73M parameters, 293 MB of fp32
SMALL = dict(vocab_size=8192, hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=4, head_dim=64,
             num_experts=16, num_experts_per_tok=4, moe_intermediate_size=512)
CHILD = r"""
import json, sys
from ortllm.bench.gguf_weights import load_weights, write_weights_gguf
from ortllm.bench.memory import status_bytes
out = __import__("pathlib").Path(sys.argv[1])
tiny = {"vocab_size": 512, "hidden_size": 256, "num_layers": 1, "num_experts": 2, "num_experts_per_tok": 1,
        "moe_intermediate_size": 64}
write_weights_gguf(load_weights("qwen3-30b-a3b-shape", tiny), out, "q4_0", log=None)   # every import made
w = load_weights("qwen3-30b-a3b-shape", json.loads(sys.argv[2]))
base = status_bytes("VmRSS")
s = write_weights_gguf(w, out, "q4_0", log=None)
print(json.dumps(s | {"base": base, "peak": status_bytes("VmHWM")}))
"""


def test_the_writer_holds_a_tensor_not_the_model(tmp_path):
    """Peak RSS of the write, over the process's RSS before it: under 2.5x the largest tensor's fp32 (the embedding
    and head, 64 MiB here: drawn whole by the shape recipe) plus its Q4_0 bytes, i.e. well under the model's fp32
    (466 MB); the file is llama.cpp's Q4_0 size."""
    out = tmp_path / "small-q4_0.gguf"
    run = subprocess.run([sys.executable, "-c", CHILD, str(out), json.dumps(SMALL)], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    s = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(s), file=sys.stderr)
    largest = SMALL["vocab_size"] * SMALL["hidden_size"] * 4
    params = 2 * SMALL["vocab_size"] * SMALL["hidden_size"] + SMALL["num_layers"] * (
        SMALL["num_experts"] * 3 * SMALL["moe_intermediate_size"] * SMALL["hidden_size"]
        + 2 * SMALL["hidden_size"] * SMALL["num_heads"] * SMALL["head_dim"]
        + 2 * SMALL["hidden_size"] * SMALL["num_kv_heads"] * SMALL["head_dim"])
    grown = s["peak"] - s["base"]
    assert grown < 2.5 * largest, (grown, largest)
    assert grown < 0.3 * params * 4, (grown, params * 4)
    assert s["tensors"]["Q4_0"] == 1 + SMALL["num_layers"] * 7 and s["tensors"]["Q6_K"] == 1
    assert 0.55 * params < s["bytes"] < 0.62 * params        # 4.5 bits a weight, the head's 6.56


# families llama.cpp runs from these files: its qwen3moe and qwen2moe have every layer sparse (no dense layer among
# them), Mixtral is llama with experts (q/k rows permuted to llama.cpp's rope pairs); the quantized file types each
# is checked in (Q4_0 for qwen3moe, the 30B shape's arch, whose HF names are ortllm's: see _clear_routes)
LLAMA_CPP_FAMILIES = {"qwen3_moe": (dict(mlp_only_layers=[]), ("q8_0", "q4_0")),
                      "qwen2_moe": (dict(decoder_sparse_step=1), ("q8_0",)), "mixtral": ({}, ("q8_0",)),
                      "olmoe": (dict(num_key_value_heads=4), ("q8_0",))}     # llama.cpp's olmoe: k_norm [heads * D]
ROUTE_MARGIN = 1e-3             # the top-k margin of every token's route, on the source weights
QUANTIZED_ROUTE_MARGIN = 2e-3   # ... on a Q4_0 file's own dequantized weights, where llama.cpp's Q8_0 activations
                                # must not flip a route either (below 5e-4 one did: max |diff| 1.4 at 2 of 32 tokens)

FIRST_SEED = {"qwen3_moe": 27}  # where _clear_routes' search starts: the first seed that keeps both margins (seeds
                                # 0-26 fail the Q4_0 one; starting here saves ~30 s of search; the margins are checked)


def _clear_routes(name: str, ids: list[int], kinds, tmp_path: Path):
    """The first seed's transformers model whose routes over ids keep ROUTE_MARGIN, and QUANTIZED_ROUTE_MARGIN with
    the weights of its Q4_0 GGUF (when Q4_0 is among kinds) loaded into it."""
    import torch

    from tests.pipeline.test_moe_families import router_margin

    first = FIRST_SEED.get(name, 0)
    for seed in range(first, first + 30):
        model = tiny_model(name, seed=seed, **WIDTHS[name], **LLAMA_CPP_FAMILIES[name][0])
        if router_margin(model, ids) < ROUTE_MARGIN:
            continue
        if "q4_0" not in kinds:
            return model
        write_weights_gguf(load_path(save_hf_dir(model, tmp_path / "probe")), tmp_path / "probe.gguf", "q4_0",
                           log=None)
        q4 = tiny_model(name, seed=seed, **WIDTHS[name], **LLAMA_CPP_FAMILIES[name][0])
        back = load_path(tmp_path / "probe.gguf").tensors
        q4.load_state_dict({n: torch.from_numpy(np.array(back[n])) for n in back}, strict=True)
        if router_margin(q4, ids) >= QUANTIZED_ROUTE_MARGIN:
            return model
    raise AssertionError(f"{name}: no seed in {first}..{first + 29} keeps the routes' top-k margins")


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_FAMILIES))
def test_llama_cpp_runs_the_gguf_as_ortllm_does(name, tmp_path):
    """llama.cpp loads the writer's F32 and quantized GGUFs of a tiny MoE model, and its logits at 32 positions match
    ortllm's fp32 engine built from the same file (so on the same dequantized weights) by gguf_check.py's gates:
    F32 max |diff| <= 1e-4 x max |logit|, Q8_0 / Q4_0 corr >= 0.999 (llama.cpp rounds the activations to Q8_0)."""
    from ortllm.cli.build import build_artifact
    from ortllm.pipeline.build import BuildOptions
    from tests.pipeline.test_moe_families import _logits, _prompt
    from tests.test_bench import _peer_script, _peers_python_with

    run = _peer_script(_peers_python_with("llama_cpp", "gguf"))
    ids = _prompt(32, seed=2)
    kinds = ("f32", *LLAMA_CPP_FAMILIES[name][1])
    src = load_path(save_hf_dir(_clear_routes(name, ids, kinds, tmp_path), tmp_path / "hf"))
    results = {}
    for kind in kinds:
        out = tmp_path / f"{kind}.gguf"
        write_weights_gguf(src, out, kind, log=None)
        art = tmp_path / f"art-{kind}"
        build_artifact(str(out), art, BuildOptions(), log=lambda m: None)
        np.savez(tmp_path / f"{kind}.npz", ids=np.asarray(ids), logits=_logits(art, ids))
        line = run("gguf_check.py", tmp_path / f"{kind}.npz", out, "--threads", "1").stdout.strip().splitlines()[-1]
        results[kind] = json.loads(line)[0]
    print(json.dumps(results, indent=1), file=sys.stderr)
    assert results["f32"]["matrix_types"] == ["F32"] and results["f32"]["ok"], results["f32"]
    assert results["f32"]["vs_reference"]["top1_agreement"] == 1.0
    for kind in kinds[1:]:
        assert kind.upper() in results[kind]["matrix_types"] and results[kind]["ok"], results[kind]


GGML_QUANTIZE = r"""
import ctypes, pathlib, sys
import numpy as np
import llama_cpp
lib = next(pathlib.Path(llama_cpp.__file__).parent.glob("lib/libggml-base.so*"))
ggml = ctypes.CDLL(str(lib))
ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_int64, ctypes.c_void_p]
x = np.load(sys.argv[1])
for name, kind in (("q6_k", 14), ("q4_0", 2), ("q8_0", 8), ("mxfp4", 39)):
    out = np.zeros(x.size * 2, np.uint8)
    n = ggml.ggml_quantize_chunk(kind, x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
    np.save(sys.argv[2] + f"-{name}.npy", out[:n])
"""


def test_the_quantizers_give_ggmls_own_bytes(tmp_path):
    """Q6_K (q6_k_quantize), and gguf-py's Q4_0, Q8_0 and MXFP4 the writer uses, byte for byte against ggml's own
    ggml_quantize_chunk (libggml-base of the llama-cpp-python in .venv-peers), on rows with a zero block and a
    spread of magnitudes; Q6_K's scale search accumulates in another order than ggml's loop, so a group whose
    candidates tie within float rounding may keep another scale: at most 0.5% of its bytes differ."""
    from tests.test_bench import _peers_python_with

    python = _peers_python_with("llama_cpp")
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 1024)) * np.exp(rng.standard_normal((64, 1)))).astype(np.float32)
    x[5, :256] = 0
    np.save(tmp_path / "x.npy", x)
    p = subprocess.run([str(python), "-c", GGML_QUANTIZE, str(tmp_path / "x.npy"), str(tmp_path / "ggml")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    for name, qt in (("q4_0", gguf.GGMLQuantizationType.Q4_0), ("q8_0", gguf.GGMLQuantizationType.Q8_0),
                     ("mxfp4", gguf.GGMLQuantizationType.MXFP4)):
        assert np.array_equal(np.load(tmp_path / f"ggml-{name}.npy"), gguf.quants.quantize(x, qt).reshape(-1)), name
    theirs, mine = np.load(tmp_path / "ggml-q6_k.npy"), q6_k_quantize(x).reshape(-1)
    assert theirs.size == mine.size
    assert (theirs != mine).mean() <= 0.005, (theirs != mine).mean()


def test_ortllm_bench_writes_a_recipes_peer_ggufs(tmp_path):
    """`ortllm bench --peers-model RECIPE --write-gguf q4_0,q8_0` (make bench-moe-gguf's command): the files in the
    recipe's peer assets (ORTLLM_PEERS_ASSETS here), a JSON summary line each; a second run keeps them; the
    refusals say what to give."""
    from tests.cli_run import ortllm
    from tests.test_cli import assert_user_error

    env = {"ORTLLM_PEERS_ASSETS": str(tmp_path)}
    p = ortllm("bench", "--peers-model", "llama-tiny-random", "--write-gguf", "q4_0,q8_0", env=env)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.strip().splitlines()]
    assert [x["type"] for x in lines] == ["q4_0", "q8_0"] and all(x["peak_rss_bytes"] > 0 for x in lines)
    for kind in ("q4_0", "q8_0"):
        assert config_mismatch(load_path(tmp_path / f"model-{kind}.gguf").config,
                               load_path(tmp_path / "model-q8_0.gguf").config) == []
    again = ortllm("bench", "--peers-model", "llama-tiny-random", "--write-gguf", "q4_0", env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["kept"] is True
    assert_user_error(ortllm("bench", "--write-gguf", "q4_0", env=env), "--write-gguf needs --peers-model")
    assert_user_error(ortllm("bench", "--peers-model", "llama-tiny-random", "--write-gguf", "q5_k", env=env),
                      "--write-gguf takes types among")


# ---------------------------------------------------------------- gpt-oss, its experts in MXFP4

# llama.cpp's gpt-oss floors / ceils YaRN's correction range (truncate true): the tiny model's RoPE is so, so that
# transformers, ortllm and llama.cpp compute the same rotation (truncate false is written too: test_gpt_oss_notes...)
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True,
                "original_max_position_embeddings": 32}
# the top-k gap of every token's router logits over the prompt, on the source's weights and on the mxfp4 file's (its
# Q8_0 attention): llama.cpp's Q8_0 activations move this model's router logits by ~1e-2 and must not flip a route
# (at a gap of 1.3e-2 one did: max |diff| 2.7 at 1 of 32 tokens; on the shape recipe's 2-layer cut 1.6)
GPT_OSS_ROUTE_MARGIN = 5e-2
GPT_OSS_PROMPT = (16, 3)        # tokens (twice the window), prompt seed
GPT_OSS_FIRST_SEED = 20         # where the fixture's search starts: no seed in 0..19 keeps the margin over this prompt
                                # (starting here saves ~15 s; the margins are checked)


def _hub_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 experts [E, K, N] (transformers' x @ W) -> the hub's MXFP4: code bytes [E, N, K / 32, 16] (element 2i in
    the low nibble, 2i + 1 in the high) and e8m0 exponents [E, N, K / 32]: a block's exponent floor(log2 max|x|) - 2
    (its largest value within e2m1's 6), each code the nearest e2m1 value; every third +0 code is written -0 (code
    8), which must cross as it is."""
    from ortllm.pipeline.families import E2M1

    e_, k, n = w.shape
    x = np.ascontiguousarray(np.swapaxes(w, 1, 2)).reshape(e_, n, k // 32, 32)
    amax = np.abs(x).max(-1)
    exp = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-30))) - 2, -127).astype(np.int32)
    codes = np.abs(x[..., None] / np.ldexp(np.float32(1), exp)[..., None, None] - E2M1).argmin(-1).astype(np.uint8)
    zeros = np.flatnonzero(codes == 0)
    codes.reshape(-1)[zeros[::3]] = 8
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exp + 127).astype(np.uint8)


def _gpt_oss_dirs(seed: int, root: Path):
    """(transformers model holding the MXFP4 experts' exact values, its hub-style MXFP4 directory root / "mxfp4",
    the hub tensors): transformers' tiny gpt-oss (3 layers sliding / full / sliding, a window of 8, 8 experts top-2,
    biases, non-zero sinks, YaRN, hidden and expert width 64) with each layer's experts through _hub_mxfp4."""
    import json as json_

    import torch
    from safetensors.numpy import load_file, save_file

    from ortllm.pipeline.families import mxfp4_dequantize

    model = tiny_model("gpt_oss", seed=seed, intermediate_size=64, rope_scaling=GPT_OSS_YARN)
    hf_dir = save_hf_dir(model, root / "mxfp4")
    tensors = load_file(str(hf_dir / "model.safetensors"))
    params = dict(model.named_parameters())
    for i in range(model.config.num_hidden_layers):
        for proj in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{i}.mlp.experts.{proj}"
            blocks, scales = _hub_mxfp4(tensors.pop(name))
            tensors |= {f"{name}_blocks": blocks, f"{name}_scales": scales}
            with torch.no_grad():
                params[name].copy_(torch.from_numpy(mxfp4_dequantize(blocks, scales)))
    save_file(tensors, str(hf_dir / "model.safetensors"))
    cfg = json_.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json_.dumps(cfg | {"quantization_config": {"quant_method": "mxfp4"}}))
    return model, hf_dir, tensors


def _with_gguf_weights(model, gguf_path: Path):
    """A copy of the transformers model with the GGUF's matrices read back by ortllm where they are not bit-equal
    to the model's (the mxfp4 file's Q8_0 attention, embedding and head; its experts and every F32 tensor are)."""
    import copy

    import torch

    back = load_path(gguf_path).tensors
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if name in back and p.dim() == 2 and ".mlp." not in name:
                p.copy_(torch.from_numpy(np.array(back[name])))
    return out


@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory):
    """(transformers model, MXFP4 hub directory, hub tensors, its mxfp4 GGUF, prompt) of the first seed whose routes
    over the prompt keep GPT_OSS_ROUTE_MARGIN on the source's weights and on the mxfp4 file's."""
    from tests.pipeline.test_gpt_oss import router_margin
    from tests.pipeline.test_moe_families import _prompt

    ids = _prompt(GPT_OSS_PROMPT[0], seed=GPT_OSS_PROMPT[1])
    first = GPT_OSS_FIRST_SEED
    for seed in range(first, first + 30):
        root = tmp_path_factory.mktemp(f"gpt_oss_{seed}")
        model, hf_dir, hub = _gpt_oss_dirs(seed, root)
        if router_margin(model, ids) < GPT_OSS_ROUTE_MARGIN:
            continue
        out = root / "mxfp4.gguf"
        write_weights_gguf(load_path(hf_dir), out, "mxfp4", log=None)
        if router_margin(_with_gguf_weights(model, out), ids) >= GPT_OSS_ROUTE_MARGIN:
            return model, hf_dir, hub, out, ids
    raise AssertionError(f"gpt-oss: no seed in {first}..{first + 29} keeps the routes' top-k margin "
                         f"{GPT_OSS_ROUTE_MARGIN}")


def _ggml_mxfp4(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's block_mxfp4 bytes [..., 17] -> (codes [..., 32] in element order, e8m0 exponents [...]), read as
    ggml-common.h lays a block out: the exponent byte, then qs[16] with element j in the low nibble, j + 16 in the
    high."""
    qs = raw[..., 1:]
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1), raw[..., 0]


def test_gpt_oss_mxfp4_experts_are_the_sources_codes(gpt_oss_mxfp4, tmp_path):
    """The mxfp4 GGUF of an MXFP4 gpt-oss checkpoint: llama.cpp's MXFP4_MOE mix (experts MXFP4, the other matrices
    Q8_0, the router, biases, norms and sinks F32) and llama.cpp's gpt-oss names; every stacked expert tensor holds
    the source's own codes and exponents (-0 codes included) as ggml lays them out, gate and up the even and odd rows
    of the hub's gate|up; gguf-py's MXFP4 dequantize of them equals mxfp4_dequantize's values exactly, and ortllm's
    reader gives back every tensor of the source (the Q8_0 ones after their rounding) and its config. A bf16
    checkpoint's experts, which have no MXFP4 codes, go through gguf-py's MXFP4 quantizer (ggml's reference
    rounding): the summary says which."""
    from ortllm.pipeline.families import mxfp4_dequantize

    model, hf_dir, hub, out, _ = gpt_oss_mxfp4
    src = load_path(hf_dir)
    summary = write_weights_gguf(src, tmp_path / "again.gguf", "mxfp4", log=None)
    c = model.config
    assert summary["mxfp4_experts"] == {"source_codes": 3 * 8 * 3, "quantized": 0} and "notes" not in summary
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.architecture"].contents() == "gpt-oss"
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_MXFP4_MOE
    assert reader.fields["gpt-oss.attention.sliding_window"].contents() == 8
    assert reader.fields["gpt-oss.rope.scaling.type"].contents() == "yarn"
    assert "gpt-oss.attention.sliding_window_pattern" not in reader.fields     # llama.cpp's default: even layers
    tensors = {t.name: t for t in reader.tensors}
    types = {n: t.tensor_type.name for n, t in tensors.items()}
    for n, q in types.items():
        want = ("MXFP4" if n.endswith("_exps.weight") else "F32" if n.endswith((".bias", "norm.weight", "sinks.weight",
                                                                                "ffn_gate_inp.weight")) else "Q8_0")
        assert q == want, (n, q, want)
    assert {n.split(".", 2)[2] for n in types if n.startswith("blk.1.")} == {
        "attn_norm.weight", "post_attention_norm.weight", "attn_sinks.weight", "ffn_gate_inp.weight",
        "ffn_gate_inp.bias", *(f"attn_{x}.{k}" for x in ("q", "k", "v", "output") for k in ("weight", "bias")),
        *(f"ffn_{x}_exps.{k}" for x in ("gate", "up", "down") for k in ("weight", "bias"))}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts"
        for gname, proj, rows in (("gate", "gate_up_proj", slice(0, None, 2)),
                                  ("up", "gate_up_proj", slice(1, None, 2)), ("down", "down_proj", slice(None))):
            t = tensors[f"blk.{i}.ffn_{gname}_exps.weight"]
            blocks, scales = hub[f"{p}.{proj}_blocks"][:, rows], hub[f"{p}.{proj}_scales"][:, rows]
            codes, exps = _ggml_mxfp4(np.asarray(t.data).reshape(*blocks.shape[:3], 17))
            hub_codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:3], 32)
            assert np.array_equal(codes, hub_codes) and np.array_equal(exps, scales), (i, gname)
            assert (codes == 8).any()
            values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(blocks.shape[0], blocks.shape[1], -1)
            assert np.array_equal(values, np.swapaxes(mxfp4_dequantize(blocks, scales), 1, 2)), (i, gname)
    back = load_path(out)
    assert config_mismatch(src.config, back.config) == []
    assert set(back.tensors) == set(src.tensors)
    for n in src.tensors:
        want = src.tensors[n] if ".mlp." in n or src.tensors[n].ndim == 1 else _requantized(src.tensors[n], "Q8_0")
        assert np.array_equal(back.tensors[n], want), n

    plain = tmp_path / "plain"        # the same model as a checkpoint of plain fp32 experts (no codes to keep)
    save_hf_dir(model, plain)
    quantized = write_weights_gguf(load_path(plain), tmp_path / "q.gguf", "mxfp4", log=None)
    assert quantized["mxfp4_experts"] == {"source_codes": 0, "quantized": 3 * 8 * 3}
    q = next(t for t in gguf.GGUFReader(str(tmp_path / "q.gguf")).tensors if t.name == "blk.0.ffn_down_exps.weight")
    down = np.ascontiguousarray(np.swapaxes(model.model.layers[0].mlp.experts.down_proj.detach().numpy(), 1, 2))
    assert np.array_equal(np.asarray(q.data).reshape(-1),
                          gguf.quants.quantize(down, gguf.GGMLQuantizationType.MXFP4).reshape(-1))


def test_an_int4_build_of_a_gpt_oss_gguf_keeps_its_mxfp4_codes(gpt_oss_mxfp4, tmp_path):
    """ortllm's reader gives each expert of a gpt-oss GGUF's MXFP4 ffn_*_exps its MXFP4 grid from the file's e8m0
    exponents, the same as the hub checkpoint's, so an int4 build of the GGUF keeps every expert's codes exactly in
    the MoE op's mxfp4 format (error 0, 4.5 bits a weight), as a build of the hub checkpoint does, instead of
    quantizing them a second time."""
    from tests.pipeline.test_gpt_oss import _expert_report
    from tests.pipeline.test_moe_families import _build

    model, hf_dir, _, out, _ = gpt_oss_mxfp4
    src, back = load_path(hf_dir), load_path(out)
    want, got = src.extra["source_grids"], back.extra["source_grids"]
    assert set(want) <= set(got) and len(want) == 3 * 8 * 3
    for n in want:
        assert back.extra["source_types"][n] == "MXFP4", n
        assert all(np.array_equal(a, b) for a, b in zip(got[n], want[n])), n
    art = _build(out, tmp_path / "int4", quant="int4", quality_tokens=16)
    for n, r in _expert_report(art, model.config).items():
        assert (r["algo"], r["max_rel"], r["bits_per_weight"], r.get("format")) == (
            "source codes (MXFP4)", 0, 4.5, "mxfp4"), (n, r)


GGML_TO_FLOAT = r"""
import ctypes, pathlib, sys
import gguf
import numpy as np
import llama_cpp


class Traits(ctypes.Structure):     # ggml.h's struct ggml_type_traits
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


lib = next(pathlib.Path(llama_cpp.__file__).parent.glob("lib/libggml-base.so*"))
ggml = ctypes.CDLL(str(lib))
ggml.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
    ggml.ggml_get_type_traits(39).contents.to_float)                    # GGML_TYPE_MXFP4
out = {}
for t in gguf.GGUFReader(sys.argv[1]).tensors:
    if t.tensor_type == gguf.GGMLQuantizationType.MXFP4:
        raw = np.ascontiguousarray(t.data).reshape(-1)
        y = np.empty(int(t.n_elements), np.float32)
        to_float(raw.ctypes.data, y.ctypes.data, y.size)
        out[t.name] = y.reshape([int(n) for n in reversed(t.shape)])
np.savez(sys.argv[2], **out)
"""


def test_ggml_reads_the_mxfp4_experts_as_the_source_is(gpt_oss_mxfp4, tmp_path):
    """ggml's own MXFP4 decoding (its to_float, libggml-base of the llama-cpp-python in .venv-peers) of every expert
    tensor of the mxfp4 file equals the source's exact values (mxfp4_dequantize of the hub's codes and exponents),
    gate and up the even and odd rows of gate|up: the layout llama.cpp computes with, checked without its
    activation rounding."""
    from ortllm.pipeline.families import mxfp4_dequantize
    from tests.test_bench import _peers_python_with

    python = _peers_python_with("llama_cpp", "gguf")
    model, _, hub, out, _ = gpt_oss_mxfp4
    p = subprocess.run([str(python), "-c", GGML_TO_FLOAT, str(out), str(tmp_path / "ggml.npz")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    got = np.load(tmp_path / "ggml.npz")
    assert len(got.files) == 3 * model.config.num_hidden_layers
    for i in range(model.config.num_hidden_layers):
        p_ = f"model.layers.{i}.mlp.experts"
        for gname, proj, rows in (("gate", "gate_up_proj", slice(0, None, 2)),
                                  ("up", "gate_up_proj", slice(1, None, 2)), ("down", "down_proj", slice(None))):
            want = np.swapaxes(mxfp4_dequantize(hub[f"{p_}.{proj}_blocks"], hub[f"{p_}.{proj}_scales"]), 1, 2)[:, rows]
            assert np.array_equal(got[f"blk.{i}.ffn_{gname}_exps.weight"], want), (i, gname)


def test_llama_cpp_runs_the_gpt_oss_gguf_as_ortllm_does(gpt_oss_mxfp4, tmp_path):
    """llama.cpp (the peers' venv) on the writer's gpt-oss GGUFs, logits at 16 positions (a window of 8, sinks,
    biases, YaRN, the clamped SwiGLU of 8 experts top-2, the clamp hit by 6% of the routed gate / up values): the F32
    file against ortllm's fp32 engine built from the file and against transformers on the source (bit-equal weights)
    within 1e-5 x max |logit| (measured 3.2e-6 and 3.9e-6 of 3.98: 8e-7 and 1e-6); the mxfp4 file (the source's
    MXFP4 codes, Q8_0 attention) against ortllm's fp32 engine built from that file, so on the same dequantized
    weights: the same top-1 everywhere and max |diff| <= 5e-2 x max |logit| (measured 0.10 of 3.97: 2.6e-2, corr
    0.99973).
    That bound is llama.cpp's activation rounding, not the weights (test_ggml_reads_the_mxfp4_experts_... checks
    ggml decodes them exactly): ggml-cpu rounds the activations of every Q8_0 and MXFP4 matmul to Q8_0 blocks (the
    vec_dot_type of both), which moves this small model's logits by 1-4% of their range (llama.cpp's q8_0 file of the
    same weights against the engine on its dequantized weights: 4.1% over 32 tokens; the F32 file with MXFP4
    experts alone: 4.2%), and the fixture's route margins keep that from flipping an expert."""
    from ortllm.cli.build import build_artifact
    from ortllm.pipeline.build import BuildOptions
    from tests.pipeline.test_moe_families import _logits
    from tests.reference.hf_families import hf_logits
    from tests.test_bench import _peers_python_with

    from tests.pipeline.test_gpt_oss import clamped_share

    python = _peers_python_with("llama_cpp", "gguf")
    model, hf_dir, _, mx, ids = gpt_oss_mxfp4
    assert clamped_share(model, ids) > 0.02
    f32 = tmp_path / "f32.gguf"
    write_weights_gguf(load_path(hf_dir), f32, "f32", log=None)
    refs = {"transformers": hf_logits(model, ids)}
    for kind, path in (("f32", f32), ("mxfp4", mx)):
        art = tmp_path / f"art-{kind}"
        build_artifact(str(path), art, BuildOptions(), log=lambda m: None)
        refs[kind] = _logits(art, ids)
    results = {}
    for ref, path in (("f32", f32), ("transformers", f32), ("mxfp4", mx)):
        np.savez(tmp_path / f"{ref}.npz", ids=np.asarray(ids), logits=refs[ref])
        p = subprocess.run([str(python), str(REPO / "bench" / "peers" / "gguf_check.py"), str(tmp_path / f"{ref}.npz"),
                            str(path), "--threads", "1"], capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        # its own gate (corr >= 0.999 for a quantized file) is not this test's: the exit status is not read
        lines = [x for x in p.stdout.strip().splitlines() if x.startswith("[")]
        assert lines, p.stderr[-3000:]
        results[f"{path.stem} vs {ref}"] = json.loads(lines[-1])[0]["vs_reference"]
    print(json.dumps(results, indent=1), file=sys.stderr)
    for name in ("f32 vs f32", "f32 vs transformers"):
        r = results[name]
        assert r["max_abs_diff"] <= 1e-5 * r["max_abs_ref"] and r["top1_agreement"] == 1.0, (name, r)
    r = results["mxfp4 vs mxfp4"]
    assert r["max_abs_diff"] <= 5e-2 * r["max_abs_ref"] and r["top1_agreement"] == 1.0, r


def test_the_20b_shapes_cut_writes_its_codes_with_a_note(tmp_path):
    """gpt-oss-20b-shape's random source cut to 2 layers of 4 experts (test_gpt_oss._shape_cut: its hub MXFP4 tensors,
    YaRN with truncate false as gpt-oss-20b's config): its mxfp4 file carries every expert's codes (none quantized)
    and reads back as llama.cpp runs it, truncate true, which the summary notes; every expert and 1-D tensor
    bit-equal. Its sliding layers moved off llama.cpp's default (the even ones) go as attention.sliding_window_pattern
    and read back so."""
    import dataclasses

    from ortllm.bench.gguf_weights import llama_cpp_view
    from ortllm.pipeline.sources import random_weights
    from tests.pipeline.test_gpt_oss import _shape_cut

    _, cut = _shape_cut()
    src = random_weights(cut)
    s = write_weights_gguf(src, tmp_path / "cut.gguf", "mxfp4", log=None)
    assert s["mxfp4_experts"] == {"source_codes": 2 * 4 * 3, "quantized": 0}, s
    assert len(s["notes"]) == 1 and "truncate=false runs as truncate=true" in s["notes"][0]
    back = load_path(tmp_path / "cut.gguf")
    want, _ = llama_cpp_view(src.config)
    assert config_mismatch(want, back.config) == [] and back.config.rope_scaling["truncate"] is True
    wrong = config_mismatch(src.config, back.config)        # only the truncation differs from the source's
    assert len(wrong) == 1 and wrong[0].startswith("rope_scaling:") and "'truncate': False" in wrong[0], wrong
    for n in src.tensors:
        if ".mlp." in n or src.tensors[n].ndim == 1:
            assert np.array_equal(back.tensors[n], src.tensors[n]), n

    flipped = random_weights(dataclasses.replace(cut, architecture={**cut.architecture,
                                                                    "layer_types": ["full", "sliding"]}))
    write_weights_gguf(flipped, tmp_path / "flipped.gguf", "f32", log=None)
    reader = gguf.GGUFReader(str(tmp_path / "flipped.gguf"))
    assert reader.fields["gpt-oss.attention.sliding_window_pattern"].contents() == [False, True]
    assert load_path(tmp_path / "flipped.gguf").config.layer_types == ("full", "sliding")
