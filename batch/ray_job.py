"""`ortllm batch --ray`: the same job on Ray Data, one Engine per actor of an actor pool.

    driver: input lines --(resume, line checks)--> ray.data.from_items(rows)
            --map_batches(EngineWorker, concurrency=num_workers)--> rows {line_no, line}
            --iter_rows (preserve_order: input order)--> the same crash-safe writer as a local run

Each worker runs its batch through the same EngineFeeder as a local run (body checks, length-bucket sort,
bounded in flight) and hands the lines back sorted by input line, so the output is in input order.
The driver never loads a model. Every node needs ortllm installed and the artifact at the same path.
"""
from __future__ import annotations

import json
from pathlib import Path

from .protocol import LineItem
from .runner import Stats, tick

BATCH_PER_SEQ = 2      # rows per map_batches call = this x max_num_seqs


class EngineWorker:
    """A Ray Data actor: one Engine, loaded once, answering batches of rows."""

    def __init__(self, artifact: str, overrides: dict, model_name: str | None):
        from ortllm.runtime.engine import Engine

        from .protocol import model_name_of
        self.engine = Engine.from_artifact(artifact, **overrides)
        self.model_name = model_name_of(self.engine, model_name)

    def __call__(self, batch: dict) -> dict:
        from .runner import run_all

        items = [_row_to_item(int(n), json.loads(s)) for n, s in zip(batch["line_no"], batch["item"])]
        lines = sorted(run_all(self.engine, self.model_name, items), key=_line_no)
        return {"line_no": [_line_no(x) for x in lines],
                "line": [json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in lines]}


def _line_no(line: dict) -> int:
    return int(line["id"].rsplit("_", 1)[1])


def _item_to_row(x: LineItem | dict) -> dict:
    if isinstance(x, LineItem):
        return {"line_no": x.line_no, "item": json.dumps({"custom_id": x.custom_id, "kind": x.kind, "body": x.body})}
    return {"line_no": _line_no(x), "item": json.dumps({"line": x})}


def _row_to_item(line_no: int, obj: dict) -> LineItem | dict:
    return obj["line"] if "line" in obj else LineItem(line_no, obj["custom_id"], obj["kind"], obj["body"])


def run_on_ray(artifact: Path, items, writer, options, bar) -> tuple[Stats, bool]:
    try:
        import ray
    except ImportError:
        from .output import BatchFileError
        raise BatchFileError("--ray needs Ray Data: pip install 'ortllm[ray]'") from None

    rows = [_item_to_row(x) for x in items]
    stats = Stats()
    if not rows:
        return stats, False
    started = not ray.is_initialized()
    if started:
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        threads = options.threads or 1              # per worker: its intra-op threads = the CPUs Ray reserves
        # batches of a few x max_num_seqs rows, but enough of them that every worker gets some
        per_batch = min(BATCH_PER_SEQ * (options.max_num_seqs or 32), -(-len(rows) // (2 * options.num_workers)))
        ds = ray.data.from_items(rows, override_num_blocks=-(-len(rows) // per_batch))
        ds = ds.map_batches(EngineWorker, batch_size=per_batch,
                            compute=ray.data.ActorPoolStrategy(size=options.num_workers),
                            num_cpus=threads,
                            fn_constructor_kwargs={"artifact": str(Path(artifact).resolve()),
                                                   "overrides": {**options.overrides(), "threads": threads},
                                                   "model_name": options.model_name})
        for row in ds.iter_rows():
            line = json.loads(row["line"])
            writer.write(line)
            _count(stats, line)
            tick(bar, stats)
    finally:
        if started:
            ray.shutdown()
    return stats, False


def _count(stats: Stats, line: dict) -> None:
    if line["error"] is not None:
        stats.errors += 1
        return
    stats.ok += 1
    usage = line["response"]["body"]["usage"]
    stats.prompt_tokens += usage["prompt_tokens"]
    stats.completion_tokens += usage["completion_tokens"]
