"""A llama.cpp GGUF of a model's weights (any ortllm source: a recipe, a GGUF, an HF directory), written tensor by
tensor and quantized as it is written: no fp32 or F16 file of the model, and never the model in memory. The peer
`llama.cpp-q4_0` / `llama.cpp-q8_0` of a model too large for ci/install_peers.sh's fp32 hf/ directory (a 30B model's
is 120 GB) runs on it (`make bench-moe`):

  ortllm bench --peers-model qwen3-30b-a3b-shape --write-gguf q4_0,q8_0      (or f16, f32)
  ortllm bench --peers-model gpt-oss-20b-shape --write-gguf mxfp4             (the experts' MXFP4 codes as they are)

Runs in ortllm's venv (it reads the weights through pipeline/sources.load_model; gguf-py writes and quantizes);
`ortllm bench --peers-model RECIPE --write-gguf q4_0,q8_0` writes a recipe's into its peer assets (write_peer_ggufs).

Layout: the inverse of ortllm's GGUF reader. Names are pipeline/families.gguf_tensor_names inverted (llama.cpp's
names; a layer's experts stacked per projection, blk.N.ffn_{gate,up,down}_exps [E, ...], filled one expert at a
time), the family's GGUF fix-ups undone (llama's and Granite's q/k rows permuted back to llama.cpp's rope pairs), and
the `<arch>.*` keys written so that the reader's config is the model's: that is checked on a probe file of the keys
and tensor names before the first tensor is written, so a feature the keys cannot carry fails at once, not after a
30B write. The tokenizer is the one `ortllm build` writes (ModelWeights.write_tokenizer) as a gpt2-style token list
(bench/peers/gguf_export.py's, byte-level BPE only).

Tensor types (TYPES), as llama.cpp's own quantizer picks them for the file type: every matrix of a q4_0 file Q4_0
(the token embedding included), the head Q6_K (llama.cpp's `output.weight` rule; Q6_K here is a NumPy port of
ggml's reference quantizer, q6_k_quantize; Q8_0 where its rows are no multiple of 256, as llama.cpp falls back) and
a q8_0 file's all Q8_0; an mxfp4 file (llama.cpp's MXFP4_MOE) has the stacked experts MXFP4 and every other matrix
Q8_0; the routers (ffn_gate_inp, which llama.cpp never quantizes), the shared expert's gate, every bias (a
gpt-oss layer's stacked expert biases too) and every 1-D tensor (norms, sinks) F32. A matrix whose rows are no
multiple of its type's block of 32 goes F16. gguf-py's quantizers (gguf.quants, ggml's reference rounding) run on
row chunks of CHUNK_ELEMS values.

gpt-oss (llama.cpp's `gpt-oss` arch, as its convert_hf_to_gguf.py writes it): the experts and their biases stacked
per projection (gate|up de-interleaved: gate the even rows, up the odd ones, done by the source's fix-ups), the
MLP's input norm as post_attention_norm, blk.N.attn_sinks.weight, the keys of the window (sliding layers: the even
ones, else attention.sliding_window_pattern) and of YaRN. MXFP4 experts (an mxfp4 file of a source in MXFP4: a hub
checkpoint, the gpt-oss shape recipe) go across as their bytes: each block's e8m0 exponent and its 16 code bytes
with the nibbles moved from the hub's order (element 2i low, 2i + 1 high) to ggml's (element j low, j + 16 high),
never dequantized. llama.cpp floors and ceils YaRN's correction range (transformers' truncate true): a source with
truncate false (gpt-oss-20b's config) is written all the same, with a note in the summary, as llama.cpp's own
converter does; its clamped SwiGLU's limit is 7 and its YaRN betas 32 / 1 whatever the keys say, so a source with
others is refused.

Memory: the largest source tensor in fp32 (the embedding and head: vocab x hidden, 1.2 GB at Qwen3-30B-A3B's
shape; a shape recipe draws each tensor whole) plus the quantized bytes of the tensor being written (one stacked
expert tensor: 214 MB of Q8_0 at that shape). Measured on Qwen3-30B-A3B's shape cut to 2 layers of 32 experts (its
embedding and head whole; 962M parameters, 3.85 GB of fp32; load_weights' overrides num_layers=2, num_experts=32):
Q4_0 in 60 s of CPU, 1.60 GB peak RSS, 625 MB. An mxfp4 file of MXFP4 experts holds a layer's code and exponent
bytes while its experts are written (families.mxfp4_experts: ~0.4 GB at gpt-oss-20b's shape) and one stacked
tensor's MXFP4 bytes (141 MB there), never their fp32.
"""
from __future__ import annotations

