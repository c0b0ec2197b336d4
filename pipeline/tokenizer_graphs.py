"""ONNX tokenizer graphs for an artifact: ``tokenizer.onnx`` and ``detokenizer.onnx``.

Built with onnxruntime-extensions' custom ops from the artifact's ``tokenizer.json`` and written only
when they reproduce ``ortllm.runtime.tokenizer.Tokenizer`` exactly on a built-in varied text set (code,
CJK, emoji, digits, whitespace runs, chat text with special tokens) and on every token of the vocabulary
that is whole UTF-8 characters. Running them needs an ORT session with
``onnxruntime_extensions.get_library_path()`` registered.

Graph contracts (what the verification checks):
  tokenizer.onnx    input_text: string[N] -> input_ids: int64[N, L], attention_mask: int64[N, L]
                    row i == Tokenizer.encode(input_text[i]) (no BOS/EOS added), right-padded;
                    a NUL character ends the text (C string)
  detokenizer.onnx  ids: int64[L] or int64[1, L] -> str: string[1]
                    == Tokenizer.decode(ids, skip_special_tokens=True); ONE sequence per call
                    (onnxruntime-extensions 0.15's BpeDecoder mixes rows of a [B>1, L] batch), and
                    ids whose bytes are whole UTF-8 characters: where `tokenizers` writes U+FFFD for a
                    cut character, BpeDecoder returns the raw bytes (a string tensor that is not UTF-8).
                    A NUL byte ends the string (C string). Verified on every token of the
                    vocabulary that is whole UTF-8 characters without NUL.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortllm.pipeline.tokenizer import TOKENIZER_CONFIG, TOKENIZER_JSON, _bytes_to_unicode
from ortllm.runtime.tokenizer import Tokenizer

TOKENIZER_ONNX = "tokenizer.onnx"
DETOKENIZER_ONNX = "detokenizer.onnx"
WRITTEN = "written"
_DOMAIN = "ai.onnx.contrib"
_OPSET = 17
_IR_VERSION = 8  # onnx 1.23 stamps an IR version that onnxruntime 1.31 refuses to load

# Texts the graphs must reproduce exactly; the chat text rendered from the artifact's template is added.
VERIFY_TEXTS = (
    "Hello world",
    "  leading and trailing spaces   ",
    "\n\nnewlines\n\n\nand more\n",
    "tabs\tand\t\tmixed \t whitespace\r\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }',
    "12345 678.90 3.14159 1e-10 0x1F 1,000,000 x  1 and   333",
    "日本語のテキストと中文文本，还有한국어 텍스트",
    "Emoji: 😀🎉👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷",
    "Ünïcödé: café naïve résumé Ångström, Русский, ελληνικά, مرحبا",
    "∀x∈ℝ, x² ≥ 0; ∑ i = n(n+1)/2 \u00a0nbsp zero\u200bwidth ſtraße ﬁ ①",
    "don't can't it's I'm we've they're he'd I'll A , b . c ' s",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>text <|im_start|> spaced <|endoftext|> <|im_start <|im_end| |im_start|>",
    "https://example.com/path?q=1&b=2#frag user@example.com",
    "     ",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 4,
)
_CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2 + 2 = ?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "Merci 🙂"}]


# gpt-oss's o200k_harmony (runtime/tokenizer.py harmony): neither graph is exact, so neither is tried (measured with
# onnxruntime-extensions 0.15: HfJsonTokenizer fails the vocabulary check at "</" and 20 other tokens of the first
# 10k; the check takes ~40 s); tests/pipeline/test_tiktoken_vocab.py checks the detokenizer's reason
HARMONY_SKIPPED = {
    TOKENIZER_ONNX: "skipped: not exact; onnxruntime-extensions' HfJsonTokenizer encodes some of o200k_harmony's "
                    "vocabulary differently from tokenizers (\"</\" as [60], not 808), and GPT2Tokenizer has no o200k "
                    "pre-tokenizer",
    DETOKENIZER_ONNX: "skipped: no exact ONNX detokenizer for this tokenizer (harmony's markers stay in decoded "
                      "text; BpeDecoder skips every special token or none)",
}


def write_tokenizer_graphs(artifact_dir: Path) -> dict[str, str]:
    """Write tokenizer.onnx / detokenizer.onnx into artifact_dir where they reproduce the tokenizer.

    Returns {file name: "written" or why it was skipped}. A skipped graph's stale file is removed.
    """
    artifact_dir = Path(artifact_dir)
    tok = Tokenizer.from_dir(artifact_dir)
    if tok.harmony:
        for name in (TOKENIZER_ONNX, DETOKENIZER_ONNX):
            (artifact_dir / name).unlink(missing_ok=True)
        return dict(HARMONY_SKIPPED)
    spec = json.loads((artifact_dir / TOKENIZER_JSON).read_text(encoding="utf-8"))
    config = (artifact_dir / TOKENIZER_CONFIG).read_text(encoding="utf-8")
    texts = list(VERIFY_TEXTS)
    if tok.chat_template:
        texts.append(tok.apply_chat_template(_CHAT, add_generation_prompt=True))

    results = {}
    bpe_decoder = _bpe_decoder_reason(spec)
    encoders: list[tuple[str, Callable[[], onnx.ModelProto]]] = [
        ("HfJsonTokenizer", lambda: _hf_json_encoder(spec, config)),
    ]
    if _byte_level_reason(spec) is None:
        encoders.insert(0, ("GPT2Tokenizer", lambda: _gpt2_encoder(spec)))
    results[TOKENIZER_ONNX] = _write_first_exact(
        artifact_dir / TOKENIZER_ONNX, encoders, lambda m: _check_encoder(m, tok, texts, spec))
    if bpe_decoder is None:
        results[DETOKENIZER_ONNX] = _write_first_exact(
            artifact_dir / DETOKENIZER_ONNX, [("BpeDecoder", lambda: _bpe_decoder(spec))],
            lambda m: _check_decoder(m, tok, texts, spec))
    else:
        (artifact_dir / DETOKENIZER_ONNX).unlink(missing_ok=True)
        results[DETOKENIZER_ONNX] = f"skipped: no exact ONNX detokenizer for this tokenizer ({bpe_decoder})"
    return results


def write_tokenizer_graphs_cached(artifact_dir: Path, tokenizer_files: tuple[str, ...], log=print) -> dict[str, str]:
    """write_tokenizer_graphs, its graphs kept for the next build with the same tokenizer files
    (pipeline/derived_cache.py: checking Gemma 3's takes ~40 s, a session and its whole vocabulary)."""
    import ortllm.runtime.tokenizer as runtime_tokenizer

    from . import tokenizer as pipeline_tokenizer
    from .derived_cache import cached, code_salt

    def make(d: Path):
        results = write_tokenizer_graphs(d)
        return results, [name for name, r in results.items() if r == WRITTEN]

    salt = code_salt(__file__, pipeline_tokenizer.__file__, runtime_tokenizer.__file__,
                     dists=("onnxruntime-extensions", "onnxruntime", "tokenizers", "onnx"))
    parts = [salt] + [f"{name}\0{hashlib.sha256((Path(artifact_dir) / name).read_bytes()).hexdigest()}"
                      for name in sorted(tokenizer_files)]
    return cached("tokenizer-graphs", parts, Path(artifact_dir), make, log)


def _write_first_exact(path: Path, candidates, check) -> str:
    """Save the first candidate graph whose outputs match; else remove path and say why."""
    failures = []
    for name, build in candidates:
        try:
            model = build()
            mismatch = check(model)
        except Exception as e:  # a converter or session that refuses this tokenizer
            mismatch = f"{type(e).__name__}: {str(e)[-300:]}"
        if mismatch is None:
            onnx.save_model(model, str(path))
            return WRITTEN
        failures.append(f"{name}: {mismatch}")
    path.unlink(missing_ok=True)
    return "skipped: not exact; " + "; ".join(failures)


def _bpe_decoder_reason(spec: dict) -> str | None:
    """None when tokenizer.json is a byte-level BPE (GPT-2's byte alphabet, a ByteLevel decoder) whatever splits
    its text (GPT-2's regex, or Llama 3's / Qwen2's / tekken's as a Split): BpeDecoder decodes it; else what differs."""
    model, dec = spec.get("model", {}), spec.get("decoder")
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix"):
        return "model is not a plain BPE"
    if not (dec and dec.get("type") == "ByteLevel"):
        return f"decoder is {(dec or {}).get('type')}, not ByteLevel"
    if any(isinstance(m, list) for m in model.get("merges", [])):
        return "merges are stored as pairs"
    return None


def _byte_level_reason(spec: dict) -> str | None:
    """None when tokenizer.json is a GPT-2 style byte-level BPE (GPT2Tokenizer encodes it), else what differs."""
    pre, norm = spec.get("pre_tokenizer"), spec.get("normalizer")
    if (reason := _bpe_decoder_reason(spec)) is not None:
        return reason
    if not (pre and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
            and not pre.get("add_prefix_space")):
        return f"pre_tokenizer is {(pre or {}).get('type')}, not GPT-2 ByteLevel"
    if norm and not (norm.get("type") == "Sequence" and not norm.get("normalizers")):
        return f"has a {norm.get('type')} normalizer"
    return None


# ------------------------------------------------------------------------------------------ builders


def _model(nodes: list[onnx.NodeProto], inputs, outputs, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    return helper.make_model(graph, ir_version=_IR_VERSION, opset_imports=[
        helper.make_opsetid("", _OPSET), helper.make_opsetid(_DOMAIN, 1)])


def _encoder_io():
    return ([helper.make_tensor_value_info("input_text", TensorProto.STRING, ["N"])],
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "L"]),
             helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "L"])])


