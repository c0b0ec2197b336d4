"""Several artifacts served side by side within one memory budget.

Each engine's footprint is estimated before loading: its weights (model.onnx.data, mapped or copied by
ONNX Runtime), its KV pool and its adapter slots. A load that would exceed the budget first evicts the
least recently used engines its owner lets go (`evict(name) -> bool`: a server says no while requests for
it are in flight), then is refused with the figures; unloading closes the engine and drops every reference
to its session and buffers.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from . import contract as C
from .artifact import load_artifact
from .engine import Engine, engine_config
from .errors import ConfigError, OrtllmError
from .memory_plan import kv_pool_size


class MemoryBudgetExceeded(OrtllmError):
    """Loading this artifact would exceed the session manager's memory budget."""


def estimate_bytes(path: Path, **overrides) -> int:
    """Weights + KV pool of an engine with these overrides."""
    art = load_artifact(path, verify=False)
    per_block, num_blocks = kv_pool_size(engine_config(path, **overrides), art)
    return art.file(C.MODEL_DATA).stat().st_size + per_block * num_blocks


class SessionManager:
    def __init__(self, memory_budget_bytes: int):
        if memory_budget_bytes <= 0:
            raise ConfigError(f"memory_budget_bytes must be positive; got {memory_budget_bytes}")
        self.budget = memory_budget_bytes
        self._engines: dict[str, Engine] = {}
        self._bytes: dict[str, int] = {}
        self._last_used: dict[str, float] = {}   # time.monotonic() of the last touch(): LRU order
        self._lock = threading.Lock()
        self._loading = threading.Lock()         # one load (and its evictions) at a time

    def used_bytes(self) -> int:
        return sum(self._bytes.values())

    def names(self) -> list[str]:
        return sorted(self._engines)

    def get(self, name: str) -> Engine:
        try:
            return self._engines[name]
        except KeyError:
            raise ConfigError(f"no artifact loaded as {name!r}; loaded: {', '.join(self.names()) or 'none'}") from None

    def bytes_of(self, name: str) -> int:
        return self._bytes.get(name, 0)

    def touch(self, name: str) -> None:
        """Mark an engine used now (least recently used engines are evicted first)."""
        self._last_used[name] = time.monotonic()

    def idle(self, seconds: float) -> list[str]:
        """Loaded engines not touched for `seconds`, least recently used first."""
        now = time.monotonic()
        with self._lock:
            return [n for n in sorted(self._engines, key=lambda n: self._last_used.get(n, 0.0))
                    if now - self._last_used.get(n, 0.0) >= seconds]

    def load(self, name: str, path: str | Path, evict: Callable[[str], bool] | None = None, **overrides) -> Engine:
        """Load an engine-graph artifact under `name` if it fits the budget (checked before allocating).

        evict: when it does not fit, offered the loaded engines least recently used first; each one it
        accepts (returns True: nothing uses it any more) is unloaded until the new one fits."""
        need = estimate_bytes(Path(path), **dict(overrides))
        with self._loading:
            with self._lock:
                if name in self._engines:
                    raise ConfigError(f"an artifact is already loaded as {name!r}; unload it first")
                lru = sorted(self._engines, key=lambda n: self._last_used.get(n, 0.0))
            for victim in lru:
                if self.used_bytes() + need <= self.budget:
                    break
                if evict is not None and evict(victim):
                    self.unload(victim)
            with self._lock:
                if self.used_bytes() + need > self.budget:
                    raise MemoryBudgetExceeded(
                        f"loading {path} needs ~{need / 2**20:.0f} MiB (weights + KV pool); "
                        f"{self.used_bytes() / 2**20:.0f} of {self.budget / 2**20:.0f} MiB are in use"
                        f"{' by models serving requests' if evict else ''}: unload an artifact, lower num_blocks, "
                        "or raise the budget")
                self._bytes[name] = need          # reserved while loading
            try:
                engine = Engine.from_artifact(path, **overrides)
            except BaseException:
                with self._lock:
                    self._bytes.pop(name, None)
                raise
            with self._lock:
                self._engines[name] = engine
                self._last_used[name] = time.monotonic()
        return engine

    def unload(self, name: str) -> None:
        """Close the engine: Engine.close releases its session, KV pool and adapter slots at once (not with the
        last reference, which the engine's own cycles keep until Python's collector runs), so the next model loads
        into the room this one leaves."""
        with self._lock:
            engine = self._engines.pop(name, None)
            self._bytes.pop(name, None)
            self._last_used.pop(name, None)
        if engine is None:
            raise ConfigError(f"no artifact loaded as {name!r}")
        engine.close()

    def close(self) -> None:
        for name in self.names():
            self.unload(name)
