"""`ortllm adapters train`'s settings: one dataclass whose fields declare the command's flags.

Each field with a `help` in its metadata is a flag (`--eval-split` for eval_split); the command line adds them with
add_arguments and reads them back with from_args, so flags, defaults and validation live here once. Light on
purpose (no numpy, no torch): the command line imports it to build its parser.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from ortllm.runtime import contract as C

from .errors import BuildError

ALL_TARGETS = tuple(C.LORA_TARGETS)
SHORT_TARGETS = {t.removesuffix("_proj"): t for t in ALL_TARGETS}     # q -> q_proj, ..., down -> down_proj
TASK_STEPS = 150          # a generated task trains this many steps unless told
DATA_EPOCHS = 3.0         # a --data file trains this many epochs unless told


def parse_targets(text: str) -> tuple[str, ...]:
    """'q,k,v,o' or 'q_proj,v_proj' or 'all' -> projection names."""
    if text.strip() == "all":
        return ALL_TARGETS
    out = []
    for t in (s.strip() for s in text.split(",") if s.strip()):
        name = SHORT_TARGETS.get(t, t)
        if name not in ALL_TARGETS:
            raise BuildError(f"--targets: unknown projection {t!r}; choose from {','.join(SHORT_TARGETS)} (or all)")
        out.append(name)
    if not out:
        raise BuildError("--targets is empty; e.g. --targets q,k,v,o")
    return tuple(dict.fromkeys(out))


def _flag(help: str, **argparse_kw) -> dict:
    return {"help": help, **argparse_kw}


@dataclass(frozen=True)
class TrainConfig:
    task: str | None = field(default=None, metadata=_flag(
        "a generated task: add | upper (calibration/adapter_tasks.py); or --data"))
    data: str | None = field(default=None, metadata=_flag(
        'JSONL, one example a line: {"messages": [{"role": ..., "content": ...}, ...]} or '
        '{"prompt": ..., "completion": ...}; the loss covers the assistant turns only', metavar="FILE.jsonl"))
    rank: int = field(default=16, metadata=_flag("LoRA rank, 1..64", type=int))
    alpha: float | None = field(default=None, metadata=_flag("LoRA alpha (scale alpha / rank); default 2 x rank",
                                                             type=float))
    targets: tuple[str, ...] = field(default=ALL_TARGETS, metadata=_flag(
        f"projections to adapt, comma-separated: {','.join(SHORT_TARGETS)} (or all, the default)",
        type=parse_targets))
    epochs: float | None = field(default=None, metadata=_flag(
        f"passes over the training lines (default {DATA_EPOCHS:g} for --data); or --steps", type=float))
    steps: int | None = field(default=None, metadata=_flag(
        f"optimizer steps (default {TASK_STEPS} for --task); or --epochs", type=int))
    batch: int = field(default=8, metadata=_flag("examples per step", type=int))
    lr: float = field(default=2e-3, metadata=_flag("peak learning rate (warm-up over the first tenth of the "
                                                   "steps, at most 20, then linear decay to a tenth)", type=float))
    eval_split: float = field(default=0.1, metadata=_flag(
        "fraction of the lines held out to measure the loss before and after training (0: none)", type=float))
    dora: bool = field(default=False, metadata=_flag("train a DoRA (PEFT use_dora) instead of a plain LoRA",
                                                     action="store_true"))
    save_every: int = field(default=50, metadata=_flag(
        "steps between checkpoints (an interrupted run resumes from the last one; 0: only on Ctrl-C)", type=int))
    seed: int = field(default=0, metadata=_flag("seed of the split, the data order and the LoRA init", type=int))
    n_train: int = 2000             # --task: generated training examples
    threads: int | None = field(default=None, metadata=_flag(
        "torch threads (default: the physical cores; fewer can be faster for a small model on a busy machine)",
        type=int))

    @property
    def lora_alpha(self) -> float:
        return 2.0 * self.rank if self.alpha is None else self.alpha

    def validate(self) -> "TrainConfig":
        if (self.task is None) == (self.data is None):
            raise BuildError("give one of --data FILE.jsonl (your chats) or --task add|upper (a generated task)")
        if self.epochs is not None and self.steps is not None:
            raise BuildError("give --epochs or --steps, not both")
        checks = [
            (1 <= self.rank <= 64, f"--rank must be in 1..64; got {self.rank}"),
            (self.alpha is None or self.alpha > 0, f"--alpha must be > 0; got {self.alpha}"),
            (self.epochs is None or (math.isfinite(self.epochs) and self.epochs > 0),
             f"--epochs must be > 0; got {self.epochs}"),
            (self.steps is None or self.steps >= 1, f"--steps must be >= 1; got {self.steps}"),
            (self.batch >= 1, f"--batch must be >= 1; got {self.batch}"),
            (self.lr > 0, f"--lr must be > 0; got {self.lr}"),
            (0.0 <= self.eval_split <= 0.5, f"--eval-split must be in [0, 0.5]; got {self.eval_split}"),
            (self.save_every >= 0, f"--save-every must be >= 0; got {self.save_every}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise BuildError(msg)
        parse_targets(",".join(self.targets))
        return self

    def total_steps(self, n_train: int) -> int:
        """Optimizer steps of the run: --steps, else --epochs (or the default) over n_train examples."""
        if self.steps is not None:
            return self.steps
        if self.epochs is None and self.task is not None:
            return TASK_STEPS
        return max(1, math.ceil((self.epochs or DATA_EPOCHS) * n_train / self.batch))


def add_arguments(parser) -> None:
    """One flag per TrainConfig field with a help; every default None, so from_args leaves the field's own."""
    import argparse

    def parsed_by(convert):
        def parse(text: str):
            try:
                return convert(text)
            except BuildError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        parse.__name__ = convert.__name__        # argparse names the converter in "invalid <name> value"
        return parse

    for f in fields(TrainConfig):
        if "help" not in f.metadata:
            continue
        kw = dict(f.metadata)
        if "type" in kw:
            kw["type"] = parsed_by(kw["type"])
        if f.default is not None and f.default is not False and f.name != "targets":
            kw["help"] += f" (default {f.default})"
        parser.add_argument("--" + f.name.replace("_", "-"), default=None, **kw)


def from_args(ns, **overrides) -> TrainConfig:
    """The TrainConfig of parsed flags (those given), with overrides; validated."""
    given = {f.name: getattr(ns, f.name) for f in fields(TrainConfig)
             if "help" in f.metadata and getattr(ns, f.name, None) is not None}
    return replace(TrainConfig(), **given, **overrides).validate()
