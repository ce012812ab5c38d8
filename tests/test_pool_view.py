"""The pool view: allocators log what they change, the view folds it into the arrays snapshots
show; it equals what each allocator's own state implies after every step, costs what a step
changed, is not kept when nothing looks, and says what an observed server does not tell."""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.kv import changes as log
from pagedkv_core.kv.changes import NoChangeLog
from pagedkv_core.kv.protocol import Allocator
from pagedkv_core.kv.registry import ALLOCATORS
from pagedkv_core.observe.cache_state import CacheState, CacheView
from pagedkv_core.observe.wire import AllBlocksCleared, BlockRemoved, BlockStored
from pagedkv_core.record.pool_view import ALL_FIELDS, UNKNOWN_OWNER, PoolView
from pagedkv_core.record.recording import range_indices
from pagedkv_core.record.slot_state import SlotState
from pagedkv_core.sources.scripted import ScriptedSource

from .engine_helpers import add, make_engine, run_checked


@pytest.mark.parametrize("name", list(ALLOCATORS))
def test_the_view_is_what_the_allocator_implies_after_every_step(name):
    engine = make_engine(allocator=name, pool_slots=96, block_size=4, preemption="swap", swap_slots=32)
    rng = np.random.default_rng(11)
    for i in range(16):
        prompt = list(range(8)) + list(rng.integers(0, 40, int(rng.integers(1, 12))))
        add(engine, f"r{i}", prompt, output_len=int(rng.integers(1, 20)), max_tokens=24,
            arrival_step=int(rng.integers(0, 10)), n=1 + (i % 5 == 0))
    run_checked(engine)  # check_invariants runs PoolView.check_against after every step
    assert isinstance(engine.allocator.changes, log.ChangeLog) and engine.view.knows == ALL_FIELDS


def test_check_against_catches_a_view_that_drifted():
    engine = make_engine(pool_slots=64, block_size=4)
    add(engine, "a", range(10), output_len=5)
    engine.step()
    engine.check_invariants()
    table = engine.allocator.tables[0]
    engine.view.slot_token[table[0] * 4] += 1
    with pytest.raises(AssertionError, match="slot tokens"):
        engine.check_invariants()


def test_a_decode_step_logs_one_entry_for_all_its_plain_decodes_one_slot_each():
    engine = make_engine(pool_slots=1024, block_size=16)
    for i in range(4):
        add(engine, f"r{i}", range(3), output_len=10)
    engine.step()  # the prefills
    entries_seen = []
    fold = engine.view.fold

    def spy(entries):
        entries_seen.append(entries)
        fold(entries)

    engine.view.fold = spy
    engine.step()  # a decode each: position 3 of a 16-slot block, no new block
    entries = entries_seen[-1]
    assert [e[0] for e in entries] == [log.DECODED]
    (_, slots, tokens), = entries
    tables = [engine.allocator.tables[s.seq_id] for s in engine.scheduler.running]
    assert list(slots) == [t[0] * 16 + 3 for t in tables] and len(tokens) == 4


def test_a_decode_records_one_slot_per_sequence():
    class Spy:
        def start(self, scalars, arrays):
            pass

        def record(self, step, changes, seqs, events, metrics):
            self.last = changes

    spy = Spy()
    engine = Engine(EngineConfig(pool_slots=1024, block_size=16), ScriptedSource(), recording=spy)
    for i in range(4):
        add(engine, f"r{i}", range(3), output_len=10)
    engine.step(snapshot=False)
    engine.step(snapshot=False)
    spans = spy.last.slots
    assert sum(hi - lo for lo, hi in zip(spans[0::2], spans[1::2])) == 4


def test_nothing_is_logged_or_folded_when_nothing_looks():
    engine = Engine(EngineConfig(pool_slots=256, block_size=4), ScriptedSource(), snapshots=False)
    assert engine.view is None and isinstance(engine.allocator.changes, NoChangeLog)
    add(engine, "a", range(9), output_len=4)
    with pytest.raises(ValueError, match="snapshot=False"):
        engine.step()
    while engine.has_unfinished():
        engine.step(snapshot=False)
        engine.check_invariants()
    assert engine.requests["a"].finished


def test_the_protocol_is_narrow():
    members = {n for n in Allocator.__dict__ if not n.startswith("_")} | set(Allocator.__annotations__)
    assert len(members) <= 26, sorted(members)
    for dead in ("num_blocks_of", "reserved_start", "can_append", "take_changes", "slot_state", "block_ref"):
        assert dead not in members
        assert not any(hasattr(cls, dead) for cls in ALLOCATORS.values()), dead


