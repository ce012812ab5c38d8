"""Byte caches and budgets: what a run will hold before it starts, the note a run stopped for its
budget carries, and the process-wide cache of finished runs. No Streamlit here (each browser
session's own cache is :func:`ui.runs.session.session_runs`).

Finished scripted runs are kept once per process in a :class:`~pagedkv_core.sizing.memory.ByteCache`
of :func:`~pagedkv_core.sizing.memory.process_budget` bytes, so visitors share them; live runs and
uploaded traces are kept per browser session in one of
:func:`~pagedkv_core.sizing.memory.session_budget` bytes. Both evict the least recently used runs
by bytes. A run is refused before it starts when its fixed part (:func:`run_bytes_estimate`, plus
a real model's KV pool) would not fit its share of the session budget, and stopped, saying so
(:func:`budget_note`), when its recording grows past that share.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

from pagedkv_core.config import EngineConfig
from pagedkv_core.kv.registry import allocator_kind
from pagedkv_core.record.recording import pool_bytes
from pagedkv_core.sizing.kv_math import format_bytes
from pagedkv_core.sizing.memory import ByteCache, process_budget
from pagedkv_core.workloads.scenarios import Workload
from ui.runs.model import CACHED_SNAPSHOTS, Run, engine_bytes

RECORDING_STATES = 3  # a recording holds its first keyframe, its last step and at()'s cursor
WORKLOAD_REQUEST_BYTES = 400  # one WorkloadRequest: the dataclass, its id string and its tuple


def run_bytes_estimate(config: EngineConfig) -> int:
    """What a run holds before its first step: the engine (:func:`~ui.runs.model.engine_bytes`),
    the recording's keyframe and working states, and the snapshots the run keeps rebuilt. The
    recording then grows by what each step changes (about 13 B a changed slot)."""
    paged = allocator_kind(config.allocator) == "paged"
    copy = pool_bytes(config.pool_slots, config.num_blocks if paged else 0)
    return engine_bytes(config) + (RECORDING_STATES + CACHED_SNAPSHOTS) * copy


def workload_bytes(workload: Workload) -> int:
    """What a workload holds: its prompts as tuples of Python ints (36 B a token) and each
    request's own objects."""
    return sum(36 * len(r.prompt) + WORKLOAD_REQUEST_BYTES for r in workload.requests)


def budget_note(run: Run, budget: int) -> str:
    """Why ``run`` was stopped: its recording outgrew ``budget`` (:attr:`Run.stopped <ui.runs.model.Run.stopped>`)."""
    return (f"its recording reached {format_bytes(run.nbytes)} at step {run.num_steps - 1}, past its share of the "
            f"memory budget ({format_bytes(budget)}); pick a smaller pool or fewer requests to see the rest")


_PROCESS_LOCK = threading.Lock()
_PROCESS_RUNS = ByteCache(process_budget(), "the app's shared runs")


def process_runs() -> ByteCache:
    """Finished runs shared by every session of this process, evicted by bytes."""
    _PROCESS_RUNS.capacity = process_budget()  # the budget can be changed while the app runs
    return _PROCESS_RUNS


def shared_run(key: Hashable, make: Callable[[], Run]) -> Run:
    """``make()``'s run, made once per process for each ``key`` and kept in :func:`process_runs`
    (made outside the lock: two sessions asking at once may both make it, and the last one kept
    wins). Raises what ``make`` raises, and BudgetError when the run cannot be kept."""
    with _PROCESS_LOCK:
        run = process_runs().get(key)
    if run is None:
        run = make()
        with _PROCESS_LOCK:
            process_runs().put(key, run, run.nbytes)
    return run
