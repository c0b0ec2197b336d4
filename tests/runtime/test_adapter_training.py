"""`adapters train` in miniature (seconds): the loss falls, and the engine with the trained adapter gives
PEFT + transformers' greedy outputs on the held-out prompts."""
from __future__ import annotations

import json
import shutil

from ortllm.calibration.adapter_eval import peft_greedy_ids, task_accuracy
from ortllm.pipeline.adapter_train import TrainConfig, train_lora
from ortllm.runtime.adapter_files import add_adapter
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


def test_eval_suite_adapters_scores_trained_adapters(tiny_engine, tmp_path):
    """`ortllm adapters train` records the task; `ortllm eval --suite adapters` scores base vs adapter."""
    import subprocess
    import sys

    art = tmp_path / "art"
    shutil.copytree(tiny_engine, art)
    train = subprocess.run([sys.executable, "-m", "ortllm", "adapters", "train", str(art), "--task", "upper",
                            "--name", "up", "--rank", "4", "--steps", "10", "--batch", "4", "--eval", "8"],
                           capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr
    assert "upper accuracy on 8 held-out prompts: base" in train.stdout
    ev = subprocess.run([sys.executable, "-m", "ortllm", "eval", str(art), "--reference", str(tiny_engine),
                         "--suite", "adapters", "--out", str(tmp_path / "rep")], capture_output=True, text=True,
                        timeout=600)
    assert ev.returncode == 0, ev.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    up = report["adapters"]["up"]
    assert up["task"] == "upper" and up["n"] == 100 and 0.0 <= up["adapter_accuracy"] <= 1.0
    assert "| up | upper | 100 |" in (tmp_path / "rep" / "report.md").read_text()
