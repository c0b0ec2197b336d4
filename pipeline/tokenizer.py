"""Tokenizer files for an artifact: ``tokenizer.json`` + ``tokenizer_config.json``.

Three sources, one result (a :class:`TokenizerInfo` and the two files):

- a GGUF whose ``tokenizer.ggml.model`` is ``gpt2``: a byte-level BPE rebuilt with the ``tokenizers``
  library from the GGUF's tokens, merges and token types, splitting text as the original tokenizer does
  (by ``tokenizer.ggml.pre``: GPT-2's regex, Llama 3's, Qwen2's or Mistral's tekken; see ``_BPE_PRE``);
- a GGUF whose ``tokenizer.ggml.model`` is ``llama`` (SentencePiece BPE: Gemma, Llama 2, Mistral, Phi-3): a BPE
  with byte fallback whose merges come from the pieces' scores (transformers' ``generate_merges``, as its
  SentencePiece converter makes them), tokenizing as llama.cpp's SPM tokenizer does: the pair whose merged
  piece scores highest first, user-defined pieces (Gemma's newline and whitespace runs) matched in the raw text;
- a local Hugging Face model directory: its tokenizer files, copied;
- nothing (random-weight recipes): a byte-level BPE over the 256 bytes plus three ChatML specials.

Each is checked token for token against a reference on a real vocabulary (docs/tokenizers.md,
tests/pipeline/test_tokenizer_families.py): tiktoken for Llama 3, mistral-common's Tekkenizer for tekken,
sentencepiece for Mistral's and Phi-3's pieces, transformers' Qwen2 tokenizer for qwen2, transformers' GGUF
tokenizer for SmolLM2 and Gemma 3.

Why not save what transformers' GGUF loader builds: for a llama-architecture GGUF it makes a
SentencePiece/byte-level hybrid (``byte_fallback``, a ``ByteFallback``/``Replace`` decoder chain, BOS added
although the GGUF says not to, ``eos_token`` set to the BOS token) that onnxruntime-extensions misreads, and it
splits every byte-level BPE with GPT-2's regex whatever ``tokenizer.ggml.pre`` says (wrong for Llama 3's digit
groups, Qwen2's single digits, tekken's case splits). Where ``pre`` is GPT-2's, what we write tokenizes exactly
like transformers' GGUF tokenizer (tests/pipeline/test_tokenizer.py): same pre-tokenizer, no normalizer, same
vocabulary, merges and special tokens, and a plain ByteLevel decoder. Where we differ from transformers on
purpose, we follow the GGUF: ``add_bos_token`` (SmolLM2: false), ``eos_token`` (SmolLM2: ``<|im_end|>``) and no
lossy ``clean_up_tokenization_spaces``.
"""

from __future__ import annotations

import itertools
import json
import shutil
import string
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ortllm.runtime.contract import TOKENIZER as TOKENIZER_JSON
from ortllm.runtime.contract import TOKENIZER_CONFIG
from ortllm.runtime.errors import OrtllmError
from ortllm.runtime.tokenizer import read_chat_template, token_content
# Where transformers >= 4.43 may keep the chat template instead of tokenizer_config.json.
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")

# GGUF token types (gguf.TokenType / llama.cpp llama_token_type).
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED, _TOKEN_BYTE = 1, 3, 4, 6


# How a byte-level BPE GGUF (tokenizer.ggml.model "gpt2") splits text before BPE, by `tokenizer.ggml.pre` (llama.cpp's
# names): the original tokenizer's regex, an NFC normalizer where the original has one, and `ignore_merges` where
# the original is a tiktoken vocabulary (a word that is a whole token is that token, merges or not).
@dataclass(frozen=True)
class _BpeSplit:
    regex: str | None         # None: GPT-2's ByteLevel regex
    nfc: bool = False
    ignore_merges: bool = False


