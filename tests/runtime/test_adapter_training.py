"""`adapters train` in miniature (seconds): the loss falls, and the engine with the trained adapter gives
PEFT + transformers' greedy outputs on the held-out prompts."""
from __future__ import annotations

import json
import shutil

from ortllm.calibration.adapter_eval import peft_greedy_ids, task_accuracy
from ortllm.pipeline.adapter_train import TrainConfig, train_lora
from ortllm.pipeline.adapters import add_adapter
from ortllm.runtime.engine import Engine


def test_train_tiny_adapter_and_serve_it(tiny_engine, tmp_path):
    from peft import PeftModel

    from ortllm.pipeline.hf_model import hf_model_from_weights
    from ortllm.pipeline.sources import load_model

    art = tmp_path / "art"
    shutil.copytree(tiny_engine, art)
    cfg = TrainConfig(task="add", rank=8, steps=40, batch=8, n_train=200, lr=5e-3)
    info = train_lora(art, tmp_path / "peft", cfg, log=lambda m: None)
    assert info["loss_last"] < 0.7 * info["loss_first"], info
    add_adapter(art, tmp_path / "peft", "add-tiny")

    eos = tuple(json.loads((art / "generation.json").read_text())["eos_token_ids"])
    with Engine.from_artifact(art, num_blocks=256) as engine:
        base = task_accuracy(engine, "add", None, n=12)
        tuned = task_accuracy(engine, "add", "add-tiny", n=12)
        peft_model = PeftModel.from_pretrained(hf_model_from_weights(load_model("llama-tiny-random")[1]),
                                               tmp_path / "peft").eval()
        ref = peft_greedy_ids(peft_model, engine.tokenizer, "add", n=12, eos_ids=eos)
    assert tuned.token_ids == ref, "engine + adapter must give PEFT + transformers' greedy output"
    assert tuned.outputs != base.outputs, "the trained adapter should change the answers"
