import pytest

from ortllm.runtime.block_pool import (NULL_BLOCK, BlockPool, NoFreeBlocks, extend_block_hashes,
                                       hash_block)


def test_allocate_free_never_hands_out_null_block():
    pool = BlockPool(5, 4)
    assert pool.num_usable == 4 and pool.num_free == 4
    blocks = pool.allocate(4)
    assert sorted(blocks) == [1, 2, 3, 4] and NULL_BLOCK not in blocks and pool.num_free == 0
    with pytest.raises(NoFreeBlocks):
        pool.allocate(1)
    pool.free(blocks)
    assert pool.num_free == 4
    pool.check_invariants()


def test_allocations_are_ascending_after_tables_come_back_tail_first():
    """The attention streams a table's blocks in order, ascending runs fastest (block_pool's docstring): a table
    freed tail-first, as the scheduler frees, is handed out again in ascending order, the lowest free blocks
    first; with the prefix cache the evicted blocks of one allocation are ascending too, still taken in LRU order."""
    pool = BlockPool(13, 4, enable_prefix_cache=False)
    a, b = pool.allocate(4), pool.allocate(4)
    assert a == [1, 2, 3, 4] and b == [5, 6, 7, 8]
    pool.free(reversed(a))
    pool.free(reversed(b))
    assert pool.allocate(6) == [1, 2, 3, 4, 5, 6]
    assert [pool.allocate(1)[0] for _ in range(3)] == [7, 8, 9]      # one block at a time, as a decode grows
    pool.check_invariants()

    cached = BlockPool(9, 4)
    t = cached.allocate(8)
    for i, blk in enumerate(t):
        cached.register(blk, bytes([i]) * 16)
    cached.free(reversed(t))                             # the LRU: 8 oldest, then 7, ... 1
    got = cached.allocate(3)                             # evicts 8, 7, 6
    assert got == [6, 7, 8] and cached.match_prefix([bytes([i]) * 16 for i in range(5)]) == [1, 2, 3, 4, 5]
    cached.check_invariants()


def test_double_free_is_caught():
    pool = BlockPool(3, 4)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([b])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([NULL_BLOCK])


def test_hash_chain_depends_on_parent_tokens_and_adapter():
    a = hash_block(None, [1, 2, 3, 4], None)
    assert a == hash_block(None, [1, 2, 3, 4], None)
    assert a != hash_block(None, [1, 2, 3, 5], None)
    assert a != hash_block(None, [1, 2, 3, 4], "sql")
    assert hash_block(a, [5, 6, 7, 8], None) != hash_block(None, [5, 6, 7, 8], None)
    hs = extend_block_hashes([], list(range(10)), 4, None)
    assert len(hs) == 2 and hs[1] == hash_block(hs[0], [4, 5, 6, 7], None)
    assert extend_block_hashes(hs, list(range(12)), 4, None) is hs and len(hs) == 3


def test_prefix_sharing_refcounts_and_lru_eviction():
    pool = BlockPool(5, 4)
    hs = extend_block_hashes([], list(range(8)), 4, None)
    first = pool.allocate(2)
    for b, h in zip(first, hs):
        assert pool.register(b, h)
    assert pool.match_prefix(hs) == first
    pool.touch(first)                                   # a second sequence shares both blocks
    assert [pool.ref_count(b) for b in first] == [2, 2]
    pool.free(reversed(first))
    pool.free(reversed(first))
    assert pool.num_free == 4 and pool.num_cached == 2  # unreferenced but still cached
    assert pool.match_prefix(hs) == first
    pool.touch(first[:1])                               # a hit revives an evictable block
    assert pool.num_free == 3 and pool.ref_count(first[0]) == 1
    pool.free(first[:1])
    got = pool.allocate(2)                              # never-cached blocks go first
    assert not set(got) & set(first) and pool.num_cached == 2
    got += pool.allocate(1)                             # then the least recently freed cached block
    assert got[-1] == first[1] and pool.match_prefix(hs) == [first[0]]
    pool.free(got)
    pool.check_invariants()
    assert pool.num_free == 4


def test_register_duplicate_content_keeps_first_and_disabled_cache():
    pool = BlockPool(4, 4)
    h = hash_block(None, [1, 2, 3, 4], None)
    a, b = pool.allocate(2)
    assert pool.register(a, h) and not pool.register(b, h) and not pool.register(a, h)
    pool.free([a, b])
    assert pool.num_cached == 1
    off = BlockPool(4, 4, enable_prefix_cache=False)
    (c,) = off.allocate(1)
    assert not off.register(c, h) and off.match_prefix([h]) == []


def test_hit_rate_and_reset():
    pool = BlockPool(4, 4)
    pool.record_lookup(16, 8)
    pool.record_lookup(16, 0)
    assert pool.hit_rate == 0.25
    (a,) = pool.allocate(1)
    pool.register(a, b"x" * 16)
    pool.free([a])
    pool.reset_prefix_cache()
    assert pool.num_cached == 0 and pool.num_free == 3
    pool.check_invariants()