# GPT-2's regex. transformers' GGUF loader applies it for every pre value and calls that "default"; so do we for
# these. llama.cpp additionally splits every digit apart for smollm/starcoder/refact/codeshell; transformers does
# not, and neither do we (the two differ only where whitespace runs meet digits, e.g. "x  1").
_GPT2 = _BpeSplit(None)
# Llama 3's tiktoken pattern (llama-models' tokenizer.py; llama.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3): digits in
# groups of 1 to 3.
_LLAMA3 = _BpeSplit(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True)
# Qwen2's (transformers' Qwen2 tokenizer; llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2): single digits, NFC first.
_QWEN2 = _BpeSplit(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+", nfc=True)
# Mistral's tekken (mistral-common's tekken JSON "pattern"; llama.cpp LLAMA_VOCAB_PRE_TYPE_TEKKEN): words split
# at case changes, single digits.
_TEKKEN = _BpeSplit(r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True)
_BPE_PRE = {
    **dict.fromkeys(("default", "gpt2", "smollm", "starcoder", "refact", "codeshell", "mpt", "olmo"), _GPT2),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2),
    "tekken": _TEKKEN,
}

BYTE_TOKENIZER_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TokenizerError(OrtllmError, ValueError):
    """A tokenizer cannot be built from this input; the message says what to do."""


@dataclass(frozen=True)
class TokenizerInfo:
    """What the pipeline needs to know about the tokenizer it wrote."""

    vocab_size: int  # ids the tokenizer can produce (base vocab + added tokens); the model may have more rows
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # any of these ends generation
    pad_token_id: int | None
    chat_template: str | None
    files: tuple[str, ...]  # names written into out_dir


# --------------------------------------------------------------------------------------------- GGUF


