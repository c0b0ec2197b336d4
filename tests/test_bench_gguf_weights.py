"""bench/gguf_weights.py, the GGUF writer of a model's weights for llama.cpp (the MoE shape recipes' peers): tiny
mixture-of-experts models of every family ortllm reads from a GGUF (tests/reference/hf_families.MOE_FAMILIES,
transformers' own classes) written as Q4_0 / Q8_0 / F32 GGUFs and read back by ortllm's own GGUF source
(pipeline/sources.load_gguf): the config equal, every tensor equal to the source's after the file type's
quantization (gguf-py's dequantize); the Q6_K head against its error bound; and the writer's peak RSS on a reduced
Qwen3-30B-A3B shape of ~290 MB of fp32, measured in a child process."""
from __future__ import annotations

import json
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
    gpt = load_path(save_hf_dir(tiny_model("gpt_oss"), tmp_path / "gpt-oss"))
    with pytest.raises(BenchError, match="no GGUF writer for family 'gpt_oss'"):
        write_weights_gguf(gpt, tmp_path / "g.gguf", "q8_0")
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
for name, kind in (("q6_k", 14), ("q4_0", 2), ("q8_0", 8)):
    out = np.zeros(x.size * 2, np.uint8)
    n = ggml.ggml_quantize_chunk(kind, x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
    np.save(sys.argv[2] + f"-{name}.npy", out[:n])
"""


def test_the_quantizers_give_ggmls_own_bytes(tmp_path):
    """Q6_K (q6_k_quantize), and gguf-py's Q4_0 and Q8_0 the writer uses, byte for byte against ggml's own
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
    for name, qt in (("q4_0", gguf.GGMLQuantizationType.Q4_0), ("q8_0", gguf.GGMLQuantizationType.Q8_0)):
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