def test_contiguous_sizes_are_honest():
    engine = make_engine(allocator="contiguous", pool_slots=100)
    alloc = engine.allocator
    assert alloc.block_size == 1 and alloc.num_blocks == alloc.num_slots == 100
    assert engine.view.num_blocks == 0 and len(engine.view.block_ref) == 0  # shown per slot


def test_an_observed_server_folds_into_a_view_that_says_what_it_does_not_know():
    cache = CacheView(num_blocks=3, block_size=2)
    state = CacheState(view=cache)
    state.apply(BlockStored([7, 8], None, [1, 2, 3, 4], 2), 0.0)
    state.apply(BlockStored([9, 10], 8, [5, 6, 7, 8], 2), 1.0)  # one block past the pool
    view = cache.view
    assert "owner" not in view.knows and "partial" not in view.knows and "ref" not in view.knows
    assert (view.slot_owner == UNKNOWN_OWNER).all()
    assert (view.block_state == SlotState.CACHED).all() and view.slot_token.tolist() == [1, 2, 3, 4, 5, 6]
    assert cache.overflow == 1 and state.num_cached == 4  # the state keeps every block; the view draws 3
    state.apply(BlockRemoved([8]), 2.0)
    b = 1
    assert view.block_state[b] == SlotState.FREE and view.slot_token[2:4].tolist() == [-1, -1]
    assert cache.position(8) is None and cache.position(7) == 0
    changes = view.take_changes()
    assert len(changes.blocks) and len(changes.slots)
    state.apply(AllBlocksCleared(), 3.0)
    assert (view.block_state == SlotState.FREE).all() and state.num_cached == 0


def test_an_engine_view_knows_its_owners():
    view = PoolView(8, 4, 2)
    view.fold([(log.TAKEN, [1], 5, 3), (log.FILLED, 1, 0, [9, 9])])
    assert view.slot_owner.tolist() == [-1] * 4 + [3] * 4
    assert view.slot_state.tolist()[4:] == [SlotState.FILLED] * 2 + [SlotState.EMPTY] * 2
    assert view.take_changes().blocks.tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize("offset", [0, 3])
def test_a_write_across_many_blocks_folds_as_its_blocks_one_at_a_time(offset):
    blocks, tokens = [5, 2, 7, 1, 3], list(range(100, 100 + 18 - offset))
    before = [(log.TAKEN, blocks, 9, 4)] + ([(log.FILLED, 5, 0, [1, 2, 3])] if offset else [])
    one, each = PoolView(32, 4, 8), PoolView(32, 4, 8)
    one.fold(before + [(log.FILLED_RUN, blocks, offset, tokens)])
    pieces, pos = [], 0
    for j, b in enumerate(blocks):  # the same write, a block at a time
        lo = offset if j == 0 else 0
        n = min(4 - lo, len(tokens) - pos)
        pieces.append((log.FILLED, b, lo, tokens[pos : pos + n]))
        pos += n
    each.fold(before + pieces)
    for name, a in one.arrays.items():
        assert np.array_equal(a, each.arrays[name]), name
    assert one.block_fill[blocks].tolist() == [4, 4, 4, 4, 2]
    got, want = one.take_changes(), each.take_changes()
    for field in ("slots", "blocks"):  # the same indices marked as touched
        assert np.array_equal(range_indices(getattr(got, field)), range_indices(getattr(want, field))), field


def test_a_prefill_across_many_blocks_is_one_change_log_entry():
    engine = Engine(EngineConfig(pool_slots=256, block_size=4), ScriptedSource())
    taken = []
    fold = engine.view.fold
    engine.view.fold = lambda entries: (taken.extend(entries), fold(entries))
    add(engine, "a", range(30), output_len=3)  # 30 tokens: 8 blocks, the last half full
    add(engine, "b", range(50, 56), output_len=3)  # 6 tokens: 2 blocks, one entry each
    engine.step()
    engine.check_invariants()
    kinds = [e[0] for e in taken]
    assert kinds.count(log.FILLED_RUN) == 1 and kinds.count(log.FILLED) == 2
    run = next(e for e in taken if e[0] == log.FILLED_RUN)
    assert run[1] == engine.allocator.tables[0] and run[2] == 0 and run[3] == list(range(30))