@dataclass(frozen=True)
class _GGUFVocab:
    """The tokenizer part of a GGUF's metadata, already validated."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    scores: list[float] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    extra_eos_ids: tuple[int, ...]  # eot / eom ids, when the GGUF has them
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None
    context_length: int | None


def _field_value(reader, key: str) -> Any:
    """Value of metadata `key` (scalar, str or list), or None when absent."""
    field = reader.fields.get(key)
    if field is None:
        return None
    if hasattr(field, "contents"):  # recent gguf: whole arrays at once, fast
        return field.contents()
    # Older gguf: decode parts by hand. data holds the indices of the value parts.
    from gguf import GGUFValueType

    item_type = field.types[-1]
    values = [field.parts[i] for i in field.data]
    if item_type == GGUFValueType.STRING:
        values = [bytes(v).decode("utf-8") for v in values]
    else:
        values = [v.tolist()[0] for v in values]
    return values if field.types[0] == GGUFValueType.ARRAY else values[0]


def _open_reader(reader_or_path):
    if isinstance(reader_or_path, (str, Path)):
        path = Path(reader_or_path)
        if not path.is_file():
            raise TokenizerError(f"GGUF file not found: {path}; pass the path of a .gguf file")
        from .gguf_reader import open_gguf

        try:
            return open_gguf(path)
        except Exception as e:  # gguf raises ValueError/struct errors on foreign files
            raise TokenizerError(f"{path} is not a readable GGUF file ({e}); pass a .gguf model file") from e
    if not hasattr(reader_or_path, "fields"):
        raise TokenizerError(f"expected a gguf.GGUFReader or a path, got {type(reader_or_path).__name__}")
    return reader_or_path


def _optional_id(reader, key: str, n_tokens: int) -> int | None:
    value = _field_value(reader, key)
    if value is None:
        return None
    value = int(value)
    if not 0 <= value < n_tokens:
        raise TokenizerError(f"GGUF {key} = {value} is outside the vocabulary (0..{n_tokens - 1}); fix the GGUF")
    return value


def _read_gguf_vocab(reader) -> _GGUFVocab:
    model = _field_value(reader, "tokenizer.ggml.model")
    if model is None:
        raise TokenizerError("the GGUF has no tokenizer (tokenizer.ggml.model is missing); use a GGUF with one")
    if model not in ("gpt2", "llama"):
        raise TokenizerError(
            f"GGUF tokenizer model {model!r} is not supported; supported: byte-level BPE ('gpt2') and SentencePiece "
            "BPE ('llama'): use an HF model directory for this model instead"
        )
    pre = _field_value(reader, "tokenizer.ggml.pre") or "default"
    if model == "gpt2" and pre not in _BPE_PRE:
        raise TokenizerError(
            f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_BPE_PRE))}); "
            "use an HF model directory for this model instead"
        )
    tokens = _field_value(reader, "tokenizer.ggml.tokens")
    merges = _field_value(reader, "tokenizer.ggml.merges")
    scores = _field_value(reader, "tokenizer.ggml.scores")
    if model == "gpt2" and (not tokens or merges is None):
        raise TokenizerError("the GGUF's gpt2 tokenizer lacks tokenizer.ggml.tokens or .merges; re-convert the GGUF")
    if model == "llama" and (not tokens or scores is None or len(scores) != len(tokens)):
        raise TokenizerError("the GGUF's SentencePiece tokenizer lacks tokenizer.ggml.tokens or a score per token; "
                             "re-convert the GGUF")
    n = len(tokens)
    token_types = _field_value(reader, "tokenizer.ggml.token_type") or [_TOKEN_NORMAL] * n
    if len(token_types) != n:
        raise TokenizerError(f"GGUF has {n} tokens but {len(token_types)} token types; re-convert the GGUF")
    if len(set(tokens)) != n:
        raise TokenizerError("GGUF token list has duplicate tokens; re-convert the GGUF")

    arch = _field_value(reader, "general.architecture")
    context_length = _field_value(reader, f"{arch}.context_length") if arch else None
    extra_eos = tuple(
        i for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if (i := _optional_id(reader, key, n)) is not None
    )
    return _GGUFVocab(
        model=model,
        pre=pre,
        tokens=list(tokens),
        token_types=[int(t) for t in token_types],
        merges=list(merges or []),
        scores=[float(s) for s in scores] if scores is not None else None,
        bos_id=_optional_id(reader, "tokenizer.ggml.bos_token_id", n),
        eos_id=_optional_id(reader, "tokenizer.ggml.eos_token_id", n),
        unk_id=_optional_id(reader, "tokenizer.ggml.unknown_token_id", n),
        pad_id=_optional_id(reader, "tokenizer.ggml.padding_token_id", n),
        extra_eos_ids=extra_eos,
        add_bos=bool(_field_value(reader, "tokenizer.ggml.add_bos_token") or False),
        add_eos=bool(_field_value(reader, "tokenizer.ggml.add_eos_token") or False),
        # llama.cpp's SPM default: a space before the text unless the GGUF says otherwise (Gemma does)
        add_space_prefix=bool(_field_value(reader, "tokenizer.ggml.add_space_prefix") is not False
                              if model == "llama" else False),
        chat_template=_field_value(reader, "tokenizer.chat_template"),
        context_length=int(context_length) if context_length is not None else None,
    )


def _split_merges(merges: list[str]) -> list[tuple[str, str]]:
    pairs = [tuple(m.split(" ")) for m in merges]
    bad = next((m for m, p in zip(merges, pairs) if len(p) != 2), None)
    if bad is not None:
        raise TokenizerError(f"GGUF merge {bad!r} is not two tokens separated by one space; re-convert the GGUF")
    return pairs  # type: ignore[return-value]


def _post_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None):
    """BOS/EOS added by encode(add_special_tokens=True), as the GGUF's add_bos/add_eos say."""
    if bos is None and eos is None:
        return None
    head = [bos[0]] if bos else []
    tail = [eos[0]] if eos else []
    return processors.TemplateProcessing(
        single=head + ["$A"] + tail,
        pair=head + ["$A"] + tail + head + ["$B:1"] + tail,
        special_tokens=[t for t in (bos, eos) if t is not None],
    )


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], unk: str | None,
                    split: _BpeSplit = _GPT2) -> Tokenizer:
    """A GPT-2 style byte-level BPE; text split before BPE as `split` says (GPT-2's regex by default).

    GPT-2's regex: ByteLevel(use_regex=True), as transformers' GGUF loader; another regex: Split(regex, isolated)
    then ByteLevel(use_regex=False), as transformers' Llama 3 / Qwen2 / tekken tokenizer.json files have it.
    """
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=unk is not None,
                               ignore_merges=split.ignore_merges))
    if split.regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split.regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    if split.nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm_bpe(v: _GGUFVocab) -> Tokenizer:
    """A SentencePiece BPE vocabulary (tokenizer.ggml.model "llama") as a `tokenizers` BPE: merges of the normal
    pieces ordered by the merged piece's score (transformers' generate_merges), byte pieces <0xNN> for the
    fallback, spaces as U+2581 (no prefix space unless the GGUF asks for one), the decoder undoing both."""
    from transformers.convert_slow_tokenizer import generate_merges

    normal = {t: i for i, (t, k) in enumerate(zip(v.tokens, v.token_types)) if k == _TOKEN_NORMAL}
    merges = generate_merges(normal, [(t, v.scores[i]) for t, i in normal.items()])
    vocab = {t: i for i, t in enumerate(v.tokens)}
    unk = v.tokens[v.unk_id] if v.unk_id is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Replace(" ", "\u2581")]
    if v.add_space_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if v.add_space_prefix else []))
    return tok


