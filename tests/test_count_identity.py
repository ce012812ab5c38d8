"""Every step's counts describe one moment, the end of the step (issue 21, item 3).

At the end of step s, every request that has arrived (``arrival_step <= s``) is in exactly one
place: running, waiting (queued, or preempted for recompute), swapped out, finished or
rejected. A sequence that finishes in step s is finished, no longer running, at step s. So

    num_running + num_waiting + num_swapped + num_finished + num_rejected = requests arrived

at every step of every recording (one sample per request, as in every built-in scenario), and
the three queue counts equal the snapshot's queues.
"""
from __future__ import annotations

import numpy as np
import pytest

from pagedkv_core.kv.registry import ALLOCATORS, allocator_class
from pagedkv_core.config import PREEMPTION_MODES, EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.record.recording import Recording
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import WORKLOADS, build_workload, parse_workload

COUNTS = ("num_running", "num_waiting", "num_swapped", "num_finished", "num_rejected")
BIG = "azure-conv"  # 1,000 requests, 5,000-9,000 steps a run: its paged and Orca Max runs only


def _cases():
    for name in WORKLOADS:
        for alloc in ALLOCATORS:
            if name == BIG and alloc not in ("paged", "contiguous"):
                continue  # the same trace, 1/8 scale, runs on every allocator as azure-conv-small
            for mode in PREEMPTION_MODES:
                if mode != PREEMPTION_MODES[0] and not allocator_class(alloc).capabilities.swap:
                    continue  # an allocator that cannot preempt runs the same in either mode
                yield pytest.param(name, alloc, mode, id=f"{name}-{alloc}-{mode}")


def _record(workload, allocator: str, preemption: str, pool_slots: int | None = None) -> Recording:
    rec = Recording()
    cfg = EngineConfig(allocator=allocator, pool_slots=pool_slots or workload.pool_slots, preemption=preemption)
    engine = Engine(cfg, ScriptedSource(), recording=rec)
    workload.submit(engine)
    engine.run(snapshot=False)
    return rec


def _check_identity(workload, rec: Recording, check_snapshots: bool) -> None:
    arrivals = np.sort([r.arrival_step for r in workload.requests])
    steps = np.asarray(rec.steps)
    arrived = np.searchsorted(arrivals, steps, side="right")
    total = sum(rec.metrics_series(name).astype(np.int64) for name in COUNTS)
    bad = np.nonzero(total != arrived)[0]
    assert not len(bad), (f"step {steps[bad[0]]}: " + ", ".join(f"{n} {rec.metrics(steps[bad[0]]).__dict__[n]}" for n in COUNTS)
                          + f" != {arrived[bad[0]]} arrived")
    assert rec.metrics(rec.last_step).num_running == 0  # the run ends with nothing running
    assert total[-1] == len(workload.requests)
    if check_snapshots:  # the counts are the queues the snapshot draws, step by step
        for s in rec.steps:
            snap = rec.at(s, copy=False)
            m = snap.metrics
            assert (m.num_running, m.num_waiting, m.num_swapped) == (len(snap.running), len(snap.waiting), len(snap.swapped)), s


@pytest.mark.parametrize("name,allocator,preemption", list(_cases()))
def test_counts_add_up_to_the_arrived_requests_at_every_step(name, allocator, preemption):
    workload = build_workload(name)
    rec = _record(workload, allocator, preemption)
    _check_identity(workload, rec, check_snapshots=name != BIG)


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
@pytest.mark.parametrize("preemption", PREEMPTION_MODES)
def test_counts_add_up_with_rejections_late_arrivals_and_preemption(allocator, preemption):
    """A small pool, requests that arrive late, and two that are rejected (one on arrival,
    one for a bad field): each is counted from its arrival step on, in exactly one place."""
    data = [{"id": f"r{i}", "prompt_len": 40 + 7 * i, "output_len": 30 + 11 * i, "max_tokens": 90,
             "arrival_step": 3 * (i % 4)} for i in range(10)]
    data.append({"id": "too-long", "prompt_len": 400, "output_len": 5, "max_tokens": 10, "arrival_step": 5})
    data.append({"id": "bad", "prompt_len": 10, "output_len": 0, "max_tokens": 10, "arrival_step": 7})
    workload = parse_workload(data, "mixed")
    rec = _record(workload, allocator, preemption, pool_slots=256)
    last = rec.metrics(rec.last_step)
    assert last.num_rejected == 2 and last.num_finished == 10
    if allocator == "paged":
        assert last.num_preemptions > 0  # the pool is small enough to preempt
    _check_identity(workload, rec, check_snapshots=True)


def test_a_request_that_finishes_in_a_step_is_not_running_in_it():
    """The last step of explainer40: 40 finished, nothing running (was 1 running + 40 finished)."""
    workload = build_workload("explainer40")
    for allocator in ("paged", "contiguous"):
        rec = _record(workload, allocator, "recompute")
        m = rec.metrics(rec.last_step)
        assert (m.num_running, m.num_waiting, m.num_swapped, m.num_finished) == (0, 0, 0, 40)
        assert m.kv_usage == 0.0
