"""Several engines stepped in lockstep: each schedules its step, their sources' work runs as one
call, and each completes its step with its own answer.

Two engines on one model (the live pages' contiguous baseline and paged side by side) each read
all of the model's weights in every forward: at the few rows a live step has, reading the weights
is most of a forward's time on a CPU. Run as one forward
(:meth:`pagedkv_core.sources.model.runner.ModelRunner.execute_together`), the pair reads them once
a step. Each engine's step is otherwise its own (:meth:`Engine.start_step` and
:meth:`Engine.finish_step` are :meth:`Engine.step`'s two halves), and each gets the tokens its
own forward would have given, bit for bit.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .engine import Engine

# execute_together(sources, batches) -> each source's answer (seq id -> new tokens), in order
ExecuteTogether = Callable[[list, list], list[dict[int, list[int]]]]


def step_together(engines: Sequence[Engine], execute_together: ExecuteTogether, snapshot: bool = False) -> list:
    """One step of every engine of ``engines``; the sources of those with work in it run their
    batches in one ``execute_together`` call. Returns each engine's :meth:`Engine.step` result, in
    order. Each engine's ``execute_s`` (its metrics) is the shared call's time."""
    started = [engine.start_step(snapshot) for engine in engines]
    busy = [i for i, s in enumerate(started) if s.executes]
    answers: dict[int, dict[int, list[int]]] = {}
    seconds = 0.0
    if busy:
        t0 = time.perf_counter()
        results = execute_together([engines[i].source for i in busy], [started[i].batch for i in busy])
        seconds = time.perf_counter() - t0
        answers = dict(zip(busy, results))
    return [engine.finish_step(s, answers.get(i, {}), seconds if i in answers else 0.0)
            for i, (engine, s) in enumerate(zip(engines, started))]