def _gpt2_encoder(spec: dict) -> onnx.ModelProto:
    """input_text[N] --GPT2Tokenizer--> input_ids[N, L], attention_mask[N, L]"""
    added = "\n".join(f"{t['content']}={t['id']}" for t in spec.get("added_tokens", []))
    node = helper.make_node(
        "GPT2Tokenizer", ["input_text"], ["input_ids", "attention_mask"], name="/tokenizer/GPT2Tokenizer",
        domain=_DOMAIN, vocab=json.dumps(spec["model"]["vocab"], ensure_ascii=False, separators=(",", ":")),
        merges="\n".join(spec["model"]["merges"]), added_token=added, model_name="GPT2")
    return _model([node], *_encoder_io(), "tokenizer")


def _hf_json_encoder(spec: dict, config: str) -> onnx.ModelProto:
    """input_text[N] --HfJsonTokenizer (tokenizer.json embedded)--> input_ids[N, L]

    The op adds BOS/EOS as the post-processor and tokenizer_config.json's add_bos_token / add_eos_token say; the
    graph's contract is Tokenizer.encode's (nothing added), so the embedded copies have neither (Llama 3's GGUF
    adds BOS)."""
    config = json.dumps(json.loads(config) | {"add_bos_token": False, "add_eos_token": False}, ensure_ascii=False)
    spec = {k: v for k, v in spec.items() if k != "post_processor"}
    node = helper.make_node(
        "HfJsonTokenizer", ["input_text"], ["input_ids"], name="/tokenizer/HfJsonTokenizer", domain=_DOMAIN,
        tokenizer_vocab=json.dumps(spec, ensure_ascii=False), tokenizer_config=config)
    inputs, outputs = _encoder_io()
    return _model([node], inputs, outputs[:1], "tokenizer")


