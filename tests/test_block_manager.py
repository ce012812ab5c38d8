"""Paged allocator: block tables, prefix cache, fork, copy-on-write, swap, watermark."""
from __future__ import annotations

from weakref import WeakKeyDictionary

from pagedkv_core.kv.changes import ChangeLog
from pagedkv_core.kv.paged import BlockManager
from pagedkv_core.config import EngineConfig
from pagedkv_core.events import CACHE_HIT, COW, FORK
from pagedkv_core.kv.prefix_hash import NO_HASH
from pagedkv_core.sequence import Sequence
from pagedkv_core.record.pool_view import PoolView
from pagedkv_core.record.slot_state import SlotState

from .engine_helpers import lone_sequence


_VIEWS: WeakKeyDictionary = WeakKeyDictionary()


def manager(num_blocks=8, block_size=4, **kw) -> BlockManager:
    return BlockManager(EngineConfig(block_size=block_size, pool_slots=num_blocks * block_size, **kw), changes=ChangeLog())


def shown(bm: BlockManager) -> PoolView:
    """The pool view of ``bm`` with everything it changed so far folded in (what a snapshot shows)."""
    view = _VIEWS.get(bm)
    if view is None:
        view = _VIEWS[bm] = PoolView.of(bm)
    view.fold(bm.changes.take())
    return view


def check(bm: BlockManager, live) -> None:
    bm.check_invariants(live)
    shown(bm).check_against(bm, live)


def admit(bm, seq: Sequence, reserve: int = 0, events: list | None = None) -> int | None:
    """``try_admit`` as the scheduler uses it: it sets ``num_computed`` from the admission."""
    admission = bm.try_admit(seq, reserve)
    if admission is None:
        return None
    seq.num_computed = admission.cached_tokens
    if events is not None:
        events.extend(admission.events)
    return admission.cached_tokens


def prefill(bm: BlockManager, seq: Sequence, reserve: int = 0) -> int:
    cached = admit(bm, seq, reserve)
    assert cached is not None
    bm.mark_written(seq, seq.num_computed, seq.num_tokens - seq.num_computed)
    seq.num_computed = seq.num_tokens
    return cached


def test_admission_allocates_a_block_table_and_writes_fill_the_slots():
    bm = manager()
    seq = lone_sequence(range(10, 20))  # 10 tokens, block size 4 -> 3 blocks
    assert admit(bm, seq) == 0
    table = bm.block_table(seq)
    assert len(table) == 3 and bm.pool.num_used_blocks == 3
    assert (shown(bm).slot_state[[b * 4 for b in table]] == SlotState.EMPTY).all()
    bm.mark_written(seq, 0, 10)
    seq.num_computed = 10
    assert [bm.fill[b] for b in table] == [4, 4, 2]
    assert bm.filled_slots == 10 and bm.allocated_slots == 12
    last = table[2]
    assert shown(bm).slot_state[last * 4 : last * 4 + 4].tolist() == [1, 1, 2, 2]  # filled, filled, empty, empty
    assert shown(bm).slot_token[table[0] * 4 : table[0] * 4 + 4].tolist() == [10, 11, 12, 13]
    # Full blocks are hashed once written; the partial one is not.
    assert shown(bm).block_hash[table[0]] != NO_HASH and shown(bm).block_hash[table[1]] != NO_HASH
    assert shown(bm).block_hash[table[2]] == NO_HASH
    assert bm.slots_for(seq, 9, 1) == [table[2] * 4 + 1]
    check(bm, [seq])


def test_prefix_cache_hits_share_full_blocks_and_always_leave_a_token_to_compute():
    bm = manager()
    a = lone_sequence([5, 6, 7, 8, 9, 10, 11, 12, 13], rid="a", seq_id=0)
    prefill(bm, a)
    b = lone_sequence([5, 6, 7, 8, 9, 10, 11, 12], rid="b", index=1, seq_id=1)  # exactly 2 blocks
    events = []
    cached = admit(bm, b, 0, events)
    # Both blocks match, but the last token must be computed: only the first block is a hit.
    assert cached == 4 and b.num_computed == 4
    ta, tb = bm.block_table(a), bm.block_table(b)
    assert tb[0] == ta[0] and tb[1] != ta[1]
    assert bm.pool.blocks[ta[0]].ref_count == 2
    assert shown(bm).slot_state[ta[0] * 4] == SlotState.SHARED
    assert bm.hit_tokens == 4 and bm.queried_tokens == 9 + 8
    assert [e.kind for e in events].count(CACHE_HIT) == 1
    check(bm, [a, b])


def test_freed_hashed_blocks_stay_cached_and_hit_again():
    bm = manager()
    a = lone_sequence(range(100, 109), rid="a")
    prefill(bm, a)
    table = bm.block_table(a)
    bm.free(a)
    assert bm.pool.num_free_blocks == 8 and bm.allocated_slots == 0 and bm.filled_slots == 0
    assert (shown(bm).slot_state[table[0] * 4 : table[0] * 4 + 4] == SlotState.CACHED).all()
    assert (shown(bm).slot_owner[table[0] * 4 : table[0] * 4 + 4] == -1).all()
    assert shown(bm).block_state[table[2]] == SlotState.FREE  # partial block: nothing worth keeping
    b = lone_sequence(list(range(100, 109)) + [1], rid="b", index=1, seq_id=1)
    assert admit(bm, b) == 8
    assert bm.block_table(b)[:2] == table[:2]
    assert bm.filled_slots == 8  # the cached tokens count again
    check(bm, [b])