def _added_token_json(content: str, special: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


def _write_files(out_dir: Path, tok: Tokenizer, config: dict) -> tuple[str, ...]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = json.loads(tok.to_str())
    # Merges as "a b" strings (the tokenizers < 0.20 layout) rather than pairs: every reader accepts it,
    # onnxruntime-extensions' converter only this one. Byte-level tokens never contain a space.
    merges = data["model"]["merges"]
    if not any(" " in part for pair in merges for part in pair):
        data["model"]["merges"] = [" ".join(pair) for pair in merges]
    (out_dir / TOKENIZER_JSON).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (out_dir / TOKENIZER_CONFIG).write_text(
        json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return (TOKENIZER_JSON, TOKENIZER_CONFIG)


def _filler_pieces():
    """"a ", ..., "z ", "aa ", "ab ", ...: lowercase words and a space (GPT-2's byte-level "Ġ"), shortest first.
    The space after the word keeps each piece from ever being a whole pre-tokenized word (GPT-2's regex puts a
    space before a word, never after), which a BPE that looks a word up in its vocabulary first would otherwise
    find (onnxruntime-extensions' does)."""
    for n in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=n):
            yield "".join(letters) + "\u0120"


def _tokenizer_config(*, tokens: list[str], special_ids: list[int], added_ids: list[int], bos_id, eos_id,
                      unk_id, pad_id, add_bos: bool, add_eos: bool, chat_template: str | None,
                      model_max_length: int | None) -> dict:
    """tokenizer_config.json in transformers' layout; GPT2Tokenizer = a plain byte-level BPE tokenizer."""
    name = lambda i: tokens[i] if i is not None else None  # noqa: E731
    named = {bos_id, eos_id, unk_id, pad_id}
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "bos_token": name(bos_id),
        "eos_token": name(eos_id),
        "unk_token": name(unk_id),
        "pad_token": name(pad_id),
        "additional_special_tokens": [tokens[i] for i in special_ids if i not in named],
        "added_tokens_decoder": {
            str(i): _added_token_json(tokens[i], i in special_ids) for i in sorted(special_ids + added_ids)
        },
        "chat_template": chat_template,
    }
    if model_max_length:
        config["model_max_length"] = model_max_length
    return {k: v for k, v in config.items() if v is not None}