def _bpe_decoder(spec: dict) -> onnx.ModelProto:
    """Byte-level BpeDecoder, guarded: the op dies with SIGFPE on an empty input, so an If answers "".

        ids ─Size─> n ─Equal(0)─> empty ─If─┬─ then: Constant [""]
                                             └─ else: BpeDecoder(ids) ──> str[1]
    """
    vocab = {i: t for t, i in spec["model"]["vocab"].items()}
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    vocab.update({i: t["content"] for i, t in added.items()})
    n_ids = max(vocab) + 1
    decoder = helper.make_node(
        "BpeDecoder", ["ids"], ["decoded"], name="/detokenizer/BpeDecoder", domain=_DOMAIN,
        id_vocab="\n".join(vocab.get(i, "") for i in range(n_ids)),
        byte_decoder="\n".join(f"{ord(c)}\t{b}" for b, c in enumerate(_bytes_to_unicode())),
        added_tokens="\n".join(f"{i}\t{t['content']}" for i, t in sorted(added.items())),
        all_special_ids="\n".join(str(i) for i, t in sorted(added.items()) if t["special"]),
        skip_special_tokens=1)
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.STRING, [1])  # noqa: E731
    empty = helper.make_node("Constant", [], ["empty_str"], name="/detokenizer/empty",
                             value=helper.make_tensor("empty", TensorProto.STRING, [1], [b""]))
    then_g = helper.make_graph([empty], "if_empty", [], [out("empty_str")])
    else_g = helper.make_graph([decoder], "if_tokens", [], [out("decoded")])
    nodes = [
        helper.make_node("Size", ["ids"], ["n"], name="/detokenizer/Size"),
        helper.make_node("Constant", [], ["zero"], name="/detokenizer/zero",
                         value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
        helper.make_node("Equal", ["n", "zero"], ["is_empty"], name="/detokenizer/Equal"),
        helper.make_node("If", ["is_empty"], ["str"], name="/detokenizer/If", then_branch=then_g,
                         else_branch=else_g),
    ]
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, None)], [out("str")],
                  "detokenizer")


