"""Ollama's model management through the official `ollama` client against a live server on 127.0.0.1 with its
own store ($ORTLLM_HOME in a temporary directory): pull (a recipe built by `ortllm pull`, streamed and not),
copy, delete, create from a base with a LoRA adapter, a system message, parameters and a template, show, and
generation through what was pulled and created."""
from __future__ import annotations

import json

import ollama
import pytest
import requests

from ortllm.runtime.engine import Engine
from ortllm.runtime.sampling_params import SamplingParams
from ortllm.runtime.store import Store
from ortllm.service.config import ServiceConfig
from tests.reference.peft_lora import make_peft_lora
from tests.service.conftest import start_live, stop_live

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def store_live(tiny_engine, tmp_path_factory):
    """A live server on the tiny engine whose store is a fresh $ORTLLM_HOME."""
    home = tmp_path_factory.mktemp("ortllm-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORTLLM_HOME", str(home))
        live = start_live(tiny_engine, ServiceConfig(http_threads=16), num_blocks=128)
        yield live
        stop_live(live)


@pytest.fixture(scope="module")
def pulled(store_live):
    """llama-tiny-random pulled through the API (a recipe: built by `ortllm pull` in a child process)."""
    c = ollama.Client(host=store_live.url, timeout=600)
    lines = list(c.pull("llama-tiny-random", stream=True))
    return lines


@pytest.fixture(scope="module")
def peft_dir(tmp_path_factory):
    from ortllm.pipeline.sources import load_model
    out = tmp_path_factory.mktemp("lora") / "tuned"
    make_peft_lora(load_model("llama-tiny-random")[1], out, seed=5, r=8, targets=["q_proj", "v_proj", "o_proj"])
    return out


def _client(live) -> ollama.Client:
    return ollama.Client(host=live.url, timeout=600)


def test_pull_streams_progress_and_serves_the_model(store_live, pulled):
    statuses = [p.status for p in pulled]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success" and len(statuses) > 3, statuses
    assert any("engine graph" in s or "building" in s for s in statuses), statuses   # the build's own log lines
    assert Store().has(Store().resolve("llama-tiny-random"))
    c = _client(store_live)
    names = [m.model for m in c.list().models]
    assert "llama-tiny-random:latest" in names
    # the server's own model (the fixture's artifact) keeps the bare recipe name; the store's is NAME:latest
    r = c.generate(model="llama-tiny-random:latest", prompt="hello", options={"temperature": 0, "num_predict": 6})
    assert r.done and r.eval_count == 6 or r.done_reason == "stop"
    assert "llama-tiny-random:latest" in [m.model for m in c.ps().models]          # loaded on its first request
    again = c.pull("llama-tiny-random:latest")                                     # stream: false, in the store
    assert again.status == "success"
    raw = store_live.post("/api/pull", json={"model": "llama-tiny-random", "stream": False})
    assert raw.status_code == 200 and raw.json() == {"status": "success"}


def test_copy_and_delete(store_live, pulled):
    c = _client(store_live)
    assert c.copy("llama-tiny-random", "tiny-copy").status == "success"
    assert "tiny-copy:latest" in Store().names()
    shown = c.show("tiny-copy")                          # from its manifest: show does not load it
    assert shown.details.family == "llama" and shown.details.quantization_level
    assert "tiny-copy:latest" not in [m.model for m in c.ps().models]
    r = c.generate(model="tiny-copy", prompt="hello", options={"temperature": 0, "num_predict": 4})
    base = c.generate(model="llama-tiny-random:latest", prompt="hello", options={"temperature": 0, "num_predict": 4})
    assert r.response == base.response
    assert c.delete("tiny-copy").status == "success"
    assert "tiny-copy:latest" not in Store().names()
    assert "tiny-copy:latest" not in [m.model for m in c.list().models]
    with pytest.raises(ollama.ResponseError) as e:
        c.delete("tiny-copy")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="tiny-copy", prompt="x", stream=False)
    assert e.value.status_code == 404
    assert Store().has(Store().resolve("llama-tiny-random"))       # the other name keeps the files


