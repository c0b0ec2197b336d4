"""openai-harmony (OpenAI's renderer and parser of the harmony format) and tiktoken's o200k_harmony, offline: both
read o200k_base's ranks from the `bpe-openai` wheel's copy, never from the network.

openai-harmony's Rust core loads `o200k_base.tiktoken` from the directory TIKTOKEN_ENCODINGS_BASE names (else it
downloads it); tiktoken's o200k_harmony() takes its ranks from load_tiktoken_bpe (a download), given the same ranks
here instead.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path


def harmony_encoding(tmp_dir: Path):
    """openai-harmony's HARMONY_GPT_OSS encoding, its vocabulary the wheel's o200k_base unzipped into tmp_dir."""
    import openai_harmony

    from ortllm.pipeline.tiktoken_vocab import o200k_base_file
    tmp_dir.mkdir(parents=True, exist_ok=True)
    (tmp_dir / "o200k_base.tiktoken").write_bytes(gzip.decompress(o200k_base_file().read_bytes()))
    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(tmp_dir)
    try:
        return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if before is None:
            del os.environ["TIKTOKEN_ENCODINGS_BASE"]
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


def tiktoken_o200k_harmony():
    """tiktoken's own o200k_harmony definition (tiktoken_ext.openai_public: its pattern and special tokens) over the
    wheel's ranks: (tiktoken.Encoding, the definition's dict)."""
    import tiktoken
    from tiktoken_ext import openai_public

    from ortllm.pipeline.tiktoken_vocab import o200k_base_file, read_tiktoken_ranks
    ranks = read_tiktoken_ranks(o200k_base_file())
    real = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *a, **k: ranks
    try:
        spec = openai_public.o200k_harmony()
    finally:
        openai_public.load_tiktoken_bpe = real
    return tiktoken.Encoding(**spec), spec