# ------------------------------------------------------------------------------------------ checks


def _session(model: onnx.ModelProto):
    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    options.log_severity_level = 4  # a candidate that fails is reported in the result, not on stderr
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _check_encoder(model: onnx.ModelProto, tok: Tokenizer, texts: list[str], spec: dict) -> str | None:
    session = _session(model)
    if _bpe_decoder_reason(spec) is None:
        # every whole-character token, as text: each chunk's tokens glued into one string
        texts = texts + [tok.decode(ids, skip_special_tokens=False) for ids in _vocab_chunks(spec)]
    for text in texts:
        ids = session.run(None, {"input_text": np.array([text])})[0].reshape(-1).tolist()
        expected = tok.encode(text)
        if ids != expected:
            return f"encode({text[:40]!r}) gave {ids[:12]}..., expected {expected[:12]}..."
    batch = session.run(None, {"input_text": np.array(texts[:3])})
    for row, text in enumerate(texts[:3]):
        expected = tok.encode(text)
        if batch[0][row, : len(expected)].tolist() != expected:
            return f"batched encode of {text[:40]!r} differs"
    return None


def _vocab_chunks(spec: dict, chunk: int = 256) -> list[list[int]]:
    """The base-vocabulary tokens that are whole UTF-8 characters without NUL, in chunks of ids."""
    byte_of = {c: b for b, c in enumerate(_bytes_to_unicode())}
    ids = []
    for token, i in spec["model"]["vocab"].items():
        try:
            text = bytes(byte_of[c] for c in token).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        if "\0" not in text:
            ids.append(i)
    ids.sort()
    return [ids[i:i + chunk] for i in range(0, len(ids), chunk)]


def _check_decoder(model: onnx.ModelProto, tok: Tokenizer, texts: list[str], spec: dict) -> str | None:
    session = _session(model)
    cases = [tok.encode(t) for t in texts] + [[]] + _vocab_chunks(spec)
    for ids in cases:
        expected = tok.decode(ids, skip_special_tokens=True)
        for arr in (np.array(ids, dtype=np.int64), np.array([ids], dtype=np.int64)):
            got = session.run(None, {"ids": arr})[0].reshape(-1)[0]
            if got != expected:
                return f"decode({ids[:8]}...) gave {got[:40]!r}, expected {expected[:40]!r}"
    return None