def test_create_with_adapter_system_parameters_and_template(store_live, pulled, peft_dir):
    c = _client(store_live)
    adapters = {f.name: c.create_blob(f) for f in sorted(peft_dir.iterdir()) if f.is_file()}   # as PEFT saved it
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(adapters)
    assert requests.head(f"{store_live.url}/api/blobs/{adapters['adapter_config.json']}", timeout=10).status_code == 200
    assert requests.head(f"{store_live.url}/api/blobs/sha256:{'2' * 64}", timeout=10).status_code == 404
    statuses = [p.status for p in c.create(model="tuned", from_="llama-tiny-random", adapters=adapters,
                                           system="You are terse.", template=TEMPLATE,
                                           parameters={"temperature": 0, "num_predict": 5}, stream=True)]
    assert statuses[-1] == "success" and any("adapter" in s for s in statuses), statuses
    assert "tuned:latest" in [m.model for m in c.list().models]

    # the created model answers with its adapter: the same tokens as the engine given that adapter directly
    r = c.generate(model="tuned", prompt="The sky is", raw=True)               # num_predict 5, temperature 0
    assert r.eval_count == 5
    path = Store().path("tuned")
    with Engine.from_artifact(path, num_blocks=64) as engine:
        want = engine.generate(["The sky is"], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True,
                                                              adapter="tuned"))[0]
        plain = engine.generate(["The sky is"], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
        rendered = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                        add_generation_prompt=True)
    assert r.response == want.text and want.token_ids != plain.token_ids
    assert rendered == "<|user|>hi\n<|assistant|>"                 # the template is the artifact's chat template

    # its system message applies when a request sends none, and a request's own options win
    msgs = [{"role": "user", "content": "hi"}]
    default = c.chat(model="tuned", messages=msgs)
    explicit = c.chat(model="tuned", messages=[{"role": "system", "content": "You are terse."}, *msgs])
    assert default.message.content == explicit.message.content
    assert default.prompt_eval_count == explicit.prompt_eval_count > c.chat(
        model="tuned", messages=[{"role": "system", "content": ""}, *msgs]).prompt_eval_count
    assert c.chat(model="tuned", messages=msgs, options={"num_predict": 2}).eval_count <= 2

    shown = c.show("tuned")
    assert shown.details.parent_model == "llama-tiny-random:latest"
    assert shown.capabilities == ["completion", "tools", "embedding"]
    assert "ADAPTER tuned" in shown.modelfile and 'SYSTEM """You are terse."""' in shown.modelfile
    assert "temperature 0" in shown.parameters and "num_predict 5" in shown.parameters
    assert shown.template == TEMPLATE and shown.modelinfo["general.architecture"] == "llama"

    # served alone (`ortllm serve tuned`), its requests carry the adapter and the defaults too
    single = start_live(path, ServiceConfig(model_name="tuned:latest"), num_blocks=64)
    try:
        alone = _client(single)
        assert alone.generate(model="tuned:latest", prompt="The sky is", raw=True).response == want.text
        assert alone.chat(model="tuned:latest", messages=msgs).message.content == default.message.content
    finally:
        stop_live(single)


def test_management_errors(store_live, pulled):
    c = _client(store_live)
    with pytest.raises(ollama.ResponseError) as e:
        c.pull("/no/such/file.gguf")            # outside the allowed roots (default: the store)
    assert e.value.status_code == 403 and "--allowed-path" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        c.pull(str(Store().home / "no/such/file.gguf"))
    assert e.value.status_code == 400 and "no/such" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        c.create(model="x", from_="no-such-base")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        c.create(model="x", from_="llama-tiny-random", template="{{ .Prompt }}")
    assert e.value.status_code == 400 and "Jinja" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        c.create(model="x", from_="llama-tiny-random", adapters={"adapter_model.safetensors": "sha256:" + "0" * 64})
    assert e.value.status_code == 400 and "blobs" in str(e.value)
    with pytest.raises(ollama.ResponseError) as e:
        c.copy("no-such-model", "y")
    assert e.value.status_code == 404
    bad = requests.post(store_live.url + "/api/blobs/sha256:" + "1" * 64, data=b"not that", timeout=30)
    assert bad.status_code == 400 and "sha256" in bad.json()["error"]["message"]
    # the pulled base goes (the created model keeps the files it shares); the server's own model stays
    assert c.delete("llama-tiny-random").status == "success"
    assert "llama-tiny-random:latest" not in Store().names() and Store().has(Store().resolve("tuned"))
    assert c.generate(model=store_live.model, prompt="x", options={"num_predict": 2}).done
    assert c.generate(model="tuned", prompt="x", options={"num_predict": 2}).done
    assert json.loads(store_live.get("/openapi.json").text)["paths"]["/api/create"]["post"]["requestBody"]
