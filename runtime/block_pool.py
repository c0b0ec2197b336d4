"""Paged KV block allocator with a prefix cache of full blocks.

The KV pool holds `num_blocks` blocks of `block_size` tokens. Block 0 is the null block: never handed
out, it pads block tables ([S, max_blocks] filled with 0) so the attention kernel may read it harmlessly.

Each block has a reference count. A FULL block whose KV has been computed can be registered under a
chained hash of (parent block's hash, its token ids, adapter key): two sequences with the same leading tokens
and the same adapter weights then share those blocks without copying. The adapter key is the adapter's
content hash (its sha256 in the manifest), never its name: a name re-added with other weights must miss.
When a cached block's count drops to 0 it stays cached, evictable in LRU order, and is only reused for
other data when no never-cached block is left. `num_free` counts both kinds: everything that `allocate` may hand out.

    free list (never cached / evicted)     evictable LRU (cached, refcount 0)     in use (refcount > 0)
         allocate() pops here first   ->   then evicts the oldest here
         free(): refcount 0, uncached ->   free(): refcount 0, cached           <- touch(): prefix hit

Block order. The attention reads a sequence's blocks in table order, and on this CPU it streams ascending,
consecutive blocks ~1.4x faster than the same blocks descending or shuffled (the hardware prefetchers follow
an ascending stream across block boundaries; `bench/probes/attention_membench.py --layout`). Freed tables come back
tail-first, so a FIFO free list (and the LRU) would hand a later sequence descending runs. So the free list is a
min-heap (the lowest free block first) and each allocate() returns its blocks in ascending order; which blocks
are evicted is unchanged (LRU).
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

NULL_BLOCK = 0


def hash_block(parent: bytes | None, token_ids: Sequence[int], adapter_key: str | None) -> bytes:
    """Chained 128-bit hash of one full block: depends on every token before it and on the adapter's
    content key (None: the base model)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"\0" * 16)
    h.update((adapter_key or "").encode() + b"\0")
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


def extend_block_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int,
                        adapter_key: str | None) -> list[bytes]:
    """Append the hashes of the full blocks of token_ids not hashed yet (in place); return hashes."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else None
        hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], adapter_key))
    return hashes


class NoFreeBlocks(RuntimeError):
    """allocate() asked for more blocks than num_free; the scheduler checks num_free first."""


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block); got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks        # block -> its hash while cached
        self._cached: dict[bytes, int] = {}                          # hash -> block
        self._free: list[int] = list(range(1, num_blocks))          # never cached (or evicted): a min-heap
        self._evictable: OrderedDict[int, None] = OrderedDict()      # cached, refcount 0, oldest first
        self.queries = 0      # prompt tokens looked up in the prefix cache
        self.hits = 0         # of those, tokens found cached

    # ---- counts ----
    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def is_evictable(self, block_id: int) -> bool:
        return block_id in self._evictable

    # ---- allocation ----
    def allocate(self, n: int) -> list[int]:
        """n blocks with refcount 1, never-cached ones first (lowest ids), then the least recently freed cached
        ones; in ascending order (module docstring: block order)."""
        if n > self.num_free:
            raise NoFreeBlocks(f"asked for {n} KV blocks, {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                b = heapq.heappop(self._free)
            else:
                b, _ = self._evictable.popitem(last=False)
                del self._cached[self._hash[b]]
                self._hash[b] = None
            self._ref[b] = 1
            out.append(b)
        out.sort()
        return out

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in the given order (free a table tail-first so that its
        last blocks are evicted first)."""
        for b in block_ids:
            if b == NULL_BLOCK or self._ref[b] <= 0:
                raise RuntimeError(f"double free of KV block {b} (refcount {self._ref[b]})")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._hash[b] is not None:
                    self._evictable[b] = None
                else:
                    heapq.heappush(self._free, b)

    # ---- prefix cache ----
    def match_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """Blocks of the longest cached chain of `hashes` (no side effect; take them with touch())."""
        out = []
        if self.enable_prefix_cache:
            for h in hashes:
                b = self._cached.get(h)
                if b is None:
                    break
                out.append(b)
        return out

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one reference on cached blocks found by match_prefix (shared, out of the evictable LRU)."""
        for b in block_ids:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1

    def register(self, block_id: int, block_hash: bytes) -> bool:
        """Cache a full, computed, referenced block under its hash. False if caching is off, the block is
        cached already, or another block holds the same content (this one then stays private)."""
        if not self.enable_prefix_cache or self._hash[block_id] is not None or block_hash in self._cached:
            return False
        if self._ref[block_id] <= 0:
            raise RuntimeError(f"register of unreferenced KV block {block_id}")
        self._hash[block_id] = block_hash
        self._cached[block_hash] = block_id
        return True

    def record_lookup(self, queried_tokens: int, hit_tokens: int) -> None:
        self.queries += queried_tokens
        self.hits += hit_tokens

    def reset_prefix_cache(self) -> None:
        """Forget every unreferenced cached block (e.g. after the model or an adapter changed)."""
        for b in list(self._evictable):
            del self._cached[self._hash[b]]
            self._hash[b] = None
            heapq.heappush(self._free, b)
        self._evictable.clear()

    def check_invariants(self) -> None:
        """For tests: refcounts >= 0, every block in exactly one of free / evictable / in use."""
        assert self._ref[NULL_BLOCK] == 0 and self._hash[NULL_BLOCK] is None
        free, evict = set(self._free), set(self._evictable)
        assert len(free) == len(self._free) and not free & evict and NULL_BLOCK not in free | evict
        for b in range(1, self.num_blocks):
            r = self._ref[b]
            assert r >= 0, f"block {b} refcount {r}"
            assert (r == 0) == (b in free or b in evict), f"block {b} refcount {r} vs free lists"
            assert (b in evict) <= (self._hash[b] is not None)
            assert (b in free) <= (self._hash[b] is None)
        assert all(self._hash[b] == h for h, b in self._cached.items())
