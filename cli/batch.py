"""`ortllm batch`: an OpenAI Batch JSONL file through the engine, resumable (ortllm.batch; docs/batch.md)."""
from __future__ import annotations

from pathlib import Path

from .options import Bool


def add_batch(sub) -> None:
    p = sub.add_parser("batch", help="run an OpenAI Batch JSONL file through the engine (resumable; docs/batch.md)")
    p.add_argument("artifact", type=Path, metavar="ARTIFACT")
    p.add_argument("--input", required=True, type=Path, help="JSONL: {custom_id, method, url, body} per line")
    p.add_argument("--output", required=True, type=Path,
                   help="JSONL of results, appended as they finish; rerun with the same file to resume")
    p.add_argument("--max-num-seqs", type=int, default=None, help="sequences per engine step (default: engine's)")
    p.add_argument("--threads", type=int, default=None,
                   help="engine intra-op threads (default: physical cores; with --ray: per worker, 1 if unset)")
    p.add_argument("--model-name", default=None, help="the base model's `model` (default: the artifact's recipe)")
    p.add_argument("--progress", action=Bool, default=True,
                   help="a progress bar (the summary line prints either way) (default: on)")
    p.add_argument("--ray", action=Bool, default=False,
                   help="run on Ray Data, one engine per worker (pip install ray) (default: off)")
    p.add_argument("--num-workers", type=int, default=2, help="with --ray: engine actors")
    p.add_argument("--address", default=None,
                   help="with --ray: cluster to join (e.g. auto, or HEAD_IP:6379); default: a local Ray instance")
    p.set_defaults(run=run_batch)


def run_batch(a) -> int:
    from ortllm.batch import BatchOptions, run_batch as run

    opts = BatchOptions(max_num_seqs=a.max_num_seqs, threads=a.threads, model_name=a.model_name,
                        progress=a.progress, ray=a.ray, num_workers=a.num_workers, address=a.address)
    summary = run(a.artifact, a.input, a.output, opts)
    return 130 if summary.interrupted else 0