import importlib.util
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from ortllm.pipeline.families import FAMILIES, GGUF_ARCHS, gguf_config, gguf_swa_layers, gguf_tensor_names, permute_qk
from ortllm.pipeline.families import split_experts, unpermute_qk, yarn_mscale
from ortllm.pipeline.weights import ModelConfig, ModelWeights, tensor_shape

from .errors import BenchError

PEERS = Path(__file__).resolve().parent / "peers"
CHUNK_ELEMS = 1 << 20            # values quantized at a time (4 MB of fp32; the quantizers make a few temporaries)
# family -> (general.architecture, the reader's family for it): the families ortllm reads from a GGUF, and the two
# llama.cpp converts to llama (Mistral; Mixtral: llama with experts)
WRITE_ARCHS = {family: (arch, family) for arch, family in GGUF_ARCHS.items()} | {
    "mistral": ("llama", "llama"), "mixtral": ("llama", "llama")}
# each GGUF fix-up of the reader -> what undoes it here (None: the writer's stacking of the experts undoes it)
UNDO = {unpermute_qk: permute_qk, split_experts: None}
# --type -> (matrices, token_embd, output): llama.cpp's choice for that file type
TYPES = {"q4_0": ("Q4_0", "Q4_0", "Q6_K"), "q8_0": ("Q8_0", "Q8_0", "Q8_0"), "f16": ("F16", "F16", "F16"),
         "f32": ("F32", "F32", "F32"), "mxfp4": ("Q8_0", "Q8_0", "Q8_0")}
# --type -> the stacked experts' type where it is not the matrices': llama.cpp's MXFP4_MOE (llama-quantize: every
# [E, ...] expert tensor MXFP4, the rest Q8_0; gpt-oss's GGUFs from its converter have that mix too). The experts'
# MXFP4 bytes are the source's own codes and exponents where it has them (mxfp4_ggml_blocks), else gguf-py's MXFP4
# quantizer (ggml's reference rounding, as llama-quantize's)
EXPERT_TYPES = {"mxfp4": "MXFP4"}
FILE_TYPES = {"q4_0": "MOSTLY_Q4_0", "q8_0": "MOSTLY_Q8_0", "f16": "MOSTLY_F16", "f32": "ALL_F32",
              "mxfp4": "MOSTLY_MXFP4_MOE"}
# a type, then what a matrix gets whose rows are no multiple of its block (llama.cpp: Q6_K's rows of 256 -> Q8_0)
FALLBACK = {"Q6_K": ("Q6_K", "Q8_0"), "Q4_0": ("Q4_0",), "Q8_0": ("Q8_0",), "F16": ("F16",), "F32": ("F32",),
            "MXFP4": ("MXFP4",)}
KEEP_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")     # routers: llama.cpp keeps them as given


