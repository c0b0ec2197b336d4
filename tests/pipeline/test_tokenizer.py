"""The artifact tokenizer: GGUF -> tokenizer.json equals transformers' GGUF tokenizer; byte and HF-dir
tokenizers; ONNX tokenizer graphs equal the runtime Tokenizer. Real files, no mocks.

Reference: AutoTokenizer.from_pretrained(dir, gguf_file=...) (offline). Where we follow the GGUF instead
of transformers (BOS not added, eos_token = <|im_end|>, no clean-up of spaces) the test says so.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ortllm.pipeline.tokenizer import (
    TokenizerError,
    write_byte_tokenizer,
    write_tokenizer_from_gguf,
    write_tokenizer_from_hf,
)
from ortllm.runtime.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    " Hello world ",
    "  leading and trailing spaces   ",
    "\n\nnewlines\n\n\nand more\n",
    "tabs\tand\t\tmixed \t whitespace",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }',
    "import numpy as np\nx = np.arange(12).reshape(3, 4)  # comment",
    "12345 678.90 3.14159 1e-10 0x1F 1,000,000",
    "x  1 and  22 and   333",
    "Prices: $19.99, €5, ¥1000, £3.50",
    "日本語のテキストと中文文本，还有한국어 텍스트",
    "Emoji: 😀🎉👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷",
    "Ünïcödé äccents: café naïve résumé Ångström",
    "Русский текст и ελληνικά",
    "مرحبا بالعالم",
    "Mathematical: ∀x∈ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "text<|im_end|>text <|im_start|> spaced <|endoftext|>",
    "<repo_name>ortllm<file_sep>main.py<filename>x.py<gh_stars>10",
    "<|im_start <|im_end| |im_start|>",
    "don't can't won't it's I'm we've they're he'd I'll",
    "A , b . c ' s don 't",
    "ALLCAPS lowercase MiXeD CamelCaseWord snake_case_word kebab-case-word",
    "https://example.com/path?query=1&b=2#frag",
    "user@example.com (555) 123-4567",
    "     ",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    "a" * 50,
    "!!!???...,,,;;;:::",
    "```python\nprint('hi')\n```",
    "\r\nWindows line endings\r\n",
    'JSON: {"key": [1, 2, 3], "nested": {"a": null}}',
    "ſtraße ﬁ ﬀ Ⅻ ①",
    "",
    " ",
    "The quick brown fox jumps over the lazy dog. " * 3,
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2 + 2 = ?"}],
    [{"role": "user", "content": "Écris un haïku 🙂"}, {"role": "assistant", "content": "Vent d'automne\n..."},
     {"role": "user", "content": "Encore <|im_end|> une fois"}],
]


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def smollm2_reader(smollm2_gguf):
    from gguf import GGUFReader

    return GGUFReader(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(smollm2_reader, tmp_path_factory):
    """tokenizer files + ONNX graphs for SmolLM2, written once per session; (dir, info, graph results)."""
    from ortllm.pipeline.tokenizer_graphs import write_tokenizer_graphs

    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    info = write_tokenizer_from_gguf(smollm2_reader, out)
    return out, info, write_tokenizer_graphs(out)


@pytest.fixture(scope="session")
def hf_reference(smollm2_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def ours(smollm2_tokenizer_dir):
    return Tokenizer.from_dir(smollm2_tokenizer_dir[0])


def _ort_session(path: Path):
    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- GGUF vs transformers


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_gguf_tokenizer_encodes_and_decodes_like_transformers(text, ours, hf_reference):
    ids = ours.encode(text)
    assert ids == hf_reference(text, add_special_tokens=False).input_ids
    for skip in (True, False):
        expected = hf_reference.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
        assert ours.decode(ids, skip_special_tokens=skip) == expected
    assert ours.decode(ids, skip_special_tokens=False) == text, "byte-level BPE round-trips any text"


def test_gguf_tokenizer_json_loaded_by_transformers_matches_too(smollm2_tokenizer_dir, hf_reference):
    """A transformers user loading our files gets the same ids (tokenizer_class GPT2Tokenizer)."""
    from transformers import AutoTokenizer

    fast = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir[0]))
    for text in TEXTS:
        assert fast(text).input_ids == hf_reference(text, add_special_tokens=False).input_ids
    assert fast.eos_token == "<|im_end|>" and fast.bos_token == "<|im_start|>"


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["user", "system", "multi-turn"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(conversation, add_generation_prompt, ours, hf_reference):
    expected = hf_reference.apply_chat_template(conversation, tokenize=False,
                                                add_generation_prompt=add_generation_prompt)
    text = ours.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
    assert text == expected
    assert ours.encode(text) == hf_reference(text, add_special_tokens=False).input_ids


def test_gguf_tokenizer_info_follows_the_gguf(smollm2_tokenizer_dir, smollm2_reader):
    out, info, _ = smollm2_tokenizer_dir
    assert info.vocab_size == 49152
    assert info.bos_token_id == 1 and info.eos_token_ids == (2,) and info.pad_token_id == 2
    assert info.chat_template == smollm2_reader.fields["tokenizer.chat_template"].contents()
    assert set(info.files) == {"tokenizer.json", "tokenizer_config.json"}
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<|im_start|>" and config["eos_token"] == "<|im_end|>"
    assert config["chat_template"] == info.chat_template
    assert config["add_bos_token"] is False
    assert len(config["added_tokens_decoder"]) == 17, "the 17 control tokens of SmolLM2"
    tok = Tokenizer.from_dir(out)
    # GGUF add_bos_token = false: nothing added (transformers' GGUF loader would add <|im_start|>)
    assert tok.encode("Hi", add_special_tokens=True) == tok.encode("Hi")
    assert tok.token_to_id("<|im_end|>") == 2 and tok.id_to_token(2) == "<|im_end|>"


def test_gguf_tokenizer_files_are_deterministic(smollm2_reader, smollm2_tokenizer_dir, tmp_path):
    """Same GGUF, same bytes: artifact hashes depend on it. (Paths are accepted too: see the tiny GGUFs.)"""
    info = write_tokenizer_from_gguf(smollm2_reader, tmp_path)
    for name in info.files:
        a, b = (tmp_path / name).read_bytes(), (smollm2_tokenizer_dir[0] / name).read_bytes()
        assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest(), name


def test_runtime_tokenizer_on_smollm2(ours):
    tok = ours
    assert tok.vocab_size == 49152 and tok.bos_token_id == 1 and tok.eos_token_ids == (2,)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids.count(2) == 2 and ids[-1] == tok.token_to_id("Ċ") == 198
    assert tok.decode(ids) == prompt.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False) \
        == prompt[: -len("<|im_start|>assistant\n")]


# ------------------------------------------------------------------------------------ error cases


def _tiny_gguf(path: Path, tokenizer_model: str | None, pre: str | None = None) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    if tokenizer_model is not None:
        writer.add_tokenizer_model(tokenizer_model)
        if pre is not None:
            writer.add_tokenizer_pre(pre)
        writer.add_token_list(["a", "b", "ab"])
        writer.add_token_merges(["a b"])
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_with_an_unsupported_tokenizer_is_refused_by_name(tmp_path):
    path = _tiny_gguf(tmp_path / "wpm.gguf", "bert")
    with pytest.raises(TokenizerError, match="'bert' is not supported; supported: byte-level BPE") as e:
        write_tokenizer_from_gguf(path, tmp_path / "out")
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    with pytest.raises(TokenizerError, match="a score per token"):          # SentencePiece without scores
        write_tokenizer_from_gguf(_tiny_gguf(tmp_path / "spm.gguf", "llama"), tmp_path / "out")


def test_tiny_sentencepiece_gguf_merges_by_score(tmp_path):
    """A SentencePiece BPE GGUF (tokenizer.ggml.model "llama"): the pair whose merged piece scores highest merges
    first, a space is U+2581 (with the prefix space llama.cpp adds by default), unknown bytes fall back to <0xNN>
    pieces, and decode undoes all three."""
    from gguf import GGUFWriter
    pieces = ["<unk>", "<s>", "</s>", "<0x21>", "\u2581", "a", "b", "c", "\u2581a", "bc", "ab", "ca"]
    types = [2, 3, 3, 6] + [1] * 8
    scores = [0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0]   # bc before ab
    path = tmp_path / "spm.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = write_tokenizer_from_gguf(path, tmp_path / "out")
    tok = Tokenizer.from_dir(tmp_path / "out")
    assert info.vocab_size == 12 and info.eos_token_ids == (2,)
    # "abc": "▁a"(8) + "bc"(9); never "▁ab": not a piece. "!" is byte 0x21 -> <0x21> (3)
    assert tok.encode("abc!") == [8, 9, 3]
    assert tok.decode(tok.encode("abc! ab")) == "abc! ab"


def test_gguf_without_tokenizer_or_with_unknown_pre_is_refused(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer"):
        write_tokenizer_from_gguf(_tiny_gguf(tmp_path / "none.gguf", None), tmp_path / "out")
    with pytest.raises(TokenizerError, match="'chatglm-bpe' is not supported .*llama-bpe.*qwen2.*tekken"):
        write_tokenizer_from_gguf(_tiny_gguf(tmp_path / "glm.gguf", "gpt2", pre="chatglm-bpe"), tmp_path / "out")


def test_tiny_gpt2_gguf_builds(tmp_path):
    info = write_tokenizer_from_gguf(_tiny_gguf(tmp_path / "tiny.gguf", "gpt2", pre="gpt2"), tmp_path / "out")
    tok = Tokenizer.from_dir(tmp_path / "out")
    assert info.vocab_size == 3 and info.bos_token_id is None and info.chat_template is None
    assert tok.encode("abab") == [2, 2]


def test_missing_gguf_and_missing_hf_files_say_what_to_do(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        write_tokenizer_from_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    (tmp_path / "text.gguf").write_text("not a gguf")
    with pytest.raises(TokenizerError, match="not a readable GGUF"):
        write_tokenizer_from_gguf(tmp_path / "text.gguf", tmp_path / "out")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match="lacks tokenizer.json"):
        write_tokenizer_from_hf(tmp_path / "hf", tmp_path / "out")


# ---------------------------------------------------------------------------- byte and HF dir


def test_byte_tokenizer(tmp_path):
    info = write_byte_tokenizer(tmp_path, vocab_size=300)
    tok = Tokenizer.from_dir(tmp_path)
    assert info.vocab_size == tok.vocab_size == 300
    assert {tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")} == {256, 257, 258}
    assert info.bos_token_id == 257 and info.eos_token_ids == (258, 256) and info.pad_token_id == 256
    for text in TEXTS:
        ids = tok.encode(text)
        assert all(i < 300 for i in ids)
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("é") == [0xC3, 0xA9], "ids are the UTF-8 bytes"
    assert tok.encode("ab ab abc a ") == list(b"ab ab abc a "), "the filler pieces are never encoded"
    assert tok.decode([259, 260, 284, 285, 299]) == "a b z aa ao ", "every id past the specials decodes to text"
    prompt = tok.apply_chat_template(CONVERSATIONS[1])
    assert prompt == ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n2 + 2 = ?<|im_end|>\n"
                      "<|im_start|>assistant\n")
    assert tok.encode(prompt)[0] == 257
    with pytest.raises(TokenizerError, match="vocab_size must be >= 259"):
        write_byte_tokenizer(tmp_path / "small", vocab_size=258)


def test_hf_dir_is_copied(tmp_path):
    hf = tmp_path / "hf"
    write_byte_tokenizer(hf, vocab_size=259)
    config = json.loads((hf / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")  # as transformers >= 4.43 saves it: a separate file
    config["eos_token"] = {"content": "<|im_end|>", "special": True}
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    (hf / "chat_template.jinja").write_text(template)
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, 256]}))

    info = write_tokenizer_from_hf(hf, tmp_path / "out")
    assert set(info.files) == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert info.eos_token_ids == (258, 256) and info.bos_token_id == 257 and info.chat_template == template
    tok = Tokenizer.from_dir(tmp_path / "out")
    assert tok.chat_template == template and tok.eos_token_ids[0] == 258
    assert tok.decode(tok.encode("héllo <|im_end|>"), skip_special_tokens=True) == "héllo "


# ---------------------------------------------------------------------------------- ONNX graphs


def test_graphs_written_and_equal_to_the_tokenizer(smollm2_tokenizer_dir, ours):
    out, _, results = smollm2_tokenizer_dir
    assert results == {"tokenizer.onnx": "written", "detokenizer.onnx": "written"}
    enc, dec = _ort_session(out / "tokenizer.onnx"), _ort_session(out / "detokenizer.onnx")
    texts = TEXTS + [ours.apply_chat_template(c) for c in CONVERSATIONS]
    for text in texts:
        ids = ours.encode(text)
        assert enc.run(None, {"input_text": np.array([text])})[0].reshape(-1).tolist() == ids, text
        assert dec.run(None, {"ids": np.array(ids, dtype=np.int64)})[0].tolist() == [ours.decode(ids)], text
    batch = enc.run(None, {"input_text": np.array(TEXTS[:4])})
    for row, text in enumerate(TEXTS[:4]):
        n = len(ours.encode(text))
        assert batch[0][row, :n].tolist() == ours.encode(text) and batch[1][row].sum() == n


def test_byte_tokenizer_graphs(tmp_path):
    from ortllm.pipeline.tokenizer_graphs import write_tokenizer_graphs

    write_byte_tokenizer(tmp_path, vocab_size=259)
    assert write_tokenizer_graphs(tmp_path) == {"tokenizer.onnx": "written", "detokenizer.onnx": "written"}


def test_graphs_skipped_with_a_reason_for_a_non_byte_level_tokenizer(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from ortllm.pipeline.tokenizer_graphs import write_tokenizer_graphs

    tok = HFTokenizer(models.BPE({"▁a": 0, "b": 1, "<unk>": 2}, [], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "detokenizer.onnx").write_text("stale")
    results = write_tokenizer_graphs(tmp_path)
    assert results["detokenizer.onnx"].startswith("skipped:") and "Metaspace" in results["detokenizer.onnx"]
    assert not (tmp_path / "detokenizer.onnx").exists(), "a stale graph is removed"


def test_detokenizer_graph_survives_empty_input(smollm2_tokenizer_dir):
    """onnxruntime-extensions' BpeDecoder dies with SIGFPE on an empty input; our If guard answers ""."""
    from onnxruntime_extensions import get_library_path

    code = (  # in a child process: a crash must fail this test, not kill the session
        "import sys, numpy as np, onnxruntime as ort\n"
        "o = ort.SessionOptions(); o.register_custom_ops_library(sys.argv[2])\n"
        "s = ort.InferenceSession(sys.argv[1], o)\n"
        "for shape in [(0,), (1, 0)]:\n"
        "    assert s.run(None, {'ids': np.zeros(shape, np.int64)})[0].tolist() == [''], shape\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(smollm2_tokenizer_dir[0] / "detokenizer.onnx"),
                        get_library_path()], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
