"""bench/peers/gguf_export.py keeps the tokenizer directory's chat template: without tokenizer.chat_template a GGUF
it writes makes llama-server chat with its own default template and `ortllm pull` of the file cannot `--chat`.
The writer runs here in process (it needs numpy, gguf and safetensors only); the template is read back by the
gguf package, as ortllm's GGUF tokenizer reader (pipeline/tokenizer.py) reads it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gguf
import pytest

from ortllm.pipeline.optimum_export import write_hf_dir
from ortllm.pipeline.sources import load_model
from tests.test_bench import _peer_script, _peers_python_with

PEERS = Path(__file__).resolve().parents[1] / "bench" / "peers"
JINJA = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _gguf_export():
    """bench/peers/gguf_export.py by path (it is not a package)."""
    spec = importlib.util.spec_from_file_location("gguf_export", PEERS / "gguf_export.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> tuple[Path, str]:
    """llama-tiny-random's transformers directory with its tokenizer, and the chat template its
    tokenizer_config.json holds."""
    hf = tmp_path_factory.mktemp("hf") / "llama-tiny-random" / "hf"
    _, w = load_model("llama-tiny-random")
    w.write_tokenizer(hf)
    write_hf_dir(w, hf)
    template = json.loads((hf / "tokenizer_config.json").read_text())["chat_template"]
    assert template, "llama-tiny-random's tokenizer has no chat template to carry"
    return hf, template


def _template_in(path: Path) -> str:
    """tokenizer.chat_template as the gguf package reads it."""
    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    assert field is not None, f"{path.name} has no tokenizer.chat_template"
    return field.contents()


def test_the_f32_gguf_carries_the_tokenizer_configs_chat_template(tiny_hf, tmp_path):
    hf, template = tiny_hf
    out = _gguf_export().write_gguf(hf, tmp_path / "f32.gguf", "f32")
    assert _template_in(out) == template


def test_a_chat_template_jinja_file_is_carried_too(tiny_hf, tmp_path):
    """A tokenizer directory (--tokenizer) whose template is chat_template.jinja, as newer transformers save it."""
    hf, _ = tiny_hf
    tok = tmp_path / "tokenizer"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tok / name).write_bytes((hf / name).read_bytes())
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tok / "chat_template.jinja").write_text(JINJA)
    out = _gguf_export().write_gguf(hf, tmp_path / "f16.gguf", "f16", tokenizer=tok)
    assert _template_in(out) == JINJA


def test_llama_cpps_quantizer_keeps_the_template(tiny_hf, tmp_path):
    """The Q8_0 and Q4_1 files the peers serve are llama.cpp's quantizer run on the F32 file (peers' venv)."""
    hf, template = tiny_hf
    run = _peer_script(_peers_python_with("llama_cpp", "gguf", "safetensors"))
    f32 = tmp_path / "f32.gguf"
    run("gguf_export.py", hf, f32, "--type", "f32")
    for qtype in ("q8_0", "q4_1"):
        out = tmp_path / f"{qtype}.gguf"
        run("gguf_export.py", "--quantize", f32, out, "--type", qtype, "--threads", "1")
        assert _template_in(out) == template, qtype