def test_extra_keys_separate_otherwise_equal_prefixes():
    bm = manager()
    a = lone_sequence(range(8 + 1), rid="a", extra_keys=("lora-1",))
    prefill(bm, a)
    b = lone_sequence(range(8 + 1), rid="b", index=1, seq_id=1, extra_keys=("lora-2",))
    assert admit(bm, b) == 0


def test_tail_blocks_are_evicted_first():
    bm = manager(num_blocks=4)
    a = lone_sequence(range(16), rid="a")  # 4 full blocks
    prefill(bm, a)
    table = bm.block_table(a)
    bm.free(a)  # reverse order: the last block is the least recently used
    b = lone_sequence(range(50, 54), rid="b", index=1, seq_id=1)
    admit(bm, b)
    assert bm.block_table(b) == [table[-1]]
    assert bm.pool.lookup(a.block_hashes[3]) is None
    assert bm.pool.lookup(a.block_hashes[0]) is not None


def test_watermark_blocks_admission_but_not_appends():
    bm = manager(num_blocks=8)
    a = lone_sequence(range(20), rid="a")  # 5 blocks
    prefill(bm, a)
    b = lone_sequence(range(100, 108), rid="b", index=1, seq_id=1)  # 2 blocks, 3 free
    assert admit(bm, b, 2) is None  # 3 - 2 < 2
    assert bm.pool.num_used_blocks == 5  # nothing taken by the failed attempt
    assert admit(bm, b, 1) == 0


def test_fork_shares_every_block_and_copy_on_write_splits_the_tail():
    bm = manager()
    parent = lone_sequence(range(6), rid="p")  # blocks: [full, 2 of 4]
    prefill(bm, parent)
    child = Sequence(1, parent.request, 1, list(parent.token_ids))
    events = bm.fork(parent, child)
    child.num_computed = parent.num_computed
    table = bm.block_table(parent)
    assert bm.block_table(child) == table
    assert [bm.pool.blocks[b].ref_count for b in table] == [2, 2]
    assert [e.kind for e in events] == [FORK]
    for s, tok in ((parent, 90), (child, 91)):
        s.token_ids.append(tok)
    # The parent writes position 6 into the shared tail: copy-on-write.
    assert bm.blocks_needed(parent, 1) == 1
    copies, events = bm.append_slots(parent, 1)
    assert len(copies) == 1 and copies[0][0] == table[1]
    new_tail = copies[0][1]
    assert bm.block_table(parent) == [table[0], new_tail]
    assert bm.fill[new_tail] == 2 and shown(bm).slot_token[new_tail * 4 : new_tail * 4 + 2].tolist() == [4, 5]
    assert bm.pool.blocks[table[1]].ref_count == 1
    assert [e.kind for e in events] == [COW]
    # The child is now the last holder of the original tail: it writes in place.
    assert bm.blocks_needed(child, 1) == 0 and bm.append_slots(child, 1) == ([], [])
    for s in (parent, child):
        bm.mark_written(s, 6, 1)
        s.num_computed = 7
    assert shown(bm).slot_state[table[0] * 4] == SlotState.SHARED
    check(bm, [parent, child])
    bm.free(parent)
    bm.free(child)
    assert bm.allocated_slots == 0
    check(bm, [])


def test_swap_out_copies_written_blocks_to_the_host_and_swap_in_restores_them():
    bm = manager(num_blocks=8, swap_slots=3 * 4)
    seq = lone_sequence(range(10), rid="s")
    prefill(bm, seq)
    table = bm.block_table(seq)
    pairs = bm.swap_out(seq)
    assert [d for d, _ in pairs] == table and bm.host.num_used_blocks == 3
    assert bm.allocated_slots == 0
    check(bm, [seq])
    seq.token_ids.append(77)  # grew by its last sampled token
    assert bm.can_swap_in(seq, 0)
    back = bm.swap_in(seq)
    assert [h for h, _ in back] == [h for _, h in pairs]
    assert bm.host.num_used_blocks == 0
    assert bm.filled_slots == 10 and len(bm.block_table(seq)) == 3  # 11 tokens -> 3 blocks
    check(bm, [seq])


def test_swap_out_refuses_when_the_host_pool_is_full():
    bm = manager(num_blocks=8, swap_slots=4)  # one host block
    seq = lone_sequence(range(10), rid="s")
    prefill(bm, seq)
    assert bm.swap_out(seq) is None
    assert bm.allocated_slots == 12  # untouched


def test_rejection_reason_names_the_numbers():
    bm = manager(num_blocks=4, block_size=4)
    assert bm.rejection_reason(15, 100) is None  # 15 + 1 fits in 16 slots
    reason = bm.rejection_reason(16, 1)
    assert "16 tokens" in reason and "5 blocks" in reason and "4 blocks" in reason
