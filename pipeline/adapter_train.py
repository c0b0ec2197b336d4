"""`ortllm adapters train`: a small LoRA on one of calibration.adapter_tasks, with PEFT on the CPU.

The base weights are the artifact's own source (its recipe, checked against the manifest's source hash);
the loss covers the answer tokens only (the chat prompt is context). Output: a PEFT directory that
`add_adapter` converts into the artifact.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ortllm.calibration.adapter_tasks import chat_prompt, make_split
from ortllm.runtime import contract as C
from ortllm.runtime.artifact import read_manifest

from .errors import BuildError

ALL_TARGETS = list(C.LORA_TARGETS)


@dataclass(frozen=True)
class TrainConfig:
    task: str = "add"
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = tuple(ALL_TARGETS)
    steps: int = 150
    batch: int = 8
    lr: float = 2e-3
    n_train: int = 2000
    seed: int = 0
    threads: int | None = None      # torch threads; None: torch's default (`ortllm adapters train`: physical cores)


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


def _batches(tok, examples, batch: int, rng, eos: int):
    """Yield (input_ids [B, L], labels [B, L] with -100 on prompt and padding, attention_mask [B, L])."""
    import torch

    encoded = []
    for ex in examples:
        p = tok.encode(chat_prompt(tok, ex))
        a = tok.encode(ex.answer) + [eos]
        encoded.append((p + a, [-100] * len(p) + a))
    while True:
        idx = rng.choice(len(encoded), batch, replace=False)
        width = max(len(encoded[i][0]) for i in idx)
        ids = torch.full((batch, width), eos, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for r, i in enumerate(idx):
            x, y = encoded[i]
            ids[r, :len(x)], labels[r, :len(y)], mask[r, :len(x)] = torch.tensor(x), torch.tensor(y), 1
        yield ids, labels, mask


def train_lora(artifact: Path, out_dir: Path, cfg: TrainConfig, base: str | None = None, log=print) -> dict:
    """Train and save a PEFT LoRA into out_dir; returns {loss_first, loss_last, seconds, ...}."""
    import torch
    from peft import LoraConfig, get_peft_model

    from ortllm.runtime.tokenizer import Tokenizer

    from .hf_model import hf_model_from_weights

    artifact = Path(artifact)
    if not 1 <= cfg.rank <= 64:
        raise BuildError(f"--rank must be in 1..64; got {cfg.rank}")
    tok = Tokenizer.from_dir(artifact)
    eos = json.loads((artifact / C.GENERATION).read_text())["eos_token_ids"][0]
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = get_peft_model(hf_model_from_weights(_base_weights(artifact, base)),
                           LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.targets),
                                      lora_dropout=0.0))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / cfg.steps))
    data = _batches(tok, make_split(cfg.task, cfg.n_train, "train", cfg.seed), cfg.batch,
                    np.random.default_rng(cfg.seed), eos)
    losses, t0 = [], time.time()
    for step in range(cfg.steps):
        ids, labels, mask = next(data)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % max(1, cfg.steps // 10) == 0 or step == cfg.steps - 1:
            log(f"step {step + 1}/{cfg.steps}  loss {np.mean(losses[-10:]):.4f}")
    model.eval()
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    info = {"config": asdict(cfg), "loss_first": float(np.mean(losses[:10])), "loss_last": float(np.mean(losses[-10:])),
            "seconds": round(time.time() - t0, 1)}
    (out_dir / "ortllm_train.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