def write_tokenizer_from_gguf(reader_or_path, out_dir: Path) -> TokenizerInfo:
    """Write tokenizer.json + tokenizer_config.json for a GGUF with a gpt2 (byte-level BPE) or llama (SentencePiece
    BPE) tokenizer.

    Accepts an open gguf.GGUFReader (cheap: the metadata is already parsed) or a path.
    """
    v = _read_gguf_vocab(_open_reader(reader_or_path))
    tokens = v.tokens
    special_ids = [i for i, t in enumerate(v.token_types) if t == _TOKEN_CONTROL]
    added_ids = [i for i, t in enumerate(v.token_types) if t == _TOKEN_USER_DEFINED]

    if v.model == "llama":
        tok = _spm_bpe(v)
    else:
        tok = _byte_level_bpe({t: i for i, t in enumerate(tokens)}, _split_merges(v.merges),
                              tokens[v.unk_id] if v.unk_id is not None else None, _BPE_PRE[v.pre])
    # Same flags as transformers' GGUF loader: matched in raw text, never normalized.
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special_ids])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in added_ids])
    bos = (tokens[v.bos_id], v.bos_id) if v.add_bos and v.bos_id is not None else None
    eos = (tokens[v.eos_id], v.eos_id) if v.add_eos and v.eos_id is not None else None
    post = _post_processor(bos, eos)
    if post is not None:
        tok.post_processor = post

    config = _tokenizer_config(
        tokens=tokens, special_ids=special_ids, added_ids=added_ids, bos_id=v.bos_id, eos_id=v.eos_id,
        unk_id=v.unk_id, pad_id=v.pad_id, add_bos=v.add_bos, add_eos=v.add_eos,
        chat_template=v.chat_template, model_max_length=v.context_length,
    )
    if v.model == "llama":
        config["tokenizer_class"] = "LlamaTokenizerFast"    # a SentencePiece BPE, not GPT-2's byte-level one
    elif _BPE_PRE[v.pre].regex is not None:
        config["tokenizer_class"] = "PreTrainedTokenizerFast"   # tokenizer.json as written (GPT2Tokenizer's differs)
    files = _write_files(Path(out_dir), tok, config)
    eos_ids = tuple(dict.fromkeys(([v.eos_id] if v.eos_id is not None else []) + list(v.extra_eos_ids)))
    return TokenizerInfo(vocab_size=len(tokens), bos_token_id=v.bos_id, eos_token_ids=eos_ids,
                         pad_token_id=v.pad_id, chat_template=v.chat_template, files=files)


def cached_tokenizer(kind: str, key_parts: list[str], out_dir: Path, make, log=lambda m: None) -> TokenizerInfo:
    """make(out_dir) -> TokenizerInfo, its files kept for the next build of the same inputs (pipeline/derived_cache.py;
    key_parts name the inputs, the caller's salt its code)."""
    from .derived_cache import cached

    def made(d: Path):
        info = make(d)
        return asdict(info), list(info.files)

    info = cached(kind, key_parts, Path(out_dir), made, log)
    return TokenizerInfo(**{**info, "eos_token_ids": tuple(info["eos_token_ids"]), "files": tuple(info["files"])})


def write_tokenizer_from_gguf_cached(reader, gguf_sha256: str, out_dir: Path, log=lambda m: None) -> TokenizerInfo:
    """write_tokenizer_from_gguf, its files kept for the next build of the same GGUF (the conversion of Gemma 3's
    262k tokens takes about a minute)."""
    from .derived_cache import code_salt

    salt = code_salt(__file__, dists=("tokenizers", "transformers", "gguf"))
    return cached_tokenizer("gguf-tokenizer", [gguf_sha256, salt], out_dir,
                            lambda d: write_tokenizer_from_gguf(reader, d), log)


# ------------------------------------------------------------------------------------------ HF dir


