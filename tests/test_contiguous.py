"""Contiguous baseline: first-fit reservations, internal and external fragmentation."""
from __future__ import annotations

from pagedkv_core.config import EngineConfig
from pagedkv_core.kv.changes import ChangeLog
from pagedkv_core.kv.contiguous import ContiguousAllocator
from pagedkv_core.record.pool_view import PoolView
from pagedkv_core.record.slot_state import SlotState

from .engine_helpers import add, lone_sequence, make_engine, run_checked


def allocator(pool_slots=100) -> ContiguousAllocator:
    ca = ContiguousAllocator(EngineConfig(allocator="contiguous", pool_slots=pool_slots, block_size=1), changes=ChangeLog())
    ca.test_view = PoolView.of(ca)
    return ca


def shown(ca: ContiguousAllocator) -> PoolView:
    """The pool view of ``ca`` with everything it changed so far folded in (what a snapshot shows)."""
    ca.test_view.fold(ca.changes.take())
    return ca.test_view


def test_reservation_is_prompt_plus_max_tokens_first_fit_and_never_grows():
    ca = allocator(100)
    a = lone_sequence(range(10), rid="a", max_tokens=20)  # 30 slots
    b = lone_sequence(range(5), rid="b", index=1, seq_id=1, max_tokens=15)  # 20 slots
    assert ca.try_admit(a).cached_tokens == 0 and ca.try_admit(b).cached_tokens == 0
    assert ca.reservations == {0: (0, 30), 1: (30, 20)}
    assert ca.kv_usage == 0.5 and ca.allocated_slots == 50
    assert ca.block_table(a, 3) == [0, 1, 2]  # presented as block size 1
    assert ca.slots_for(b, 2, 3) == [32, 33, 34]
    assert ca.blocks_needed(a, 1) == 0
    ca.mark_written(a, 0, 10)
    a.num_computed = 10
    # The reached head is filled, the tail is allocated but empty.
    assert (shown(ca).slot_state[:10] == SlotState.FILLED).all() and (shown(ca).slot_state[10:30] == SlotState.EMPTY).all()
    assert shown(ca).slot_token[:10].tolist() == list(range(10))
    ca.check_invariants([a, b])
    shown(ca).check_against(ca, [a, b])


def test_free_merges_holes_and_first_fit_reuses_them():
    ca = allocator(100)
    seqs = [lone_sequence(range(5), rid=f"s{i}", index=i, seq_id=i, max_tokens=15) for i in range(4)]  # 20 each
    for s in seqs:
        ca.try_admit(s)
    ca.free(seqs[1])
    ca.free(seqs[2])
    assert list(zip(ca.free_starts, ca.free_lens)) == [(20, 40), (80, 20)]
    big = lone_sequence(range(5), rid="big", index=9, seq_id=9, max_tokens=30)  # 35: first fit at 20
    assert ca.try_admit(big).cached_tokens == 0 and ca.reservations[9] == (20, 35)
    ca.free(seqs[0])
    ca.free(big)
    ca.free(seqs[3])
    assert list(zip(ca.free_starts, ca.free_lens)) == [(0, 100)]
    ca.check_invariants([])


def test_holes_too_small_for_the_next_reservation_are_marked_as_fragmentation():
    ca = allocator(100)
    seqs = [lone_sequence(range(5), rid=f"s{i}", index=i, seq_id=i, max_tokens=20) for i in range(4)]  # 25 each
    for s in seqs:
        ca.try_admit(s)
    ca.free(seqs[1])  # a 25-slot hole
    ca.update_fragmentation(next_need=30)
    assert ca.fragmented_slots == 25
    assert (shown(ca).slot_state[25:50] == SlotState.FRAGMENT).all()
    ca.update_fragmentation(next_need=20)  # now it would fit: just free
    assert ca.fragmented_slots == 0 and (shown(ca).slot_state[25:50] == SlotState.FREE).all()
    ca.update_fragmentation(next_need=0)
    assert ca.largest_free_run == 25


def test_never_fitting_request_is_rejected_with_the_numbers():
    ca = allocator(100)
    reason = ca.rejection_reason(30, 80)
    assert "30 prompt + 80 max_tokens = 110" in reason and "100 slots" in reason
    assert ca.rejection_reason(30, 70) is None


def test_engine_fcfs_head_of_line_blocking_and_rejection():
    engine = make_engine(allocator="contiguous", pool_slots=100)
    add(engine, "a", range(10), output_len=5, max_tokens=50)  # 60 slots
    add(engine, "big", range(10), output_len=5, max_tokens=80)  # 90: waits for a to finish
    add(engine, "small", range(5), output_len=3, max_tokens=5)  # would fit now, but FCFS
    add(engine, "huge", range(10), output_len=5, max_tokens=200)  # never fits
    _, snap = engine.step()
    assert [e.request_id for e in snap.events if e.kind == "reject"] == ["huge"]
    assert [e.request_id for e in snap.events if e.kind == "admit"] == ["a"]
    assert snap.metrics.fragmented_slots == 40  # the 40 free slots cannot take "big" (90)
    assert (snap.slot_state[60:] == SlotState.FRAGMENT).all()
    snaps = run_checked(engine)
    admits = [e.request_id for s in snaps for e in s.events if e.kind == "admit"]
    assert admits == ["big", "small"]  # "small" waited behind "big" although it fit earlier
    assert all(engine.get_request(r).finish_reason == "stop" for r in ("a", "big", "small"))
    assert engine.get_request("huge").finish_reason == "rejected"
    assert "200 max_tokens" in engine.get_request("huge").reject_reason


def test_parallel_samples_are_independent_reservations():
    engine = make_engine(allocator="contiguous", pool_slots=200)
    add(engine, "r", range(10), output_len=4, max_tokens=20, n=3)
    _, snap = engine.step()
    assert len(snap.seq_id) == 3 and sorted(snap.seq_sample.tolist()) == [0, 1, 2]
    assert sorted(snap.seq_num_blocks.tolist()) == [30, 30, 30]
    run_checked(engine)
    outs = engine.get_request("r").output_token_ids
    assert len(outs) == 3 and all(len(o) == 4 for o in outs) and len({tuple(o) for o in outs}) == 3
