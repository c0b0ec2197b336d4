"""A llama-architecture GGUF of a transformers Llama directory (the peers' hf/), for the llama.cpp peer.

Runs inside .venv-peers (ci/install_peers.sh runs it for every model that ships no GGUF; SmolLM2 ships one):
  .venv-peers/bin/python bench/peers/gguf_export.py HF_DIR OUT.gguf --type f32     (or f16)
  .venv-peers/bin/python bench/peers/gguf_export.py --quantize IN.gguf OUT.gguf --type q4_1
  .venv-peers/bin/python bench/peers/gguf_export.py --quantize --allow-requantize Q4_1.gguf OUT.gguf --type q4_0
Writing needs the standard library, numpy, gguf (gguf-py) and safetensors only; --quantize needs llama_cpp.

Tensors get llama.cpp's names (token_embd, blk.N.attn_q, ...) and the metadata its llama loader reads.
q_proj/k_proj rows are permuted exactly as convert_hf_to_gguf.py's LlamaModel.permute does: llama.cpp's llama
arch rotates adjacent pairs (2i, 2i+1) (GGML rope mode 0), transformers rotates (i, i + head_dim/2).

Quantization is llama.cpp's own quantizer (llama_cpp.llama_model_quantize, i.e. `llama-quantize IN OUT Q4_1`)
on the F32 file, not gguf-py's numpy quantizers: llama.cpp then picks its default per-tensor types, as it does
for every Q4_1 GGUF in the wild (for TinyLlama's shapes: output.weight Q6_K, the rest of the matrices Q4_1).

Tokenizer: only the byte-level BPE tokenizers ortllm writes (tokenizer.ggml.model "gpt2"); the bench feeds
token ids, so the GGUF's tokenizer only has to load. The token list is padded to vocab_size with "[PADn]"
(type UNUSED) because llama.cpp sizes token_embd by it. The tokenizer directory's chat template is written as
tokenizer.chat_template (llama.cpp's quantizer copies it to the Q4_1/Q8_0 files), so llama-server chats with the
model's own template and `ortllm pull` of the file can `--chat`.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

# transformers name -> llama.cpp name; `{i}` is the layer
TENSOR_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}
QUANT_FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k_m": 15}     # llama_ftype: LLAMA_FTYPE_MOSTLY_*


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """q/k rows from transformers' rope layout to llama.cpp's (convert_hf_to_gguf.py LlamaModel.permute).

    w: [n_head * head_dim, hidden]; rows (head, half, pair) -> (head, pair, half). k uses n_kv_heads.
    """
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of permute: llama.cpp's q/k rows back to transformers' layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name_: str) -> str:
    """The inverse of gguf_name."""
    parts = gguf_name_.split(".")
    key = ".".join(parts[:1] + ["{i}"] + parts[2:]) if parts[0] == "blk" else gguf_name_
    for hf, gg in TENSOR_NAMES.items():
        if gg == key:
            return hf.format(i=parts[1]) if parts[0] == "blk" else hf
    raise ValueError(f"no transformers name for GGUF tensor {gguf_name_!r}")


def gguf_name(hf_name: str) -> str:
    parts = hf_name.split(".")
    if hf_name.startswith("model.layers."):
        i = parts[2]
        key = ".".join(parts[:2] + ["{i}"] + parts[3:])
        if key in TENSOR_NAMES:
            return TENSOR_NAMES[key].format(i=i)
    elif hf_name in TENSOR_NAMES:
        return TENSOR_NAMES[hf_name]
    raise ValueError(f"no llama.cpp name for tensor {hf_name!r}: only llama-architecture models are supported")


def _tokenizer(hf: Path, vocab_size: int):
    """(tokens, token types, merges, add_bos) from hf/tokenizer.json + tokenizer_config.json, gpt2-style."""
    import gguf

    tok = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise ValueError(f"{hf}/tokenizer.json: only byte-level BPE tokenizers are supported "
                         f"(model type {model.get('type')!r}, byte_fallback {model.get('byte_fallback')})")
    tokens: list[str | None] = [None] * vocab_size
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in tok.get("added_tokens", []):
        i = added["id"]
        if i < vocab_size:
            tokens[i] = added["content"]
            types[i] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if not merges:
        merges = [_inert_merge(tokens, types)]
    cfg_path = hf / "tokenizer_config.json"
    add_bos = bool(json.loads(cfg_path.read_text()).get("add_bos_token", False)) if cfg_path.is_file() else False
    return tokens, types, merges, add_bos


def _inert_merge(tokens: list[str], types: list) -> str:
    """One merge that never applies, for a BPE without merges: llama.cpp refuses a gpt2 vocab without the merges key
    and gguf-py cannot write an empty array. Without merges no token of two or more characters is ever formed, so a
    merge with such a half never fires; one whose halves and result are all tokens (the first token t = a + b, b of
    two or more characters: "a" + "bĠ" of the byte tokenizer's "abĠ") also loads in tokenizers' BPE (ortllm reads
    the file with it). Else the halves "aa" of byte symbol a, which llama.cpp takes (tokenizers does not)."""
    import gguf

    vocab = {t for t, k in zip(tokens, types) if k == gguf.TokenType.NORMAL}
    for t in tokens:
        for cut in range(1, len(t) - 1):
            if t[:cut] in vocab and t[cut:] in vocab and t in vocab:
                return f"{t[:cut]} {t[cut:]}"
    a = tokens[0]
    return f"{a}{a} {a}{a}"


def _chat_template(tok_dir: Path) -> str | list[dict] | None:
    """The tokenizer directory's chat template: tokenizer_config.json's chat_template, else chat_template.jinja,
    else chat_template.json's; the order of transformers and of ortllm's runtime/tokenizer.py read_chat_template
    (not importable here: this runs in the peers' venv). A list of named templates is kept as it is: gguf-py
    writes its "default" as tokenizer.chat_template and the others as tokenizer.chat_template.NAME, as
    convert_hf_to_gguf.py does."""
    cfg_path = tok_dir / "tokenizer_config.json"
    template = json.loads(cfg_path.read_text(encoding="utf-8")).get("chat_template") if cfg_path.is_file() else None
    if template is None and (tok_dir / "chat_template.jinja").is_file():
        template = (tok_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (tok_dir / "chat_template.json").is_file():
        template = json.loads((tok_dir / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
    return template


def _safetensors_files(hf: Path) -> list[Path]:
    """hf/model.safetensors, or the shards hf/model.safetensors.index.json names (in its order)."""
    index = hf / "model.safetensors.index.json"
    if index.is_file():
        return list(dict.fromkeys(hf / f for f in json.loads(index.read_text())["weight_map"].values()))
    return [hf / "model.safetensors"]


def _tensor_plan(hf: Path, cfg: dict, dtype: str):
    """[(gguf name, hf name, file, numpy dtype, shape)] in safetensors order; tied lm_head is absent (llama.cpp
    reuses token_embd). 1-D tensors (the norms) stay F32, as in every llama.cpp conversion."""
    from safetensors import safe_open

    plan = []
    for file in _safetensors_files(hf):
        with safe_open(str(file), framework="numpy") as f:
            for name in f.keys():
                if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                    continue
                shape = tuple(f.get_slice(name).get_shape())
                np_dtype = np.float16 if dtype == "f16" and len(shape) > 1 else np.float32
                plan.append((gguf_name(name), name, file, np_dtype, shape))
    return plan


def llama3_rope_factors(cfg: dict) -> np.ndarray | None:
    """[head_dim / 2] fp32 `rope_freqs.weight` for rope_scaling of type llama3 (Llama 3.1+), as
    convert_hf_to_gguf.py's LlamaModel computes it: llama.cpp divides each frequency by its factor. None otherwise."""
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) != "llama3":
        return None
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (float(cfg.get("rope_theta", 10000.0)) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factor = float(rs["factor"])
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    wavelen = 2 * np.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, mid))
    return out.astype(np.float32)


