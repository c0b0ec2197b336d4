"""`adapters train` in miniature (seconds): the loss falls, and the engine with the trained adapter gives
PEFT + transformers' greedy outputs on the held-out prompts."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ortllm.calibration.adapter_eval import peft_greedy_ids, task_accuracy
from ortllm.pipeline.adapter_train import TrainConfig, train_lora
from ortllm.runtime.adapter_files import add_adapter
from ortllm.runtime.engine import Engine
from tests.artifact_copies import ONNX_READS, linked_copy
from tests.cli_run import ortllm


def test_train_tiny_adapter_and_serve_it(tiny_engine, tmp_path):
    from peft import PeftModel

    from ortllm.pipeline.hf_model import hf_model_from_weights
    from ortllm.pipeline.sources import load_model

    art = linked_copy(tiny_engine, tmp_path / "art", copied=ONNX_READS)
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
    art = linked_copy(tiny_engine, tmp_path / "art", copied=ONNX_READS)
    train = ortllm("adapters", "train", art, "--task", "upper", "--name", "up", "--rank", "4", "--steps", "10",
                   "--batch", "4", "--eval", "8")
    assert train.returncode == 0, train.stderr
    assert "upper accuracy on 8 held-out prompts: base" in train.stdout
    ev = ortllm("eval", art, "--reference", tiny_engine, "--suite", "adapters", "--out", tmp_path / "rep")
    assert ev.returncode == 0, ev.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    up = report["adapters"]["up"]
    assert up["task"] == "upper" and up["n"] == 100 and 0.0 <= up["adapter_accuracy"] <= 1.0
    assert "| up | upper | 100 |" in (tmp_path / "rep" / "report.md").read_text()


# ---------------------------------------------------------------- training on your own data (--data FILE.jsonl)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def copy_artifact(tmp_path):
    """copy(src, name): a copy of a session artifact to add adapters to, removed after the test (SmolLM2's weights
    are 0.5 GB). A copy, not hard links: onnx refuses to read weights with several links (a DoRA's norms), and the
    session artifacts are shared with a parallel pytest run."""
    made = []

    def copy(src: Path, name: str) -> Path:
        made.append(shutil.copytree(src, tmp_path / name))
        return made[-1]
    yield copy
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def _worked_example() -> tuple[str, str, str]:
    """docs/adapters.md's worked example: (the Python that writes the data, the train command, the generate one)."""
    doc = (REPO / "docs" / "adapters.md").read_text()
    section = doc.split("### Worked example", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```([a-z]*)\n(.*?)```", section, re.S)
    lines = [ln for _, b in blocks for ln in b.splitlines()]
    return (next(b for lang, b in blocks if lang == "python"),
            next(ln for ln in lines if ln.startswith("ortllm adapters train ")),
            next(ln for ln in lines if ln.startswith("ortllm generate ")))


def test_docs_worked_example(smollm2_engine, tmp_path, monkeypatch, capsys, copy_artifact):
    """The docs' example as written: its data, its train command on an fp32 SmolLM2 engine artifact; the held-out
    loss falls, and greedy replies through the engine are the pirate's with the adapter and never without."""
    from ortllm.cli import main
    from ortllm.runtime.sampling_params import SamplingParams

    make_data, train, generate = _worked_example()
    monkeypatch.chdir(tmp_path)
    exec(compile(make_data, "docs/adapters.md", "exec"), {})
    art = copy_artifact(smollm2_engine, "smollm2")
    cpu0, wall0 = time.process_time(), time.time()
    # `make test` runs two pytest processes on 2 cores: one torch thread each is several times cheaper in CPU
    assert main(shlex.split(train)[1:] + ["--threads", "1"]) == 0
    train_out = capsys.readouterr()
    words = shlex.split(generate)
    prompt = words[words.index("--prompt") + 1]
    greedy = [SamplingParams(max_tokens=16, temperature=0.0), SamplingParams(max_tokens=16, temperature=0.0,
                                                                            adapter="pirate")]
    with Engine.from_artifact(art) as engine:
        tok = engine.tokenizer
        replies = []
        for p in (prompt, "What is the weather like today?"):
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
            replies.append([o.text for o in engine.generate([ids, ids], greedy)])
    cpu, wall = time.process_time() - cpu0, time.time() - wall0
    t = json.loads((art / "manifest.json").read_text())["adapters"]["pirate"]["train"]
    print(f"\nworked example (docs/adapters.md): held-out loss {t['eval_loss_before']:.4f} -> "
          f"{t['eval_loss_after']:.4f} ({t['eval_examples']} chats), training loss {t['loss_first']:.4f} -> "
          f"{t['loss_last']:.4f} in {t['steps']} steps; {cpu:.1f} s CPU, {wall:.1f} s wall (train, load, "
          f"generate)\n{train_out.out}" + "".join(f"base: {b!r}\npirate: {a!r}\n" for b, a in replies))
    assert t["eval_loss_after"] < 0.2 * t["eval_loss_before"], t
    for base, pirate in replies:
        assert pirate.startswith("Arr, matey! Ask the parrot."), replies
        assert "Arr" not in base and "parrot" not in base, replies
    assert not (tmp_path / ".ortllm-train").exists(), "the work directory goes once the adapter is added"


def _pirate_data(path: Path, n: int = 24) -> Path:
    rows = [{"messages": [{"role": "user", "content": f"question {i}?"},
                          {"role": "assistant", "content": "Arr!"}]} for i in range(n)]
    rows[3] = {"prompt": "question 3?", "completion": "Arr!"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _train_cmd(art: Path, data: Path, work: Path, *extra) -> list[str]:
    return [sys.executable, "-m", "ortllm", "adapters", "train", str(art), "--data", str(data), "--name", "arr",
            "--rank", "4", "--steps", "60", "--batch", "4", "--save-every", "5", "--threads", "1",
            "--work-dir", str(work), *extra]


def _checkpoint_step(work: Path) -> int:
    import torch
    return int(torch.load(work / "checkpoint.pt", weights_only=False)["step"])


def _files(art: Path) -> dict:
    return {p.relative_to(art): p.read_bytes() for p in art.rglob("*") if p.is_file()}


def test_interrupted_run_resumes_from_its_checkpoint(tiny_engine, tmp_path, copy_artifact):
    """Ctrl-C saves a checkpoint, a kill -9 leaves the last periodic one; each time the artifact is as it was, and
    the same command continues from the checkpoint's step to the adapter the uninterrupted run makes."""
    from ortllm.pipeline.adapter_train import TrainConfig, train_lora
    from ortllm.runtime.adapter_files import _read_safetensors

    import resource

    def cpu() -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + kids.ru_utime + kids.ru_stime

    import torch  # noqa: F401 - imported now, not by the first poll of the checkpoint while the run goes on

    cpu0 = cpu()
    art = copy_artifact(tiny_engine, "art")
    before = _files(art)
    data, work = _pirate_data(tmp_path / "arr.jsonl"), tmp_path / "work"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def run_until_checkpoint(sig, after_step: int) -> str:
        # Ctrl-C as a terminal's foreground job gets it: a test run started in the background (`make test &`,
        # a shell without job control) ignores SIGINT, and a child would inherit that and train on to the end
        proc = subprocess.Popen(_train_cmd(art, data, work), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.time() + 300
            while time.time() < deadline and proc.poll() is None:
                if (work / "checkpoint.pt").is_file() and _checkpoint_step(work) > after_step:
                    break
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it could be interrupted"
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode != 0
        assert _files(art) == before, "an interrupted run must leave the artifact as it was"
        return err

    err = run_until_checkpoint(signal.SIGINT, 0)
    step1 = _checkpoint_step(work)
    assert f"interrupted at step {step1}/60" in err and "resumes from the checkpoint" in err, err[-2000:]
    err = run_until_checkpoint(signal.SIGKILL, step1)
    assert f"resuming from the checkpoint at step {step1}/60" in err, err[-2000:]
    step2 = _checkpoint_step(work)
    assert step1 < step2 < 60 and step2 % 5 == 0
    done = subprocess.run(_train_cmd(art, data, work), capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming from the checkpoint at step {step2}/60" in done.stderr
    entry = json.loads((art / "manifest.json").read_text())["adapters"]["arr"]
    assert entry["train"]["steps"] == 60 and entry["train"]["eval_loss_after"] < entry["train"]["eval_loss_before"]
    assert not work.exists()

    cfg = TrainConfig(data=str(data), rank=4, steps=60, batch=4, threads=1)
    train_lora(art, tmp_path / "straight", cfg, log=lambda m: None)
    from ortllm.runtime.adapter_files import convert_peft
    from ortllm.runtime.artifact import read_manifest
    straight, _ = convert_peft(tmp_path / "straight", read_manifest(art).model, art)
    resumed = _read_safetensors(art / entry["file"])
    assert straight.keys() == resumed.keys()
    for k in straight:
        np.testing.assert_allclose(resumed[k], straight[k], rtol=1e-5, atol=1e-6, err_msg=k)
    print(f"\nresume: Ctrl-C at step {step1}, kill -9 after the checkpoint at step {step2}, finished at 60/60 with "
          f"the uninterrupted run's adapter; held-out loss {entry['train']['eval_loss_before']:.4f} -> "
          f"{entry['train']['eval_loss_after']:.4f}; {cpu() - cpu0:.1f} s CPU (3 runs and a straight one)")


def test_ctrl_c_inside_an_update_checkpoints_the_whole_step(tiny_engine, tmp_path, monkeypatch):
    """A Ctrl-C that lands inside the optimizer's update (the widest window of a step) is held to the step's end:
    the checkpoint's step counts every update its parameters had (the bug: it counted one fewer, and the resumed
    run did that update twice). A second Ctrl-C stops at once and writes no checkpoint of the half step."""

    import torch

    from ortllm.pipeline.adapter_train import TrainConfig, train_lora

    art = linked_copy(tiny_engine, tmp_path / "art", copied=ONNX_READS)
    data = _pirate_data(tmp_path / "arr.jsonl", 8)
    cfg = TrainConfig(data=str(data), rank=4, steps=8, batch=4, threads=1, save_every=100)
    real_step, updates = torch.optim.AdamW.step, []

    def step_then_ctrl_c(times: int):
        def step(self, *a, **kw):
            out = real_step(self, *a, **kw)
            updates.append(1)
            if len(updates) == 3:
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGINT)     # delivered here, inside the update, before it is counted
            return out
        return step

    logs = []
    before = signal.getsignal(signal.SIGINT)     # the default handler, or SIG_IGN in a job started in the background
    monkeypatch.setattr(torch.optim.AdamW, "step", step_then_ctrl_c(1))
    with pytest.raises(KeyboardInterrupt):
        train_lora(art, tmp_path / "out", cfg, work_dir=tmp_path / "work", log=logs.append)
    assert _checkpoint_step(tmp_path / "work") == len(updates) == 3, logs
    assert any("stopping at the end of this step" in m for m in logs), logs
    assert signal.getsignal(signal.SIGINT) == before, "the handler is put back"

    updates.clear()
    monkeypatch.setattr(torch.optim.AdamW, "step", step_then_ctrl_c(2))
    with pytest.raises(KeyboardInterrupt):
        train_lora(art, tmp_path / "out", cfg, work_dir=tmp_path / "work2", log=logs.append)
    assert not (tmp_path / "work2" / "checkpoint.pt").exists(), "a step cut in half is not checkpointed"


def test_failed_add_leaves_the_artifact_as_it_was(tiny_engine, tmp_path, monkeypatch):
    """A failure after the adapter file is in place but before the manifest lists it (here: the manifest cannot
    be written: the disk is full when the editor writes it) puts the replaced adapter (a DoRA, as --dora trains)
    back; the artifact still verifies."""
    import ortllm.runtime.artifact_editor as editor
    from ortllm.cli.adapter_train import add_atomically
    from ortllm.pipeline.adapter_train import TrainConfig, train_lora
    from ortllm.runtime.artifact import load_artifact

    art = linked_copy(tiny_engine, tmp_path / "art", copied=ONNX_READS)
    data = _pirate_data(tmp_path / "arr.jsonl", 8)
    for seed, out, dora in ((0, "first", True), (1, "second", False)):
        train_lora(art, tmp_path / out, TrainConfig(data=str(data), rank=4, steps=2, batch=4, threads=1, seed=seed,
                                                    dora=dora), log=lambda m: None)
    assert add_atomically(art, tmp_path / "first", "arr", force=False, meta={})["dora"] is True     # --dora
    before = _files(art)
    real_write = editor.atomic_write

    def disk_full(path, *a, **kw):                  # the manifest write fails, as on a full disk (ENOSPC)
        if Path(path).name == "manifest.json":
            raise OSError(28, "No space left on device", str(path))
        return real_write(path, *a, **kw)

    monkeypatch.setattr(editor, "atomic_write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        add_atomically(art, tmp_path / "second", "arr", force=True, meta={})
    monkeypatch.setattr(editor, "atomic_write", real_write)
    assert _files(art) == before
    load_artifact(art, verify=True, full=True)


def test_train_into_a_store_model(tiny_engine, tmp_path, monkeypatch, capsys):
    """A store name: the adapter goes into a new version of the same NAME:TAG; the old view is not edited."""
    from ortllm.cli import main
    from ortllm.runtime.store import ModelRef, Store

    monkeypatch.setenv("ORTLLM_HOME", str(tmp_path / "home"))
    store = Store()
    store.put(tiny_engine, ModelRef("tiny", "fp32"), source="llama-tiny-random")
    old_view = store.path("tiny:fp32")
    old_files = _files(old_view)
    data = _pirate_data(tmp_path / "arr.jsonl", 8)
    assert main(["adapters", "train", "tiny:fp32", "--data", str(data), "--name", "arr", "--rank", "4",
                 "--steps", "2", "--batch", "4", "--threads", "1"]) == 0, capsys.readouterr().err
    assert store.info(ModelRef("tiny", "fp32"))["adapters"] == ["arr"]
    assert store.path("tiny:fp32") != old_view and _files(old_view) == old_files
    assert not list((store.home / "tmp").glob("*")), "no staging or work directory is left in the store"
