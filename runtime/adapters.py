"""Adapter registry: which LoRA adapters exist, which sit in the session's slots, and their host copies.

  disk (artifact/adapters/*.safetensors, sha256 in the manifest)
    --load/prefetch--> host-RAM LRU under AdapterConfig.host_budget_bytes
    --activate(step adapters)--> one of the session's fixed slots (least recently used slot not needed
                                 by this step is reused), written in place between steps
Called from the engine thread only, except prefetch() and add()/remove(), which take the lock.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .artifact import Artifact, sha256_file
from .config import AdapterConfig
from .errors import AdapterFileError, InvalidSamplingParams, RequestError, UnknownAdapter
from .sampling_params import adapter_names
from .smoothing import Smoothing


class AdapterLoadError(RequestError):
    """An adapter file is missing or damaged; requests for it fail, the rest go on."""


class AdapterRegistry:
    def __init__(self, artifact: Artifact, config: AdapterConfig, runner):
        self.path = artifact.path
        self.config = config
        self.runner = runner
        self._lock = threading.Lock()
        self.entries: dict[str, dict] = dict(artifact.manifest.adapters)
        self._host: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()   # LRU, most recent last
        self._host_bytes = 0
        self._slot_of: dict[str, int] = {}
        self._slot_lru: list[int] = []                                        # least recently used first
        self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="ortllm-adapter-prefetch")
        self._pending: dict[str, object] = {}
        self._retiring: set[str] = set()      # removed: no new requests; dropped when none in flight uses it
        try:                                  # a SmoothQuant'ed artifact's rescales, applied to every adapter read
            self._smoothing, self._smoothing_error = Smoothing.of(artifact.path, artifact.manifest), None
        except AdapterFileError as e:
            self._smoothing, self._smoothing_error = None, e
        if self.entries:
            self._size_slots()

    # ---- what exists
    def names(self) -> list[str]:
        with self._lock:
            return sorted(set(self.entries) - self._retiring)

    def info(self, name: str) -> dict:
        with self._lock:
            return dict(self.entries[name])

    def check(self, name: str, param: str = "adapter") -> None:
        """UnknownAdapter (naming the request field `param`) unless `name` is served."""
        with self._lock:
            if name not in self.entries or name in self._retiring:
                raise UnknownAdapter(name, sorted(set(self.entries) - self._retiring), param)

    def check_spec(self, spec, cap: int, param: str = "adapter") -> None:
        """A request's AdapterSpec (sampling_params): every adapter known; a mix (several adapters, or one weighted
        other than 1) of at most `cap` adapters (max_adapters_per_batch: a step holds them all) and no DoRA adapter
        (its magnitude rescales the whole projection, so a weighted sum of DoRA deltas is not a DoRA adapter).
        param: the request field that names them (adapter, or adapters for a mix)."""
        names = adapter_names(spec)
        for name in names:
            self.check(name, param)
        if isinstance(spec, str):
            return
        if len(names) > cap:
            raise InvalidSamplingParams(f"adapters mixes {len(names)} adapters; this engine runs at most {cap} in a "
                                        "step (max_adapters_per_batch): mix fewer, or raise it", "adapters")
        with self._lock:
            dora = [n for n in names if self.entries[n].get("dora")]
        if dora:
            raise InvalidSamplingParams(
                f"adapter {dora[0]!r} is a DoRA adapter; DoRA adapters cannot be mixed or weighted (their magnitude "
                f"rescales the whole projection): request it alone, {{\"adapter\": \"{dora[0]}\"}}", "adapters")

    def is_resident(self, name: str) -> bool:
        return name in self._slot_of

    def state(self, name: str) -> str:
        """Where the adapter's weights are now: "slot" (in the session), "host" (host RAM), "loading" (the
        prefetch thread is reading it) or "disk"."""
        with self._lock:
            if name in self._slot_of:
                return "slot"
            if name in self._host:
                return "host"
            return "loading" if name in self._pending else "disk"

    def content_key(self, name: str) -> str:
        """The adapter's weights as the prefix cache knows them: its file's sha256 from the manifest (a name
        re-added with other weights gets another key, so KV computed with the old weights is never reused)."""
        with self._lock:
            try:
                return self.entries[name]["sha256"]
            except KeyError:
                raise UnknownAdapter(name, sorted(set(self.entries) - self._retiring)) from None

    def add(self, name: str, entry: dict) -> None:
        """Register an adapter written into the artifact while serving (runtime/adapter_files.py add_adapter).
        A name still retiring is live again: the next sweep must not drop the new entry."""
        with self._lock:
            self.entries[name] = entry
            self._retiring.discard(name)
            self._drop(name)

    def retire(self, name: str) -> None:
        """Refcounted unload: new requests are refused now; requests already queued or running keep the
        weights (pinned in host RAM here, so the file may go) until sweep() sees none of them left."""
        self.check(name)
        self.host_weights(name)
        with self._lock:
            self._retiring.add(name)

    def sweep(self, in_use: set[str | None]) -> None:
        """Drop retired adapters that no request in flight uses any more (engine thread)."""
        if not self._retiring:
            return
        with self._lock:
            for name in list(self._retiring - in_use):
                self._retiring.discard(name)
                self.entries.pop(name, None)
                self._drop(name)

    def _drop(self, name: str) -> None:
        arrays = self._host.pop(name, None)
        if arrays is not None:
            self._host_bytes -= sum(a.nbytes for a in arrays.values())
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self._slot_lru.remove(slot)
            self._slot_lru.insert(0, slot)

    # ---- host cache
    def _load(self, name: str) -> dict[str, np.ndarray]:
        """From disk, hash-checked (the file may have changed since the manifest was verified), mapped onto a
        SmoothQuant'ed artifact's projections (runtime/smoothing.py)."""
        from safetensors.numpy import load_file

        entry = self.entries[name]
        if self._smoothing is None:
            raise AdapterLoadError(f"adapter {name!r}: {self._smoothing_error}")
        f = self.path / entry["file"]
        if not f.is_file() or f.stat().st_size != entry["size"] or sha256_file(f) != entry["sha256"]:
            raise AdapterLoadError(f"adapter {name!r}: {entry['file']} is missing or does not match its sha256 "
                                   "in the manifest; add it again with `ortllm adapters add --force`")
        try:
            tensors = load_file(str(f))
        except Exception as e:  # noqa: BLE001 - safetensors raises several types on damaged files
            raise AdapterLoadError(f"adapter {name!r}: cannot read {entry['file']} ({e})") from None
        return self._smoothing.to_artifact(tensors)

    def host_weights(self, name: str) -> dict[str, np.ndarray]:
        with self._lock:
            if name in self._host:
                self._host.move_to_end(name)
                return self._host[name]
        arrays = self.runner.pack_adapter(self._load(name))     # int8 packing off the engine thread when prefetched
        size = sum(a.nbytes for a in arrays.values())
        with self._lock:
            self._host[name] = arrays
            self._host_bytes += size
            while self._host_bytes > self.config.host_budget_bytes and len(self._host) > 1:
                _, old = self._host.popitem(last=False)
                self._host_bytes -= sum(a.nbytes for a in old.values())
        return arrays

    def prefetch(self, names: list[str]) -> None:
        """Load queued requests' adapters into host RAM on a background thread while steps run: called by the
        engine when a request for an adapter outside the slots is queued, and each step for the queue's
        adapters. Thread-safe; an adapter in a slot, in host RAM or already loading is skipped."""
        started = []
        with self._lock:
            for name in names:
                if (name in self._slot_of or name in self._host or name in self._pending
                        or name not in self.entries):
                    continue
                self._pending[name] = self._prefetcher.submit(self.host_weights, name)
                started.append(self._pending[name])
        for fut in started:                    # outside the lock: a finished future calls back at once
            fut.add_done_callback(self._prefetched)

    def _prefetched(self, fut) -> None:
        with self._lock:
            for name, f in list(self._pending.items()):
                if f is fut:
                    del self._pending[name]

    def _wait_prefetch(self, name: str) -> None:
        """A load of `name` already under way on the prefetch thread: wait for it rather than read the file twice
        (its error, if any, surfaces in the host_weights call that follows)."""
        with self._lock:
            fut = self._pending.get(name)
        if fut is not None:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - host_weights reloads and raises it for this step's requests
                pass

    # ---- session slots
    def _size_slots(self) -> None:
        """Slots of the largest rank known; growing it reallocates the stacks (all slots reloaded)."""
        rank = max(e["rank"] for e in self.entries.values())
        rank = -(-rank // 8) * 8
        if self.runner.adapter_slots != self.config.max_slots or self.runner.adapter_rank < rank:
            self.runner.resize_adapter_slots(self.config.max_slots, max(rank, self.runner.adapter_rank))
            self._slot_of.clear()
            self._slot_lru = list(range(self.config.max_slots))

    def activate(self, names: list[str]) -> tuple[dict[str, int], dict[str, Exception]]:
        """Put this step's adapters in slots. Returns {name: slot} and {name: error} for those that failed."""
        slots, failed = {}, {}
        if not names:
            return slots, failed
        with self._lock:
            self._size_slots()
        for name in names:
            if name in self._slot_of:
                slot = self._slot_of[name]
            else:
                try:
                    self._wait_prefetch(name)
                    arrays = self.host_weights(name)
                except (AdapterLoadError, KeyError) as e:
                    failed[name] = e if isinstance(e, AdapterLoadError) else UnknownAdapter(name, self.names())
                    continue
                busy = set(slots.values())
                slot = next(s for s in self._slot_lru if s not in busy)
                for old, s in list(self._slot_of.items()):
                    if s == slot:
                        del self._slot_of[old]
                entry = self.entries[name]
                self.runner.write_adapter_slot(slot, arrays, entry["rank"], entry["scale"])
                self._slot_of[name] = slot
            self._slot_lru.remove(slot)
            self._slot_lru.append(slot)
            slots[name] = slot
        return slots, failed

    def close(self) -> None:
        self._prefetcher.shutdown(wait=False, cancel_futures=True)