def write_gguf(hf: Path, out: Path, dtype: str = "f32", name: str | None = None, tokenizer: Path | None = None) -> Path:
    """hf/ (config.json, model.safetensors or its shards, tokenizer.json) -> an F32 or F16 llama GGUF at `out`.
    Tensors are read and written one at a time: the model never sits in memory whole (an 8B model's F16 GGUF is
    written from its fp16 shards with ~2 GB of memory: the largest tensor in fp32). `tokenizer`: the directory of
    tokenizer.json (and tokenizer_config.json) when hf/ has none (the shape recipes' generated weights)."""
    import gguf
    from safetensors import safe_open

    if dtype not in ("f32", "f16"):
        raise ValueError(f"--type for writing must be f32 or f16; got {dtype!r} (quantize with --quantize)")
    cfg = json.loads((hf / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    vocab = cfg["vocab_size"]

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(name or hf.resolve().parent.name)
    w.add_vocab_size(vocab)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    if head_dim != hidden // heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)

    tokens, types, merges, add_bos = _tokenizer(tokenizer or hf, vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    bos, eos = cfg.get("bos_token_id"), cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos is not None:
        w.add_eos_token_id(int(eos))
    w.add_add_bos_token(add_bos)
    template = _chat_template(tokenizer or hf)
    if template:
        w.add_chat_template(template)

    plan = _tensor_plan(hf, cfg, dtype)
    rope_factors = llama3_rope_factors(cfg)
    if rope_factors is not None:
        w.add_tensor_info("rope_freqs.weight", rope_factors.shape, rope_factors.dtype, rope_factors.nbytes)
    for gname, _, _, np_dtype, shape in plan:
        w.add_tensor_info(gname, shape, np.dtype(np_dtype), int(np.prod(shape)) * np.dtype(np_dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    if rope_factors is not None:
        w.write_tensor_data(rope_factors)
    for file, entries in itertools.groupby(plan, key=lambda e: e[2]):     # the plan lists each file's tensors together
        with safe_open(str(file), framework="numpy") as f:
            for gname, hname, _, np_dtype, _ in entries:
                t = f.get_tensor(hname).astype(np.float32, copy=False)
                if gname.endswith("attn_q.weight"):
                    t = permute(t, heads)
                elif gname.endswith("attn_k.weight"):
                    t = permute(t, kv_heads)
                w.write_tensor_data(np.ascontiguousarray(t, dtype=np_dtype))
    w.close()
    return out


def quantize(src: Path, dst: Path, qtype: str = "q4_1", threads: int = 0, allow_requantize: bool = False) -> Path:
    """llama.cpp's quantizer on an F32/F16 GGUF (its default per-tensor type choice for `qtype`); with
    allow_requantize, on an already quantized GGUF too (llama.cpp dequantizes it first)."""
    import ctypes

    import llama_cpp as L

    if qtype not in QUANT_FTYPES:
        raise ValueError(f"--type for --quantize must be one of {', '.join(QUANT_FTYPES)}; got {qtype!r}")
    L.llama_backend_init()
    params = L.llama_model_quantize_default_params()
    params.ftype = QUANT_FTYPES[qtype]
    params.nthread = threads
    params.allow_requantize = allow_requantize
    rc = L.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, {qtype}) returned {rc}")
    return dst


def tensor_types(path: Path) -> dict[str, int]:
    """{GGML type name: number of tensors} of a GGUF file."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="hf directory (or, with --quantize, an F32/F16 GGUF)")
    p.add_argument("out", type=Path, help="GGUF file to write")
    p.add_argument("--type", default="f32", help="f32 or f16 when writing; q4_1 (q4_0, q8_0, q4_k_m) with --quantize")
    p.add_argument("--quantize", action="store_true", help="quantize the GGUF `src` with llama.cpp")
    p.add_argument("--threads", type=int, default=0, help="quantizer threads (0: all cores)")
    p.add_argument("--allow-requantize", action="store_true",
                   help="with --quantize: `src` may be quantized already (llama.cpp dequantizes it first)")
    p.add_argument("--name", default=None, help="general.name (default: the hf directory's parent's name)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="directory of tokenizer.json when the hf directory has none (e.g. an ortllm artifact's)")
    a = p.parse_args(argv)
    if a.quantize:
        quantize(a.src, a.out, a.type, a.threads, a.allow_requantize)
    else:
        write_gguf(a.src, a.out, a.type, a.name, a.tokenizer)
    types = ", ".join(f"{k} x{v}" for k, v in sorted(tensor_types(a.out).items()))
    print(f"gguf_export: {a.out} ({a.out.stat().st_size / 2**20:.1f} MiB; tensors {types})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
