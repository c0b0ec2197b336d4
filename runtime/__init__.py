"""ortllm.runtime: `from ortllm.runtime import Engine, SamplingParams` (docs/architecture.md, Interfaces).

Exports resolve lazily, so the pipeline can import ortllm.runtime.contract without loading the engine."""
from __future__ import annotations

_EXPORTS = {
    "Engine": "engine", "RequestHandle": "engine", "CompletionOutput": "engine",
    "SamplingParams": "sampling_params",
    "EngineConfig": "config", "SchedulerConfig": "config", "CacheConfig": "config", "AdapterConfig": "config",
    "SessionManager": "session_manager",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        from importlib import import_module
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