def _gguf_export():
    """bench/peers/gguf_export.py by path (the peers' folder is not a package): its tokenizer and chat-template
    readers."""
    spec = importlib.util.spec_from_file_location("gguf_export", PEERS / "gguf_export.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Entry:
    """One GGUF tensor: its name, shape (NumPy order, outermost first), GGML type, and the source arrays that make
    it, in order along axis 0 (one for a plain tensor, one per expert for a stacked one; an MXFP4 expert's may be
    its bytes already)."""
    name: str
    shape: tuple[int, ...]
    qtype: str
    parts: Callable[[], Iterator[np.ndarray]]     # fp32 arrays, or (MXFP4) an expert's GGML bytes uint8 [rows, ...]
    source_codes: int = 0                         # MXFP4: how many parts are the source's own bytes


# ---------------------------------------------------------------- config -> keys

def _family(cfg: ModelConfig) -> str:
    """The model's family in pipeline/families.FAMILIES (a GGUF source's config names llama.cpp's arch)."""
    family = GGUF_ARCHS.get(cfg.arch, cfg.arch)
    if family not in WRITE_ARCHS:
        raise BenchError(f"no GGUF writer for family {cfg.arch!r}; supported: {', '.join(sorted(WRITE_ARCHS))}")
    return family


def write_keys(w, cfg: ModelConfig, arch: str, tokenizer_dir: Path | None, name: str) -> None:
    """The `<arch>.*` keys ortllm's reader (pipeline/families._gguf_*) and llama.cpp's loader read, and the
    tokenizer's."""
    import gguf

    w.add_name(name)
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    rs = cfg.rope_scaling or {}
    if rs.get("type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rs["factor"]))
    if arch == "gpt-oss":
        _gpt_oss_keys(w, cfg)
    if arch in ("granite", "granitemoe"):
        w.add_embedding_scale(float(cfg.embedding_scale))
        w.add_residual_scale(float(cfg.residual_multiplier))
        w.add_logit_scale(float(cfg.logits_scaling))
        if cfg.attention_scale is not None:
            w.add_attention_scale(float(cfg.attention_scale))
    if cfg.num_experts:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if arch != "gpt-oss":        # its router is top-k then softmax: llama.cpp's gpt-oss reads no such key
            w.add_expert_weights_norm(bool(cfg.norm_topk_prob))
        if cfg.shared_expert_intermediate_size:
            w.add_expert_shared_count(1)
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if tokenizer_dir is not None:
        ge = _gguf_export()
        tokens, types, merges, add_bos = ge._tokenizer(tokenizer_dir, cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(_tokenizer_pre(tokenizer_dir))
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_add_bos_token(add_bos)
        template = ge._chat_template(tokenizer_dir)
        if template:
            w.add_chat_template(template)
    if cfg.bos_token_id is not None:
        w.add_bos_token_id(int(cfg.bos_token_id))
    if cfg.eos_token_ids:
        w.add_eos_token_id(int(cfg.eos_token_ids[0]))


def _gpt_oss_keys(w, cfg: ModelConfig) -> None:
    """gpt-oss's window and YaRN keys as llama.cpp's converter writes them: attention.sliding_window (a key
    llama.cpp's gpt-oss requires) and, where the sliding layers are not llama.cpp's default (the even ones),
    attention.sliding_window_pattern, a bool a layer; rope.scaling yarn with its factor, original context length
    and betas (llama.cpp's gpt-oss reads no beta: 32 / 1, families.LLAMA_CPP_YARN), and rope.scaling.attn_factor
    where YaRN's attention factor is not the default 0.1 ln(factor) + 1 (llama.cpp multiplies the default by it)."""
    import gguf

    sliding = [t == "sliding" for t in cfg.layer_types]
    w.add_sliding_window(int(cfg.sliding_window or 0))
    if sliding != gguf_swa_layers(cfg.num_layers, None):
        w.add_sliding_window_pattern(sliding)
    rs = cfg.rope_scaling or {}
    if rs.get("type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rs["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rs["original_max_position_embeddings"]))
        w.add_rope_scaling_yarn_beta_fast(float(rs["beta_fast"]))
        w.add_rope_scaling_yarn_beta_slow(float(rs["beta_slow"]))
        ratio = float(rs["attention_factor"]) / yarn_mscale(float(rs["factor"]))
        if np.float32(ratio) != 1:
            w.add_rope_scaling_attn_factors(ratio)


def _tokenizer_pre(tok_dir: Path) -> str:
    """llama.cpp's pre-tokenizer name for the tokenizer: "gpt-4o" for o200k's split pattern (gpt-oss's
    o200k_harmony, as llama.cpp's converter names it), else "default" (GPT-2's)."""
    import json

    from ortllm.pipeline.tiktoken_vocab import O200K_PATTERN

    pre = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    patterns = [(x.get("pattern") or {}).get("Regex") for x in steps if x.get("type") == "Split"]
    return "gpt-4o" if O200K_PATTERN in patterns else "default"


def llama_cpp_view(cfg: ModelConfig) -> tuple[ModelConfig, list[str]]:
    """cfg as llama.cpp runs the GGUF of it where llama.cpp cannot carry a feature but runs the model so anyway (as on
    its own converter's GGUFs of the same source), and a note of each such difference: gpt-oss's YaRN with truncate
    false runs truncated (ggml_rope_yarn_corr_dims floors and ceils the ramp's bounds)."""
    notes = []
    rs = cfg.rope_scaling or {}
    if _family(cfg) == "gpt_oss" and rs.get("type") == "yarn" and not rs.get("truncate", True):
        cfg = replace(cfg, rope_scaling={**rs, "truncate": True})
        notes.append("YaRN truncate=false runs as truncate=true under llama.cpp (it floors and ceils the correction "
                     "range's bounds, as on its own gpt-oss GGUFs): its RoPE frequencies between the bounds differ "
                     "from the source's (ortllm reads the file back as llama.cpp runs it)")
    return cfg, notes


def rope_freqs(cfg: ModelConfig) -> np.ndarray | None:
    """[head_dim / 2] fp32 `rope_freqs.weight`: the divisor per frequency llama.cpp reads for Llama 3's scaling
    (ortllm's "factors", or "llama3" computed as llama.cpp's converter does); None without such scaling."""
    rs = cfg.rope_scaling or {}
    if rs.get("type") == "factors":
        return np.asarray(rs["factors"], np.float32)
    if rs.get("type") == "llama3":
        hf = {"rope_scaling": {**rs, "rope_type": "llama3"}, "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta,
              "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_heads}
        return _gguf_export().llama3_rope_factors(hf)
    return None


def _f32(v):
    """v with every float rounded to float32, as a GGUF key or tensor holds it."""
    if isinstance(v, float):
        return float(np.float32(v))
    if isinstance(v, (list, tuple)):
        return type(v)(_f32(x) for x in v)
    if isinstance(v, dict):
        return {k: _f32(x) for k, x in v.items()}
    return v


def comparable(cfg: ModelConfig) -> dict:
    """cfg's fields as a GGUF carries them: floats at float32, the arch left out (a GGUF's is llama.cpp's name), a
    llama3 RoPE scaling as the factors a GGUF stores."""
    if (cfg.rope_scaling or {}).get("type") == "llama3":
        cfg = replace(cfg, rope_scaling={"type": "factors", "factors": [float(x) for x in rope_freqs(cfg)]})
    return {f.name: _f32(getattr(cfg, f.name)) for f in fields(cfg) if f.name != "arch"}


def config_mismatch(want: ModelConfig, got: ModelConfig) -> list[str]:
    a, b = comparable(want), comparable(got)
    return [f"{k}: model {a[k]!r}, GGUF {b[k]!r}" for k in a if a[k] != b[k]]


# ---------------------------------------------------------------- the tensors

def plan(weights: ModelWeights, kind: str) -> list[Entry]:
    """The GGUF's tensors in writing order: rope_freqs, the global ones, then each layer's as the reader names
    them. Raises BenchError when the family's GGUF layout cannot be undone or a source tensor has no GGUF name."""
    cfg, t = weights.config, weights.tensors
    family = _family(cfg)
    undo = []
    for fix in FAMILIES[WRITE_ARCHS[family][1]].fix_gguf:
        if fix not in UNDO:
            raise BenchError(f"no GGUF writer for family {family!r}: its GGUF fix-up {fix.__name__} has no inverse "
                             "here")
        if UNDO[fix] is not None:
            undo.append(UNDO[fix])
    mats, embd, head = TYPES[kind]
    used: set[str] = set()
    codes = getattr(weights.extra.get("source_grids"), "codes", {})       # MXFP4 experts: their source bytes

    def qtype(gname: str, shape: tuple[int, ...]) -> str:
        import gguf

        if len(shape) == 1 or gname.endswith(KEEP_F32) or gname.endswith(".bias"):
            return "F32"
        q = embd if gname == "token_embd.weight" else head if gname == "output.weight" else mats
        if gname.endswith("_exps.weight"):
            q = EXPERT_TYPES.get(kind, q)
        for q in FALLBACK[q]:
            if shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[q]][0] == 0:
                return q
        return "F16"

    def one(hname: str) -> Callable[[], Iterator[np.ndarray]]:
        def parts():
            arr = t[hname]
            if undo and hname.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
                d = {hname: arr}
                for fix in undo:
                    fix(cfg, d)
                arr = d[hname]
            yield arr
        return parts

    out = []
    factors = rope_freqs(cfg)
    if factors is not None:
        out.append(Entry("rope_freqs.weight", factors.shape, "F32", lambda: iter([factors])))
    for gname, hname in gguf_tensor_names(replace(cfg, arch=WRITE_ARCHS[family][0])).items():
        if hname in t:
            shape = tensor_shape(t, hname)
            out.append(Entry(gname, shape, qtype(gname, shape), one(hname)))
            used.add(hname)
            continue
        stem, proj = hname.rsplit(".", 1)      # mlp.experts.gate_proj (weights) / gate_proj_bias (gpt-oss's biases)
        leaf = "bias" if proj.endswith("_bias") else "weight"
        experts = [f"{stem}.{e}.{proj.removesuffix('_bias')}.{leaf}" for e in range(cfg.num_experts)]
        if ".mlp.experts." in hname and experts[0] in t:     # stacked [E, ...], one expert at a time
            shape = (cfg.num_experts, *tensor_shape(t, experts[0]))
            q = qtype(gname, shape)
            if q == "MXFP4":     # the source's own MXFP4 bytes where it has them, as ggml lays them out
                def parts(experts=experts):
                    for n in experts:
                        yield mxfp4_ggml_blocks(*codes[n]()) if n in codes else t[n]
            else:
                def parts(experts=experts):
                    return (t[n] for n in experts)
            out.append(Entry(gname, shape, q, parts, sum(n in codes for n in experts) if q == "MXFP4" else 0))
            used.update(experts)
    left = [n for n in t if n not in used]
    if left:
        raise BenchError(f"no llama.cpp tensor name for {len(left)} tensors of this {cfg.arch} model, e.g. {left[0]}: "
                         "its GGUF writer does not know that feature")
    return out


def _probe_config(entries: list[Entry], cfg: ModelConfig, arch: str, tokenizer_dir: Path | None) -> ModelConfig:
    """The config ortllm's reader gets from the keys and tensor names this file will have: a GGUF of the same keys,
    each tensor one F32 value (rope_freqs its own, which the reader reads)."""
    import gguf

    from ortllm.pipeline.gguf_reader import open_gguf

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "probe.gguf"
        w = gguf.GGUFWriter(str(path), arch)
        write_keys(w, cfg, arch, tokenizer_dir, "probe")
        for e in entries:
            w.add_tensor(e.name, next(e.parts()) if e.name == "rope_freqs.weight" else np.zeros(1, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return gguf_config(open_gguf(path))


def _quantized(e: Entry) -> np.ndarray:
    """The tensor's bytes in its GGML type: uint8 [total], made part by part and row chunk by row chunk (F32 and
    F16: the array itself)."""
    import gguf

    if e.qtype in ("F32", "F16"):
        dtype = np.float32 if e.qtype == "F32" else np.float16
        return np.concatenate([np.ascontiguousarray(p, dtype).reshape(-1) for p in e.parts()]).reshape(e.shape)
    qt = gguf.GGMLQuantizationType[e.qtype]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    k = e.shape[-1]
    row_bytes = k // block * size
    out = np.empty(int(np.prod(e.shape[:-1])) * row_bytes, np.uint8)
    at = 0
    for part in e.parts():
        if part.dtype == np.uint8:          # bytes in the tensor's type already (the source's MXFP4 codes)
            out[at:at + part.size] = part.reshape(-1)
            at += part.size
            continue
        rows = part.reshape(-1, k)
        step = max(1, CHUNK_ELEMS // k)
        for a in range(0, rows.shape[0], step):
            chunk = rows[a:a + step]
            q = q6_k_quantize(chunk) if e.qtype == "Q6_K" else gguf.quants.quantize(chunk, qt)
            out[at:at + q.size] = q.reshape(-1)
            at += q.size
    if at != out.size:
        raise BenchError(f"{e.name}: its parts gave {at} bytes of {e.qtype}, its shape {e.shape} needs {out.size}")
    return out


def write_weights_gguf(weights: ModelWeights, out: Path, kind: str = "q4_0", name: str | None = None,
                       log=print) -> dict:
    """The GGUF of `weights` at `out` (written to out + ".tmp", renamed when complete). -> a summary: tensors by
    type, bytes, seconds; an mxfp4 file's expert matrices by the origin of their bytes (mxfp4_experts: source_codes,
    quantized); notes (llama_cpp_view) where llama.cpp runs the file not quite as the source is."""
    import gguf

    if kind not in TYPES:
        raise BenchError(f"--type must be one of {', '.join(TYPES)}; got {kind!r}")
    cfg = weights.config
    family = _family(cfg)
    arch = WRITE_ARCHS[family][0]
    entries = plan(weights, kind)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        tok = None
        if weights.write_tokenizer is not None:
            tok = Path(d)
            weights.write_tokenizer(tok)
            try:
                _gguf_export()._tokenizer(tok, cfg.vocab_size)
            except (ValueError, KeyError, OSError) as e:
                raise BenchError(f"this model's tokenizer cannot go into a gpt2-style GGUF token list: {e}") from None
        want, notes = llama_cpp_view(cfg)
        wrong = config_mismatch(want, _probe_config(entries, cfg, arch, tok))
        if wrong:
            raise BenchError(f"the GGUF keys of this {cfg.arch} model would not carry its config ({'; '.join(wrong)}):"
                             " its GGUF writer does not know that feature")
        tmp = out.with_name(out.name + ".tmp")
        out.parent.mkdir(parents=True, exist_ok=True)
        w = gguf.GGUFWriter(str(tmp), arch)
        write_keys(w, cfg, arch, tok, name or weights.source_desc or cfg.arch)
    w.add_file_type(gguf.LlamaFileType[FILE_TYPES[kind]])
    for e in entries:
        qt = gguf.GGMLQuantizationType[e.qtype]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        nbytes = int(np.prod(e.shape)) // block * size
        w.add_tensor_info(e.name, e.shape, np.dtype(np.float32), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    counts: dict[str, int] = {}
    for i, e in enumerate(entries):
        data = _quantized(e)
        w.write_tensor_data(data.view(np.uint8) if e.qtype not in ("F32", "F16") else data)
        del data
        counts[e.qtype] = counts.get(e.qtype, 0) + 1
        if log and (i + 1) % 100 == 0:
            log(f"gguf_weights: {i + 1}/{len(entries)} tensors, {time.perf_counter() - t0:.0f} s")
    w.close()
    tmp.replace(out)
    summary = {"gguf": str(out), "type": kind, "arch": arch, "tensors": counts, "bytes": out.stat().st_size,
               "seconds": round(time.perf_counter() - t0, 1)}
    mx = [e for e in entries if e.qtype == "MXFP4"]
    if mx:      # expert matrices [rows, K] by where their MXFP4 bytes came from
        carried = sum(e.source_codes for e in mx)
        summary["mxfp4_experts"] = {"source_codes": carried, "quantized": sum(e.shape[0] for e in mx) - carried}
    if notes:
        summary["notes"] = notes
    return summary


# ---------------------------------------------------------------- MXFP4

def mxfp4_ggml_blocks(blocks: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    """The hub's MXFP4 [N, K / 32, 16] code bytes (element 2i in the low nibble, 2i + 1 in the high) and e8m0 block
    exponents [N, K / 32] -> ggml's block_mxfp4 rows uint8 [N, K / 32 * 17]: each block's exponent byte, then 16
    bytes with element j in the low nibble and j + 16 in the high (convert_hf_to_gguf.py's repack_mxfp4_blocks).
    Only bits move: the 4-bit codes index the same e2m1 table on both sides (ggml's doubled, with half the
    scale)."""
    b = np.asarray(blocks, np.uint8)
    vals = np.stack((b & 0x0F, b >> 4), axis=-1).reshape(*b.shape[:-1], 32)       # [N, K / 32, 32] in order
    qs = vals[..., :16] | (vals[..., 16:] << 4)
    out = np.concatenate([np.asarray(exponents, np.uint8)[..., None], qs], axis=-1)
    return out.reshape(b.shape[0], -1)


# ---------------------------------------------------------------- Q6_K

QK_K = 256


def _nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's nearest_int (x + 1.5 * 2^23, the float's low bits): round half to even, as numpy's rint."""
    return np.rint(x).astype(np.int32)


def _make_qx_scale(x: np.ndarray, nmax: int) -> np.ndarray:
    """ggml's make_qx_quants(n=16, nmax, x, L, rmse_type=1, NULL) on groups x [G, 16] -> the scale of each group
    (its codes are made again from the super-block scale): the scale of the codes at iscale -nmax / max, then
    19 iscales around it, keeping the one that maximises sum(w x l)^2 / sum(w l^2) with weights w = x^2."""
    mx = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    zero = np.abs(mx) < 1e-15                                            # GROUP_MAX_EPS
    safe = np.where(zero, np.float32(1), mx)
    w = x * x
    wx = w * x
    lv = np.empty_like(x)

    def trial(iscale):                      # codes clamp(round(iscale x), -nmax, nmax - 1) -> sum w x l, sum w l^2
        np.multiply(iscale[:, None], x, out=lv)
        np.rint(lv, out=lv)
        np.clip(lv, -nmax, nmax - 1, out=lv)
        sumlx = np.einsum("ij,ij->i", wx, lv)
        np.multiply(lv, lv, out=lv)
        return sumlx, np.einsum("ij,ij->i", w, lv)

    sumlx, suml2 = trial(np.float32(-nmax) / safe)
    pos = suml2 > 0
    scale = np.where(pos, sumlx / np.where(pos, suml2, 1), 0).astype(np.float32)
    best = scale * sumlx
    for i in range(-9, 10):
        if i == 0:
            continue
        sumlx, suml2 = trial(-(np.float32(nmax) + np.float32(0.1) * np.float32(i)) / safe)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        scale = np.where(better, sumlx / np.where(better, suml2, 1), scale).astype(np.float32)
        best = np.where(better, scale * sumlx, best)
    return np.where(zero, 0, scale).astype(np.float32)


def q6_k_quantize(rows: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q6_K_ref on fp32 rows [n, K] (K a multiple of 256) -> uint8 [n, K / 256 * 210]: per
    super-block of 256, 16 groups of 16 with a 6-bit code each (ql: low 4 bits, qh: high 2), an int8 scale per group
    and an fp16 super-block scale d, in ggml's byte order (ql[128], qh[64], scales[16], d)."""
    x = np.ascontiguousarray(rows, np.float32).reshape(-1, QK_K)
    nb = x.shape[0]
    scales = _make_qx_scale(x.reshape(-1, 16), 32).reshape(nb, 16)
    imax = np.abs(scales).argmax(axis=1)
    max_scale = np.take_along_axis(scales, imax[:, None], axis=1)[:, 0]
    empty = np.abs(max_scale) < 1e-15
    iscale = np.float32(-128.0) / np.where(empty, 1.0, max_scale).astype(np.float32)
    d16 = np.where(empty, 0, 1 / iscale).astype(np.float16)
    sc = np.minimum(127, _nearest_int(iscale[:, None] * scales)).astype(np.int8)
    sc = np.where(empty[:, None], 0, sc).astype(np.int8)
    dq = d16.astype(np.float32)[:, None] * sc.astype(np.float32)                  # [nb, 16]
    dq_e = np.repeat(dq, 16, axis=1)                                              # [nb, 256]
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.where(dq_e != 0, np.clip(_nearest_int(x / np.where(dq_e != 0, dq_e, 1)), -32, 31) + 32, 32)
    lv = lv.astype(np.uint8).reshape(nb, 2, 4, 32)        # [block, half of 128, quarter (l + 32 q), l]
    ql = np.empty((nb, 2, 64), np.uint8)
    ql[:, :, :32] = (lv[:, :, 0] & 0xF) | ((lv[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:] = (lv[:, :, 1] & 0xF) | ((lv[:, :, 3] & 0xF) << 4)
    qh = (lv[:, :, 0] >> 4) | ((lv[:, :, 1] >> 4) << 2) | ((lv[:, :, 2] >> 4) << 4) | ((lv[:, :, 3] >> 4) << 6)
    blocks = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), d16.reshape(nb, 1)
                             .view(np.uint8)], axis=1)
    return blocks.reshape(rows.shape[0], -1)


# ---------------------------------------------------------------- command line

def load_weights(model: str, overrides: dict | None = None) -> ModelWeights:
    """The weights of an ortllm recipe or path; `overrides` change a seeded random recipe's [architecture] first
    (a smaller shape of the same recipe, e.g. num_layers=4 num_experts=32, to measure the writer on)."""
    import dataclasses

    from ortllm.pipeline.recipes import get_recipe
    from ortllm.pipeline.sources import load_model, random_weights

    if not overrides:
        return load_model(model)[1]
    recipe = get_recipe(model)
    if recipe.source.get("kind") != "random":
        raise BenchError(f"--set changes a seeded random recipe's shape; {model!r} is of kind "
                         f"{recipe.source.get('kind')!r}")
    unknown = set(overrides) - set(recipe.architecture) - {f.name for f in fields(ModelConfig)}
    if unknown:
        raise BenchError(f"--set: {', '.join(sorted(unknown))} is not a ModelConfig field")
    return random_weights(dataclasses.replace(recipe, architecture={**recipe.architecture, **overrides}))


def write_peer_ggufs(model: str, types: list[str], log=print) -> list[dict]:
    """`ortllm bench --peers-model MODEL --write-gguf TYPE,...`: model-TYPE.gguf of the recipe's weights in its peer
    assets (peer_runner.assets_dir: .venv-peers/models/MODEL/, where the llama.cpp-q4_0 / -q8_0 peers read them), one
    summary each (with the process's peak RSS so far); a file already there is kept (delete it to write it again)."""
    from .memory import peak_rss_bytes
    from .peer_runner import assets_dir

    unknown = [t for t in types if t not in TYPES]
    if unknown or not types:
        raise BenchError(f"--write-gguf takes types among {', '.join(TYPES)}; got {','.join(types) or 'none'}")
    out_dir = assets_dir(model)
    weights, done = None, []
    for kind in types:
        out = out_dir / f"model-{kind}.gguf"
        if out.is_file():
            log(f"gguf_weights: {out} exists: kept")
            done.append({"gguf": str(out), "type": kind, "kept": True})
            continue
        weights = weights or load_weights(model)
        log(f"gguf_weights: writing {out} from {model}'s weights")
        done.append(write_weights_gguf(weights, out, kind, model, log=log) | {"peak_rss_bytes": peak_rss_bytes()})
    return done
