"""`ortllm adapters add | list | remove | train`: an artifact's LoRA adapters (ortllm.runtime.adapter_files; the
training run: cli/adapter_train.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from ortllm.pipeline.train_config import add_arguments as add_train_arguments


def add_adapters(sub) -> None:
    p = sub.add_parser("adapters", help="add, list or remove LoRA adapters of an artifact")
    verbs = p.add_subparsers(dest="adapters_verb", required=True, metavar="add|list|remove|train")
    add = verbs.add_parser("add", help="convert a PEFT LoRA or DoRA (use_dora) directory into the artifact")
    add.add_argument("artifact", type=Path)
    add.add_argument("peft_dir", type=Path)
    add.add_argument("--name", required=True)
    add.add_argument("--force", action="store_true", help="replace an adapter of the same name")
    ls = verbs.add_parser("list", help="list the artifact's adapters")
    ls.add_argument("artifact", type=Path)
    rm = verbs.add_parser("remove", help="remove an adapter from the artifact")
    rm.add_argument("artifact", type=Path)
    rm.add_argument("name")
    tr = verbs.add_parser("train", help="train a LoRA (PEFT, CPU) on your chats (--data FILE.jsonl) or a generated "
                                        "task (--task) and add it (docs/adapters.md, Training on your own data)")
    tr.add_argument("artifact", type=Path)
    tr.add_argument("--name", required=True)
    add_train_arguments(tr)
    tr.add_argument("--base", default=None, help="the artifact's source, if it was not built from a recipe")
    tr.add_argument("--eval", type=int, default=100, help="--task: held-out prompts to score base vs adapter (0: skip)")
    tr.add_argument("--work-dir", type=Path, default=None,
                    help="checkpoints of the run (default: .ortllm-train/ beside the artifact; the store's tmp/)")
    tr.add_argument("--restart", action="store_true", help="start over instead of resuming this run's checkpoint")
    tr.add_argument("--force", action="store_true", help="replace an adapter of the same name")
    p.set_defaults(run=run_adapters)


def _train_adapter(a) -> None:
    from dataclasses import replace

    from ortllm.pipeline.train_config import from_args
    from ortllm.runtime.config import physical_cores
    from .adapter_train import train_adapter

    cfg = from_args(a)
    cfg = cfg if cfg.threads else replace(cfg, threads=physical_cores())
    info, artifact = train_adapter(a.artifact, a.name, cfg, base=a.base, force=a.force,
                                   store_name=a.store_names.get(Path(a.artifact)), work_dir=a.work_dir,
                                   restart=a.restart, log=lambda m: print(m, file=sys.stderr))
    what = cfg.task or Path(cfg.data).name
    print(f"trained {a.name} on {what}: loss {info['loss_first']:.3f} -> {info['loss_last']:.3f} in {info['steps']} "
          f"steps, {info['seconds']} s ({info['cpu_seconds']} s CPU)")
    if info["eval_loss_before"] is not None:
        print(f"held-out loss ({info['eval_examples']} examples): {info['eval_loss_before']:.4f} -> "
              f"{info['eval_loss_after']:.4f}")
    if cfg.task and a.eval:
        from ortllm.calibration.adapter_eval import task_accuracy
        from ortllm.runtime.engine import Engine
        with Engine.from_artifact(artifact) as engine:
            base = task_accuracy(engine, cfg.task, None, n=a.eval)
            tuned = task_accuracy(engine, cfg.task, a.name, n=a.eval)
        print(f"{cfg.task} accuracy on {a.eval} held-out prompts: base {base.accuracy:.1%}, "
              f"{a.name} {tuned.accuracy:.1%}")


def run_adapters(a) -> int:
    from ortllm.runtime import adapter_files as adapters

    if a.adapters_verb == "train":
        _train_adapter(a)
    elif a.adapters_verb == "add":
        e = adapters.add_adapter(a.artifact, a.peft_dir, a.name, force=a.force)
        kind = "DoRA" if e.get("dora") else "LoRA"
        print(f"added {a.name}: {kind} rank {e['rank']}, scale {e['scale']:g}, targets {', '.join(e['targets'])}")
    elif a.adapters_verb == "list":
        for name, e in sorted(adapters.list_adapters(a.artifact).items()):
            kind = "DoRA" if e.get("dora") else "LoRA"
            print(f"{name}\t{kind} rank {e['rank']}\tscale {e['scale']:g}\t{','.join(e['targets'])}\t{e['size']} bytes")
    else:
        adapters.remove_adapter(a.artifact, a.name)
        print(f"removed {a.name}")
    return 0
