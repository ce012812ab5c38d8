"""The allocators' change logs: whatever a step changed in the block map is marked, so a
recording that stores only the marked ranges loses nothing."""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv_core.kv.registry import ALLOCATORS
from pagedkv_core.record.snapshot import BLOCK_ARRAYS, SLOT_ARRAYS

from .engine_helpers import add, make_engine


class ChangeSpy:
    """Stands where a Recording would: keeps what the engine hands over each step."""

    def __init__(self):
        self.steps = []

    def start(self, scalars, arrays):
        self.scalars = scalars
        self.initial = {k: v.copy() for k, v in arrays.items()}

    def record(self, step, changes, seqs, events, metrics):
        self.steps.append(changes)


def covered(ranges, n):
    """``ranges`` is flat: [lo0, hi0, lo1, hi1, ...]."""
    mask = np.zeros(n, dtype=bool)
    for lo, hi in zip(ranges[0::2], ranges[1::2]):
        mask[lo:hi] = True
    return mask


@pytest.mark.parametrize("name", list(ALLOCATORS))
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_every_change_is_marked(name, preemption):
    spy = ChangeSpy()
    engine = make_engine(allocator=name, pool_slots=128, block_size=4, preemption=preemption, swap_slots=48)
    engine = type(engine)(engine.config, engine.source, recording=spy)
    engine.source.attach(engine)
    rng = np.random.default_rng(3)
    for i in range(30):
        prompt = rng.integers(0, 50, int(rng.integers(2, 20)))
        add(engine, f"r{i}", prompt if i % 3 else list(range(12)) + list(prompt), output_len=int(rng.integers(1, 30)),
            max_tokens=40, arrival_step=int(rng.integers(0, 40)), n=1 + (i % 7 == 0))
    prev = dict(spy.initial)
    prev_tables = {}
    while engine.has_unfinished():
        _, snap = engine.step()
        changes = spy.steps[-1]
        for names, ranges, size in ((SLOT_ARRAYS, changes.slots, snap.num_slots),
                                    (BLOCK_ARRAYS, changes.blocks, snap.num_blocks)):
            mask = covered(ranges, size)
            for key in names:
                now = getattr(snap, key)
                diff = np.flatnonzero(now != prev[key])
                assert mask[diff].all(), f"step {snap.step}: {key} changed at unmarked {diff[~mask[diff]][:5]}"
                prev[key] = now
        tables = {int(s): tuple(snap.block_table(int(s))) for s in snap.seq_id} if snap.kind == "paged" else {}
        for sid in set(tables) | set(prev_tables):
            if tables.get(sid, ()) != prev_tables.get(sid, ()):
                assert sid in changes.tables, f"step {snap.step}: table of {sid} changed unmarked"
        prev_tables = tables