def write_tokenizer_from_hf(hf_dir: Path, out_dir: Path) -> TokenizerInfo:
    """Copy the tokenizer files of a local Hugging Face model directory into out_dir."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    missing = [n for n in (TOKENIZER_JSON, TOKENIZER_CONFIG) if not (hf_dir / n).is_file()]
    if missing:
        raise TokenizerError(
            f"{hf_dir} lacks {' and '.join(missing)}; point to a Hugging Face model directory with a fast "
            "tokenizer (save one with tokenizer.save_pretrained(DIR))"
        )
    try:
        tok = Tokenizer.from_file(str(hf_dir / TOKENIZER_JSON))
        config = json.loads((hf_dir / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    except Exception as e:
        raise TokenizerError(f"cannot read the tokenizer files in {hf_dir} ({e}); "
                             "re-save them with transformers") from e

    out_dir.mkdir(parents=True, exist_ok=True)
    files = [TOKENIZER_JSON, TOKENIZER_CONFIG] + [n for n in CHAT_TEMPLATE_FILES if (hf_dir / n).is_file()]
    for name in files:
        shutil.copyfile(hf_dir / name, out_dir / name)

    def token_id(key: str) -> int | None:
        content = token_content(config.get(key))
        return tok.token_to_id(content) if content is not None else None

    eos_ids = [token_id("eos_token")]
    gen_path = hf_dir / "generation_config.json"
    if gen_path.is_file():  # models with several stop ids list them here
        gen_eos = json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id")
        eos_ids += gen_eos if isinstance(gen_eos, list) else [gen_eos]
    return TokenizerInfo(
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        bos_token_id=token_id("bos_token"),
        eos_token_ids=tuple(dict.fromkeys(int(i) for i in eos_ids if i is not None)),
        pad_token_id=token_id("pad_token"),
        chat_template=read_chat_template(hf_dir, config),
        files=tuple(files),
    )


# ------------------------------------------------------------------------------------ byte tokenizer


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, indexed by byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_byte_tokenizer(out_dir: Path, vocab_size: int) -> TokenizerInfo:
    """A byte-level BPE without merges (ids 0..255 = bytes) plus ChatML specials, for random weights.

    Ids past the specials, up to the model's vocab_size, are word-like pieces ("a ", "b ", "ab ", ...: _filler_pieces)
    that encode never makes (no merges: a text's ids stay its UTF-8 bytes) and decode turns into text, as every id of
    a real vocabulary does: a random model's output is text a client can see and time, not mostly nothing.
    """
    n_needed = 256 + len(BYTE_TOKENIZER_SPECIALS)
    if vocab_size < n_needed:
        raise TokenizerError(f"vocab_size must be >= {n_needed} for the byte tokenizer (256 bytes + "
                             f"{len(BYTE_TOKENIZER_SPECIALS)} specials); got {vocab_size}")
    tokens = _bytes_to_unicode() + list(BYTE_TOKENIZER_SPECIALS)
    tokens += list(itertools.islice(_filler_pieces(), vocab_size - n_needed))
    special_ids = list(range(256, n_needed))
    tok = _byte_level_bpe({t: i for i, t in enumerate(tokens)}, [], None)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BYTE_TOKENIZER_SPECIALS])
    endoftext, im_start, im_end = special_ids
    config = _tokenizer_config(
        tokens=tokens, special_ids=special_ids, added_ids=[], bos_id=im_start, eos_id=im_end, unk_id=None,
        pad_id=endoftext, add_bos=False, add_eos=False, chat_template=CHATML_TEMPLATE, model_max_length=None,
    )
    files = _write_files(Path(out_dir), tok, config)
    return TokenizerInfo(vocab_size=vocab_size, bos_token_id=im_start, eos_token_ids=(im_end, endoftext),
                         pad_token_id=endoftext, chat_template=CHATML_TEMPLATE, files=files)
