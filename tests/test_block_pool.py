"""Block pool: O(1) free list, reference counts, prefix-cache index, LRU eviction."""
from __future__ import annotations

import pytest

from pagedkv_core.kv.block_pool import Block, BlockPool, FreeBlockQueue, HostPool
from pagedkv_core.kv.prefix_hash import NO_HASH, extend_block_hashes, hash_block


def ids(queue: FreeBlockQueue) -> list[int]:
    return [b.block_id for b in queue]


def test_free_queue_pops_in_order_and_removes_from_the_middle():
    blocks = [Block(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert ids(q) == [0, 1, 2, 3, 4] and len(q) == 5
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4] and len(q) == 4
    assert not FreeBlockQueue.contains(blocks[2])
    assert q.popleft() is blocks[0]
    q.append(blocks[0])
    q.appendleft(blocks[2])
    assert ids(q) == [2, 1, 3, 4, 0]
    with pytest.raises(RuntimeError):
        q.remove(Block(9))


def test_free_queue_empty_pop_raises():
    q = FreeBlockQueue([])
    with pytest.raises(RuntimeError, match="no free KV block"):
        q.popleft()


def test_allocate_and_release_track_reference_counts():
    pool = BlockPool(4)
    a = pool.allocate()
    assert a.ref_count == 1 and pool.num_free_blocks == 3
    pool.touch(a)
    assert a.ref_count == 2
    assert pool.release(a) is False
    assert pool.release(a) is True
    assert pool.num_free_blocks == 4
    with pytest.raises(RuntimeError):
        pool.release(a)
    pool.check_invariants()


def test_unhashed_blocks_are_reused_first_and_cached_ones_last():
    pool = BlockPool(3)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    assert pool.register(a, 111)
    pool.release(a)  # cached: goes to the tail
    pool.release(b)  # holds nothing: goes to the head
    assert ids(pool.free_queue) == [b.block_id, a.block_id]
    assert pool.allocate() is b
    assert pool.lookup(111) is a  # still reusable
    pool.release(c)
    pool.check_invariants()


def test_cache_hit_pulls_a_cached_free_block_out_of_the_free_list():
    pool = BlockPool(2)
    a = pool.allocate()
    pool.register(a, 42)
    pool.release(a)
    assert pool.num_free_blocks == 2
    hit = pool.lookup(42)
    pool.touch(hit)
    assert hit is a and a.ref_count == 1 and pool.num_free_blocks == 1
    pool.check_invariants()


def test_eviction_is_least_recently_used_and_drops_the_hash():
    pool = BlockPool(3)
    blocks = [pool.allocate() for _ in range(3)]
    for i, b in enumerate(blocks):
        pool.register(b, 100 + i)
    for b in (blocks[1], blocks[0], blocks[2]):  # freed in this order: 1 is least recent
        pool.release(b)
    evicted = pool.allocate()
    assert evicted is blocks[1]
    assert evicted.block_hash == NO_HASH and pool.lookup(101) is None
    assert pool.lookup(100) is blocks[0] and pool.lookup(102) is blocks[2]
    pool.check_invariants()


def test_register_keeps_the_first_block_for_a_hash_and_ignores_when_caching_is_off():
    pool = BlockPool(2)
    a, b = pool.allocate(), pool.allocate()
    assert pool.register(a, 7) and not pool.register(b, 7)
    assert pool.lookup(7) is a and b.block_hash == NO_HASH
    off = BlockPool(1, enable_caching=False)
    x = off.allocate()
    assert not off.register(x, 7) and off.lookup(7) is None


def test_block_hash_is_chained_deterministic_and_never_zero():
    h1 = hash_block(0, [1, 2, 3])
    assert h1 == hash_block(0, [1, 2, 3]) and h1 != NO_HASH
    assert hash_block(h1, [4, 5, 6]) != hash_block(0, [4, 5, 6])  # the parent matters
    assert hash_block(0, [1, 2, 3], ("adapter-a",)) != h1  # extra keys matter
    assert -(2**63) <= h1 < 2**63
    hashes = extend_block_hashes([], list(range(10)), 4, 99)
    assert len(hashes) == 2  # only full blocks
    assert hashes[1] == hash_block(hashes[0], [4, 5, 6, 7])


@pytest.mark.parametrize("extra", [(), ("adapter-a", 3)])
def test_extending_block_hashes_in_pieces_chains_hash_block_exactly(extra):
    tokens = [(i * 7919) % 49152 for i in range(203)]
    want, parent = [], NO_HASH
    for j in range(203 // 16):
        parent = hash_block(parent, tokens[j * 16 : (j + 1) * 16], extra)
        want.append(parent)
    hashes: list[int] = []
    for upto in (0, 1, 1, 5, 12, 99):  # nothing, one block, nothing new, then the rest in pieces
        assert extend_block_hashes(hashes, tokens, 16, upto, extra) is hashes
        assert hashes == want[: min(upto, 12)]


def test_host_pool_hands_out_and_takes_back_ids():
    host = HostPool(2)
    a, b = host.allocate(), host.allocate()
    assert {a, b} == {0, 1} and host.num_free_blocks == 0 and host.num_used_blocks == 2
    host.free(a)
    assert host.num_free_blocks == 1
