"""Feed one Engine from a stream of batch lines and yield output lines as requests finish.

    items --window (W lines, checked and tokenized)--> sorted by (length bucket, adapter, prompt prefix)
          --submit while in flight < cap--> Engine (continuous batching, prefix cache, adapter cap per step)
          --each request's deltas into one queue--> output lines, in finishing order

The cap (a few x max_num_seqs, at most max_queued) keeps the engine full without flooding its queue.
Sorting a window by the length bucket of prompt + max_tokens keeps short and long requests apart, so a step's
sequences finish together rather than a few long ones trailing behind; within a bucket one adapter's requests
are adjacent (fewer distinct adapters per step), and equal prompt prefixes too (prefix cache hits).
"""
from __future__ import annotations

import itertools
import queue
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from ortllm.runtime.engine import Engine, RequestHandle
from ortllm.runtime.errors import Overloaded
from ortllm.protocol.generation import token_text_of

from .protocol import (LineItem, Prepared, api_error_line, as_api_error, finished_line, is_request_error,
                       prepare, request_id)

IN_FLIGHT_PER_SEQ = 4     # in flight = this x max_num_seqs (capped by max_queued + max_num_seqs)
WINDOW_PER_IN_FLIGHT = 4  # lines read ahead and sorted = this x in flight
_POLL_S = 0.005           # an Overloaded engine's retry; and how soon a stop is seen while requests run


@dataclass
class Stats:
    ok: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def tick(bar, stats: Stats) -> None:
    """One output line written: advance the progress bar (None: no bar) and show the generated tok/s so far."""
    if bar is None:
        return
    bar.update(1)
    elapsed = bar.format_dict["elapsed"] or 1e-9
    bar.set_postfix_str(f"{stats.completion_tokens / elapsed:.0f} tok/s, {stats.errors} errors", refresh=False)


def bucket(n: int) -> int:
    """Power-of-two length bucket: 1..16 -> 4, 17..32 -> 5, ..."""
    return max(4, (max(n, 1) - 1).bit_length())


def sort_key(p: Prepared) -> tuple:
    return (bucket(len(p.prompt_ids) + p.params.max_tokens), p.params.adapter or "", p.prompt_ids[:64])


class EngineFeeder:
    def __init__(self, engine: Engine, model_name: str, in_flight: int | None = None, window: int | None = None):
        self.engine, self.model_name = engine, model_name
        sched = engine.config.scheduler
        self.in_flight = in_flight or min(IN_FLIGHT_PER_SEQ * sched.max_num_seqs, sched.max_queued + sched.max_num_seqs)
        self.window = window or WINDOW_PER_IN_FLIGHT * self.in_flight
        self.stats = Stats()
        self.stop = False                   # set (e.g. on Ctrl-C): submit nothing more, cancel what runs
        self._token_text = token_text_of(engine)
        self._harmony = engine.tokenizer.harmony          # gpt-oss: chat replies split by channel

    def run(self, items: Iterable[LineItem | dict]) -> Iterator[dict]:
        """Output lines as they are ready: error lines at once, generations when they finish."""
        source = iter(items)
        pending: deque[Prepared] = deque()
        running: dict[int, tuple[Prepared, RequestHandle]] = {}
        deltas: queue.Queue = queue.Queue()         # (running key, Delta) from every request in flight
        keys = itertools.count()
        exhausted = False
        try:
            while not self.stop:
                if not pending and not exhausted:
                    batch, exhausted = self._read_window(source)
                    for x in batch:
                        if isinstance(x, dict):
                            yield self._count(x)
                    pending.extend(sorted((x for x in batch if isinstance(x, Prepared)), key=sort_key))
                while pending and len(running) < self.in_flight and not self.stop:
                    p = pending[0]
                    try:
                        h = self.engine.submit(p.prompt_ids, p.params, request_id=request_id(p.item))
                    except Overloaded:
                        break                               # the queue is full (shared engine?): retry after one
                    except Exception as e:  # noqa: BLE001 - a request error is a line; anything else propagates
                        pending.popleft()
                        if not is_request_error(e):
                            raise
                        yield self._count(api_error_line(p.item.line_no, p.item.custom_id, as_api_error(e)))
                        continue
                    pending.popleft()
                    key = next(keys)
                    running[key] = (p, h)
                    h.deliver_to(deltas, key)
                if not running:
                    if exhausted and not pending:
                        return
                    if pending:
                        time.sleep(_POLL_S)                 # Overloaded with nothing of ours running
                    continue
                try:
                    key, d = deltas.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                if d.finish_reason is None:
                    continue
                p, h = running.pop(key)
                out = h.result()
                line = finished_line(p, out, int(time.time()), self._token_text, self._harmony)
                if line["error"] is None:
                    self.stats.prompt_tokens += out.prompt_tokens
                    self.stats.completion_tokens += len(out.token_ids)
                yield self._count(line)
        finally:                                    # stopped, or the reader gave up: in-flight requests are lost
            for _, h in running.values():
                if not h.done:
                    h.cancel()

    def _read_window(self, source: Iterator) -> tuple[list, bool]:
        out: list = []
        for x in source:
            if isinstance(x, LineItem):
                try:
                    x = prepare(self.engine, self.model_name, x)
                except Exception as e:  # noqa: BLE001 - a request error is a line; anything else propagates
                    if not is_request_error(e):
                        raise
                    x = api_error_line(x.line_no, x.custom_id, as_api_error(e))
            out.append(x)
            if len(out) >= self.window:
                return out, False
        return out, True

    def _count(self, line: dict) -> dict:
        if line["error"] is None:
            self.stats.ok += 1
        else:
            self.stats.errors += 1
        return line


def run_all(engine: Engine, model_name: str, items: list[LineItem | dict],
            on_line: Callable[[dict], None] | None = None) -> list[dict]:
    """Every line of `items`, in finishing order (the Ray actor sorts them back)."""
    feeder = EngineFeeder(engine, model_name)
    lines = []
    for line in feeder.run(items):
        lines.append(line)
        if on_line:
            on_line(line)
    return lines
