"""Scripted runs: a workload played to its end on the scripted token source, recorded step by step
with its memory-waste breakdown, and kept once per process (:func:`ui.runs.budgets.shared_run`).
No Streamlit here; the built-in scenarios are built once per process (:func:`named_workload`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.record.recording import Recording
from pagedkv_core.record.waste import WasteAccumulator, final_written
from pagedkv_core.sizing.kv_math import format_bytes
from pagedkv_core.sizing.memory import check_fits, session_budget
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import Workload, build_workload
from ui.runs.budgets import budget_note, run_bytes_estimate, shared_run
from ui.runs.model import BASELINE_LABELS, Run, compact_header, engine_bytes

MAX_SCRIPTED_STEPS = 5000  # a scripted scenario that has not ended by then is cut short (and says so)


@dataclass(eq=False)
class ScriptedRun(Run):
    """A finished run of a workload on the scripted source, with what only such a run measures."""

    waste: dict = field(default_factory=dict)  # the memory-waste breakdown (pagedkv_core.record.waste)


@lru_cache(maxsize=4)
def named_workload(name: str, seed: int) -> Workload:
    """A built-in scenario, built once per process for each seed (the request-log scenarios take
    a quarter of a second to build)."""
    return build_workload(name, seed=seed)


def play_scripted(config: EngineConfig, workload: Workload, label: str, *, budget: int | None = None) -> ScriptedRun:
    """Play a workload to the end (or MAX_SCRIPTED_STEPS) on the scripted source, recording every
    step and measuring the memory-waste breakdown as it goes. ``budget`` (default: the session
    budget): refused with BudgetError before the first step when the run's fixed part would not
    fit, stopped (``Run.stopped`` says why) when its recording grows past it."""
    budget = session_budget() if budget is None else int(budget)
    check_fits(run_bytes_estimate(config), budget,
               f"a {config.pool_slots:,}-slot {BASELINE_LABELS.get(label, label)} run "
               f"(engine arrays {format_bytes(engine_bytes(config))} plus its recording's keyframes)",
               hint="pick a smaller pool, or raise PAGEDKV_SESSION_BUDGET")
    recording = Recording()
    engine = Engine(config, ScriptedSource(), recording=recording)
    workload.submit(engine)
    run = ScriptedRun(label, config, request_ids=list(engine.requests), recording=recording, engine=engine)
    waste = WasteAccumulator(per_step=False)  # the breakdown alone: sums, not steps
    while engine.has_unfinished() and recording.num_steps < MAX_SCRIPTED_STEPS:
        engine.step(snapshot=False, outputs=False)  # the recording and the waste read the engine, not outputs
        waste.add_engine(engine)
        if run.nbytes > budget:
            run.stopped = budget_note(run, budget)
            break
    run.waste = waste.breakdown(final_written(engine))
    run.header = {**compact_header(engine), "summary": engine.summary().to_json()}
    run.done = not engine.has_unfinished()
    run.engine = None  # the recording keeps every step: drop the allocator's arrays
    return run


def scripted_run(config: EngineConfig, workload: Workload, label: str, *, budget: int | None = None) -> ScriptedRun:
    """:func:`play_scripted`, once per process for each (config, workload, label), kept in
    :func:`ui.runs.budgets.process_runs`. Raises BudgetError (a ConfigError) when the run cannot fit."""
    return shared_run((config, workload, label), lambda: play_scripted(config, workload, label, budget=budget))


def scripted_runs(workload: Workload, allocators, **config) -> list[ScriptedRun]:
    """The workload on each allocator (cached), same settings; each run may hold an equal share
    of the session budget."""
    allocators = list(allocators)
    share = session_budget() // max(1, len(allocators))
    return [scripted_run(EngineConfig(allocator=a, **config), workload, a, budget=share) for a in allocators]


def scripted_pair(workload: Workload, contiguous: str = "contiguous", **config) -> list[ScriptedRun]:
    """The workload on a contiguous baseline (Orca Max unless told) and on paged blocks (cached)."""
    return scripted_runs(workload, (contiguous, "paged"), **config)
