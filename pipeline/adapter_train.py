"""`ortllm adapters train`: a LoRA (or DoRA) with PEFT on the CPU, on a JSONL file of chats or a generated task.

The base weights are the artifact's own fp32 source (its recipe, checked against the manifest's source hash); the
examples are rendered with the artifact's chat template and the loss covers the assistant turns only
(pipeline/train_data.py). A held-out split's loss is measured before and after. With a work directory the run
checkpoints every `save_every` steps and on Ctrl-C (atomically: written aside, then renamed), and a later run with
the same artifact, data and settings resumes from the checkpoint. Output: a PEFT directory that the runtime's
add_adapter converts into the artifact (cli/adapter_train.py joins the two).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ortllm.runtime import contract as C
from ortllm.runtime.artifact import read_manifest

from .errors import BuildError
from .train_config import ALL_TARGETS, TrainConfig
from .train_data import ChatEncoder, Example, batch_indices, collate, read_jsonl, split_eval, task_examples

__all__ = ["ALL_TARGETS", "TrainConfig", "train_lora", "run_key", "CHECKPOINT"]

CHECKPOINT = "checkpoint.pt"        # in the work directory: {key, step, total, trainable, optim, sched, losses, ...}
EVAL_BATCH = 8


def _base_weights(artifact: Path, base: str | None):
    from .sources import load_model

    manifest = read_manifest(artifact)
    spec = base or manifest.recipe
    if not spec:
        raise BuildError(f"{artifact} was built from a path, not a recipe; pass --base PATH (the same source)")
    _, weights = load_model(spec)
    if weights.source_sha256 != manifest.source_sha256:
        raise BuildError(f"--base {spec} is not the source this artifact was built from (sha256 differs)")
    return weights


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def _interrupt_at_step_end(log):
    """Hold a Ctrl-C to the end of the step it lands in: the step's update (optimizer, scheduler, loss list) is then
    whole, and the checkpoint written for it records the parameters of the step it names. Without this a Ctrl-C
    between opt.step() and the step count saved parameters one update ahead, and the resumed run did that update
    twice. Yields `pending()`: whether a Ctrl-C waits. A second Ctrl-C stops at once (no checkpoint is written for
    a step cut in half; the last periodic one stays). Off the main thread (no signal handlers there) it is a no-op."""
    asked = []

    def on_sigint(signum, frame):
        if asked:
            raise KeyboardInterrupt
        asked.append(True)
        log("Ctrl-C: stopping at the end of this step (Ctrl-C again stops now, without a checkpoint of it)")

    try:
        before = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:           # not the main thread: no handler to hold it with
        yield lambda: False
        return
    try:
        yield lambda: bool(asked)
    finally:
        signal.signal(signal.SIGINT, before)


def run_key(artifact: Path, cfg: TrainConfig) -> str:
    """What makes two runs the same one (a checkpoint of one resumes the other): the artifact's source weights and
    tokenizer, the data's bytes and every setting that changes the result (not threads, not save_every)."""
    manifest = read_manifest(artifact)
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("threads", "save_every", "data")}
    ident = {"source": manifest.source_sha256, "settings": settings,
             "tokenizer": {n: manifest.files.get(n, {}).get("sha256") for n in (C.TOKENIZER, C.TOKENIZER_CONFIG)},
             "data": _file_sha256(Path(cfg.data)) if cfg.data else None}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def load_examples(artifact: Path, cfg: TrainConfig) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples; every bad line of --data is reported here, before any weight is loaded."""
    from ortllm.runtime.tokenizer import Tokenizer

    artifact = Path(artifact)
    manifest = read_manifest(artifact)
    eos = json.loads((artifact / C.GENERATION).read_text())["eos_token_ids"]
    encoder = ChatEncoder(Tokenizer.from_dir(artifact), eos, manifest.model.max_position_embeddings)
    if cfg.data is not None:
        return split_eval(read_jsonl(Path(cfg.data), encoder), cfg.eval_split, cfg.seed)
    # a generated task has its own held-out prompts (calibration/adapter_tasks.py): up to 100 of them
    n_eval = min(100, max(1, round(cfg.eval_split * cfg.n_train))) if cfg.eval_split > 0 else 0
    held = task_examples(cfg.task, n_eval, "eval", cfg.seed, encoder) if n_eval else []
    return task_examples(cfg.task, cfg.n_train, "train", cfg.seed, encoder), held


def _eval_loss(model, examples: list[Example], pad_id: int) -> float | None:
    """Mean loss per answer token over the held-out examples (None when there are none)."""
    import torch

    if not examples:
        return None
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(examples), EVAL_BATCH):
            ids, labels, mask = collate(examples[i:i + EVAL_BATCH], pad_id)
            logits = model(input_ids=ids, attention_mask=mask).logits            # [B, L, V]
            target = labels[:, 1:]                                               # token t+1 from position t
            total += torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target.flatten(),
                                                       ignore_index=-100, reduction="sum").item()
            count += int((target != -100).sum())
    model.train(was_training)
    return total / max(count, 1)


def _save_checkpoint(work_dir: Path, state: dict) -> None:
    """torch.save aside, fsync, rename: a checkpoint is whole or absent, whenever the process dies."""
    import torch

    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = work_dir / f".{CHECKPOINT}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(work_dir / CHECKPOINT)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _load_checkpoint(work_dir: Path | None, key: str, log) -> dict | None:
    import torch

    path = work_dir / CHECKPOINT if work_dir is not None else None
    if path is None or not path.is_file():
        return None
    try:
        ckpt = torch.load(path, weights_only=False)
    except Exception as e:  # noqa: BLE001 - a damaged checkpoint is started over, not fatal
        log(f"the checkpoint {path} is unreadable ({type(e).__name__}); starting over")
        return None
    if ckpt.get("key") != key:
        log(f"the checkpoint in {work_dir} is of another run (other data, settings or model); starting over")
        return None
    return ckpt


def train_lora(artifact: Path, out_dir: Path, cfg: TrainConfig, base: str | None = None, log=print,
               work_dir: Path | None = None, progress: bool = False,
               examples: tuple[list[Example], list[Example]] | None = None) -> dict:
    """Train and save a PEFT LoRA into out_dir. work_dir: checkpoints (resumed when they are this run's);
    progress: a tqdm bar with the loss (else a log line every tenth of the run); examples: load_examples' result
    when the caller checked the data already. Returns {loss_first, loss_last (means of the first and last 10
    steps, a quarter of a shorter run), eval_loss_before, eval_loss_after, steps, resumed_from, examples,
    eval_examples, seconds, cpu_seconds, config}."""
    import torch

    artifact = Path(artifact)
    cfg = cfg.validate()
    train, held = examples or load_examples(artifact, cfg)
    total = cfg.total_steps(len(train))
    key = run_key(artifact, cfg)
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(artifact, Path(out_dir), cfg, base, log, work_dir, progress, train, held, total, key)
    finally:
        torch.set_num_threads(threads_before)


def _train(artifact, out_dir, cfg, base, log, work_dir, progress, train, held, total, key) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from tqdm import tqdm

    from .hf_model import hf_model_from_weights

    pad_id = int(json.loads((artifact / C.GENERATION).read_text())["eos_token_ids"][0])   # masked: any id does
    t0, cpu0 = time.time(), time.process_time()
    torch.manual_seed(cfg.seed)
    model = get_peft_model(hf_model_from_weights(_base_weights(artifact, base)),
                           LoraConfig(r=cfg.rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.targets),
                                      lora_dropout=0.0, use_dora=cfg.dora))
    model.train()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(list(trainable.values()), lr=cfg.lr, weight_decay=0.0)
    warmup = min(20, max(1, total // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / total))

    ckpt = _load_checkpoint(work_dir, key, log)
    if ckpt is not None:
        with torch.no_grad():
            for n, p in trainable.items():
                p.copy_(ckpt["trainable"][n])
        opt.load_state_dict(ckpt["optim"])
        sched.load_state_dict(ckpt["sched"])
        start, losses, eval_before = ckpt["step"], list(ckpt["losses"]), ckpt["eval_before"]
        log(f"resuming from the checkpoint at step {start}/{total} ({work_dir / CHECKPOINT})")
    else:
        start, losses = 0, []
        eval_before = _eval_loss(model, held, pad_id)
    if eval_before is not None:
        log(f"held-out loss before training: {eval_before:.4f} ({len(held)} examples)")

    def state(step: int) -> dict:
        return {"key": key, "step": step, "total": total, "losses": losses, "eval_before": eval_before,
                "trainable": {n: p.detach().clone() for n, p in trainable.items()},
                "optim": opt.state_dict(), "sched": sched.state_dict(), "config": asdict(cfg)}

    done, cut = start, False        # cut: a second Ctrl-C landed mid-step (half an update: no checkpoint of it)
    bar = tqdm(total=total, initial=start, desc="training", unit="step", disable=not progress, mininterval=0.5,
               dynamic_ncols=True)
    try:
        with _interrupt_at_step_end(log) as interrupt_pending:
            for step in range(start, total):
                try:
                    ids, labels, mask = collate(
                        [train[i] for i in batch_indices(len(train), cfg.batch, step, cfg.seed)], pad_id)
                    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    sched.step()
                    losses.append(loss.item())
                    done = step + 1
                except KeyboardInterrupt:
                    cut = True
                    raise
                if interrupt_pending():
                    raise KeyboardInterrupt
                bar.update(1)
                bar.set_postfix(loss=f"{np.mean(losses[-10:]):.4f}", refresh=False)
                if not progress and (step % max(1, total // 10) == 0 or done == total):
                    log(f"step {done}/{total}  loss {np.mean(losses[-10:]):.4f}")
                if work_dir is not None and cfg.save_every and done % cfg.save_every == 0 and done < total:
                    _save_checkpoint(work_dir, state(done))
    except KeyboardInterrupt:
        bar.close()
        if work_dir is not None and done > start and not cut:
            _save_checkpoint(work_dir, state(done))
        if work_dir is not None and (work_dir / CHECKPOINT).is_file():
            log(f"interrupted at step {done}/{total}; the same command resumes from the checkpoint in {work_dir}")
        raise
    bar.close()
    eval_after = _eval_loss(model, held, pad_id)
    if eval_after is not None:
        log(f"held-out loss after training: {eval_after:.4f}")
    model.eval()
    model.save_pretrained(out_dir)
    window = max(1, min(10, total // 4))       # steps averaged at each end: 10, fewer in a short run
    info = {"config": asdict(cfg), "loss_first": float(np.mean(losses[:window])),
            "loss_last": float(np.mean(losses[-window:])),
            "eval_loss_before": eval_before, "eval_loss_after": eval_after, "steps": total,
            "resumed_from": start or None, "examples": len(train), "eval_examples": len(held),
            "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - cpu0, 1)}
    (out_dir / "ortllm_train.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
