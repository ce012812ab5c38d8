"""External fragmentation answers "why does the queue wait?" (issue 21, item 5).

A contiguous allocator admits the head of the waiting queue only into one free run at least as
long as its reservation (``next_reservation``). A free run shorter than that is external
fragmentation (dusty red), whatever its size; a longer one is plain free (grey). Admission
happens at the start of a step, on the pool the previous step left, so a grey run at the end of
step s means the head is admitted in step s + 1, and a pool of dusty red alone means it waits.
"""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv_core.kv.registry import CONTIGUOUS_POLICIES
from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import ADMIT
from pagedkv_core.record.recording import Recording
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.slot_state import SlotState
from pagedkv_core.workloads.scenarios import build_workload


@pytest.mark.parametrize("allocator", sorted(CONTIGUOUS_POLICIES.values()) + ["contiguous-best-fit"])
def test_a_grey_run_long_enough_for_the_head_means_it_is_admitted_next_step(allocator):
    workload = build_workload("explainer40")
    rec = Recording()
    engine = Engine(EngineConfig(allocator=allocator, pool_slots=workload.pool_slots), ScriptedSource(), recording=rec)
    workload.submit(engine)
    engine.run(snapshot=False)
    blocked = admitted_later = 0
    for s in list(rec.steps)[:-1]:
        m = rec.metrics(s)
        if not m.num_waiting:
            assert m.next_reservation == 0 and m.fragmented_slots == 0
            continue
        admits = any(e.kind == ADMIT for e in rec.events(s + 1))
        fits = m.largest_free_run >= m.next_reservation
        assert admits == fits, (s, m.largest_free_run, m.next_reservation)
        blocked += not fits
        admitted_later += fits
    assert blocked and admitted_later  # both cases happen in this run


def test_dusty_red_is_every_free_run_shorter_than_the_heads_reservation():
    workload = build_workload("explainer40")
    rec = Recording()
    engine = Engine(EngineConfig(allocator="contiguous", pool_slots=workload.pool_slots), ScriptedSource(), recording=rec)
    workload.submit(engine)
    engine.run(snapshot=False)
    for s in rec.steps:
        snap = rec.at(s, copy=False)
        m = snap.metrics
        free = np.isin(snap.slot_state, (SlotState.FREE, SlotState.FRAGMENT))
        edges = np.flatnonzero(np.diff(np.concatenate(([0], free.astype(np.int8), [0]))))
        runs = edges[1::2] - edges[::2]
        assert m.fragmented_slots == int(runs[runs < m.next_reservation].sum())
        assert int((snap.slot_state == SlotState.FRAGMENT).sum()) == m.fragmented_slots
        assert m.largest_free_run == (int(runs.max()) if len(runs) else 0)
