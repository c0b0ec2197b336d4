"""ortllm.runtime.tokenizer.Tokenizer over tokenizer dirs the pipeline wrote (byte tokenizer, a small
BPE GGUF with specials), and the base-install import rule (no torch, no transformers).
SmolLM2's real tokenizer is exercised through this class in tests/pipeline/test_tokenizer.py (built once)."""

from __future__ import annotations

import json
import subprocess
import sys

import jinja2
import numpy as np
import pytest

from ortllm.pipeline.tokenizer import write_byte_tokenizer, write_tokenizer_from_gguf
from ortllm.runtime.tokenizer import Tokenizer, TokenizerFilesError


@pytest.fixture(scope="session")
def byte_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("byte_tokenizer")
    write_byte_tokenizer(out, vocab_size=512)
    return out


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory):
    """A small gpt2-tokenizer GGUF: merges, a control token and a user-defined token."""
    from gguf import GGUFWriter

    from ortllm.pipeline.tokenizer import _bytes_to_unicode

    root = tmp_path_factory.mktemp("bpe_gguf")
    tokens = _bytes_to_unicode() + ["ĠĠ", "he", "ll", "hell", "hello", "Ġhello", "<|eot|>", "<tool>"]
    merges = ["Ġ Ġ", "h e", "l l", "he ll", "hell o", "Ġ hello"]
    types = [1] * (len(tokens) - 2) + [3, 4]
    w = GGUFWriter(str(root / "bpe.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|eot|>"))
    w.add_bos_token_id(tokens.index("<|eot|>"))
    w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}{{ m['content'] + eos_token }}{% endfor %}")
    w.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_tokenizer_from_gguf(root / "bpe.gguf", root / "tok")
    return root / "tok"


def test_byte_tokenizer_roundtrip_and_properties(byte_dir):
    tok = Tokenizer.from_dir(byte_dir)
    assert tok.vocab_size == 512 and tok.bos_token_id == 257 and tok.pad_token_id == 256
    assert tok.eos_token_ids == (258,)
    for text in ["", "héllo wörld", "日本 🙂\n\t  x", "<|im_start|>user\nhi<|im_end|>"]:
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("<|im_start|>a") == [257, ord("a")], "specials in the text are specials"
    assert tok.decode([257, ord("a"), 258]) == "a" and tok.decode([257, ord("a")], False) == "<|im_start|>a"
    assert tok.decode(np.array([104, 105])) == "hi", "numpy ids are fine"
    assert tok.id_to_token(ord("a")) == "a" and tok.token_to_id("<|im_end|>") == 258
    assert tok.token_to_id("not a token") is None


def test_bpe_gguf_merges_specials_and_bos(bpe_dir):
    tok = Tokenizer.from_dir(bpe_dir)
    eot, tool = tok.token_to_id("<|eot|>"), tok.token_to_id("<tool>")
    assert tok.encode("hello  hello") == [tok.token_to_id("hello"), tok.token_to_id("Ġ"),
                                           tok.token_to_id("Ġhello")]
    assert tok.encode("hello<|eot|>") == [tok.token_to_id("hello"), eot]
    assert tok.encode("a<tool>b") == [ord("a"), tool, ord("b")], "user-defined tokens are matched whole"
    # GGUF add_bos_token = true: BOS only when asked
    assert tok.encode("hello", add_special_tokens=True) == [eot, tok.token_to_id("hello")]
    assert tok.decode([tok.token_to_id("hello"), eot, tool]) == "hello<tool>", "control skipped, user kept"
    assert tok.eos_token_ids == (eot,) and tok.bos_token_id == eot
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi<|eot|>"


def test_chat_template_semantics(tmp_path):
    """Same environment as transformers: sandboxed, trim/lstrip blocks, raise_exception, tojson, tokens."""
    write_byte_tokenizer(tmp_path, vocab_size=259)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be the user') }}{% endif %}\n"
        "{% for m in messages %}\n"
        "{{ bos_token }}{{ m | tojson }}{{ eos_token }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}>{% endif %}"
    )
    config_path.write_text(json.dumps(config))
    tok = Tokenizer.from_dir(tmp_path)
    out = tok.apply_chat_template([{"role": "user", "content": "é <b>"}])
    assert out == '<|im_start|>{"role": "user", "content": "é <b>"}<|im_end|>\n>'
    with pytest.raises(jinja2.TemplateError, match="first message must be the user"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    config["chat_template"] = "{{ ''.__class__.__mro__ }}"
    config_path.write_text(json.dumps(config))
    with pytest.raises(jinja2.exceptions.SecurityError):
        Tokenizer.from_dir(tmp_path).apply_chat_template([])


def test_missing_files_and_missing_template(tmp_path):
    with pytest.raises(TokenizerFilesError, match="lacks tokenizer.json and tokenizer_config.json"):
        Tokenizer.from_dir(tmp_path)
    write_byte_tokenizer(tmp_path, vocab_size=259)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerFilesError, match="no chat template"):
        Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_clean_up_tokenization_spaces_when_the_config_asks(tmp_path):
    write_byte_tokenizer(tmp_path, vocab_size=259)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["clean_up_tokenization_spaces"] = True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.decode(tok.encode("a , b . it 's")) == "a, b. it's"


def test_import_pulls_in_neither_torch_nor_transformers():
    code = ("import sys, ortllm.runtime.tokenizer; "
            "bad = [m for m in ('torch', 'transformers', 'onnxruntime_extensions') if m in sys.modules]; "
            "assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
