"""A PEFT LoRA directory as llama.cpp's LoRA GGUF (what convert_lora_to_gguf.py writes), for the llama.cpp peer.

Runs inside .venv-peers (numpy, gguf, safetensors; nothing of ortllm):
  .venv-peers/bin/python bench/peers/lora_gguf.py PEFT_DIR BASE.gguf OUT.gguf
BASE.gguf is the model the adapter is for: its architecture and head counts are read from it.

The file llama_adapter_lora_init reads:
  general.architecture = the base's; general.type = "adapter"; adapter.type = "lora"; adapter.lora.alpha = alpha
  per adapted projection, beside the base tensor's name (blk.N.attn_q.weight):
    blk.N.attn_q.weight.lora_a   PEFT lora_A [r, in]   (ggml ne [in, r], like the base's ne [in, out])
    blk.N.attn_q.weight.lora_b   PEFT lora_B [out, r]  (ggml ne [r, out])
llama.cpp scales the product by alpha / r (r = lora_a's ne[1]); an rsLoRA adapter (alpha / sqrt(r)) gets
alpha x sqrt(r) written, so the scale is the same. The base's q and k rows are permuted for llama.cpp's rope
(gguf_export.permute, as convert_hf_to_gguf.py's LlamaModel.permute), so lora_b of q and k, whose rows are the
projection's outputs, get the same row permutation (n_head for q, n_head_kv for k); lora_a is untouched.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # run by path: no package here
from gguf_export import gguf_name, permute  # noqa: E402

_KEY = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise ValueError(f"the base GGUF has no {key}")
    return f.contents()


def base_info(base_gguf: Path) -> dict:
    """{arch, n_head, n_head_kv, n_layer} of the base GGUF (its metadata only)."""
    import gguf

    r = gguf.GGUFReader(str(base_gguf))
    arch = _field(r, "general.architecture")
    n_head = int(_field(r, f"{arch}.attention.head_count"))
    kv = r.fields.get(f"{arch}.attention.head_count_kv")
    return {"arch": arch, "n_head": n_head, "n_head_kv": int(kv.contents()) if kv is not None else n_head,
            "n_layer": int(_field(r, f"{arch}.block_count"))}


def write_lora_gguf(peft_dir: Path, base_gguf: Path, out: Path, permute_qk: bool = True) -> Path:
    """PEFT_DIR (adapter_config.json + adapter_model.safetensors) -> llama.cpp's LoRA GGUF at `out`, float32.
    permute_qk=False leaves lora_b of q/k in transformers' row order (wrong for llama.cpp: for tests only)."""
    import gguf
    from safetensors.numpy import load_file

    peft_dir = Path(peft_dir)
    cfg = json.loads((peft_dir / "adapter_config.json").read_text())
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora"):
        raise ValueError(f"{peft_dir}: only plain LoRA adapters convert (peft_type {cfg.get('peft_type')}, "
                         f"use_dora {cfg.get('use_dora')})")
    r = int(cfg["r"])
    alpha = float(cfg.get("lora_alpha", r))
    if cfg.get("use_rslora"):
        alpha *= math.sqrt(r)            # llama.cpp's alpha / r then equals PEFT's alpha / sqrt(r)
    info = base_info(base_gguf)
    tensors = load_file(str(peft_dir / "adapter_model.safetensors"))
    w = gguf.GGUFWriter(str(out), info["arch"])
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    n = 0
    for key in sorted(tensors):
        m = _KEY.search(key)
        if not m:
            raise ValueError(f"{peft_dir}: tensor {key} is not a LoRA weight of a llama projection")
        layer, kind, target, which = m.groups()
        if int(layer) >= info["n_layer"]:
            raise ValueError(f"{peft_dir}: {key} is for layer {layer}; the base has {info['n_layer']} layers")
        base = gguf_name(f"model.layers.{layer}.{kind}.{target}.weight")
        t = np.asarray(tensors[key], np.float32)
        if which == "B" and permute_qk and target in ("q_proj", "k_proj"):
            t = permute(t, info["n_head"] if target == "q_proj" else info["n_head_kv"])
        w.add_tensor(f"{base}.lora_{which.lower()}", np.ascontiguousarray(t))
        n += 1
    if not n:
        raise ValueError(f"{peft_dir} holds no LoRA weights")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("peft_dir", type=Path)
    p.add_argument("base_gguf", type=Path, help="the model's GGUF (architecture, head counts)")
    p.add_argument("out", type=Path)
    a = p.parse_args(argv)
    write_lora_gguf(a.peft_dir, a.base_gguf, a.out)
    print(f"lora_gguf: {a.out} ({a.out.stat().st_size / 2**20:.1f} MiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
