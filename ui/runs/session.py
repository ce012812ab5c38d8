"""The Streamlit side of the runs: what one browser session keeps in ``st.session_state`` (its
byte cache of live runs, uploaded traces and uploaded workloads; its live pair and that pair's
stepper) and what the pages show about them (st.error, st.warning, st.info). The runs themselves
are made by the modules beside this one, which never touch Streamlit; this module reads no
sidebar setting either (the caller passes them in: :mod:`ui.runs.sidebar`, :mod:`ui.settings`)."""
from __future__ import annotations

import functools

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.record.trace_file import TraceError
from pagedkv_core.sizing.memory import BudgetError, ByteCache, session_budget
from pagedkv_core.workloads.scenarios import Workload, workload_from_bytes
from ui.live_stepper import LiveStepper
from ui.runs.budgets import workload_bytes
from ui.runs.live import LIVE_BATCH_TOKENS, LiveRun, after_live_step, check_live_fits, live_requests, start_live
from ui.runs.model import BASELINE_LABELS, Run, still_stepping
from ui.runs.uploaded import replay_trace
from ui.workshop import check_upload


def session_runs() -> ByteCache:
    """This browser session's live runs, uploaded traces and workloads, evicted by bytes."""
    cache = st.session_state.get("_session_runs")
    if cache is None:
        cache = st.session_state["_session_runs"] = ByteCache(session_budget(), "this session's runs")
    cache.capacity = session_budget()
    return cache


def uploaded_workload(upload, seed: int, options: dict) -> Workload:
    """The uploaded workload file (JSON, or a request log read with ``options``), parsed once per
    session for each seed and options. Raises ConfigError (one line)."""
    key = ("workload", getattr(upload, "file_id", upload.name), upload.size, seed, tuple(sorted(options.items())))
    cache = session_runs()
    workload = cache.get(key)
    if workload is None:
        check_upload(upload, "workload file")
        workload = workload_from_bytes(upload.getvalue(), upload.name, seed=seed, **options)
        cache.put(key, workload, workload_bytes(workload))
    st.session_state["_workload_upload"] = (key, workload)  # what the pages run (tests read it back)
    return workload


def uploaded_trace() -> Run | None:
    """The trace uploaded in the sidebar, as a finished Run (:func:`ui.runs.uploaded.replay_trace`),
    kept in the session; shows st.error and returns None when the file is not a pagedkv trace or
    its recording would not fit the session budget."""
    upload = st.session_state.get("trace_upload")
    if upload is None:
        return None
    key = ("trace", getattr(upload, "file_id", upload.name), upload.size)
    cache = session_runs()
    run = cache.get(key)
    if run is not None:
        return run
    try:
        check_upload(upload, "trace")
        run = replay_trace(upload.name, upload.getvalue())
        cache.put(key, run, run.nbytes)
    except (ConfigError, TraceError) as exc:
        st.error(f"Cannot replay {upload.name}: {exc}")
        return None
    return run


def report_stops(runs: list[Run]) -> None:
    """A warning per run stopped for the memory budget."""
    for run in runs:
        if run.stopped:
            st.warning(f"The {BASELINE_LABELS.get(run.allocator, run.label)} run was stopped: {run.stopped}.")


# ---------------------------------------------------------------------------- live runs
def live_pair(configs: list[EngineConfig], replay: bool) -> list[LiveRun] | None:
    """The live pair on the sidebar's model (:mod:`ui.runs.live`): ``configs`` (a contiguous
    baseline and paged), on the 16 chat prompts, or on the Azure log's first 16 requests when
    ``replay``. Kept in the session until the settings change; its first step (at most
    :data:`~ui.runs.live.LIVE_BATCH_TOKENS` tokens each) is computed here. None (after st.error)
    when the model cannot load. Raises BudgetError (a ConfigError) before allocating when the two
    KV pools would not fit the session budget."""
    from ui.models import engine_factory, model_path, runner_dtype, token_text_lookup

    if configs[0].allocator != "contiguous" and not replay:
        st.info(f"{BASELINE_LABELS[configs[0].allocator]} needs each answer's length in advance; SmolLM2's chat "
                "requests state none, so it reserves max_tokens, like Orca Max. Pick an azure-conv workload to "
                "replay the trace's lengths, which it knows.")
    key = ("live", tuple(configs), model_path(), runner_dtype(), replay)
    cache = session_runs()
    held = cache.get(key)
    if held is not None:
        st.session_state["_live_key"] = key
        return held
    make = engine_factory()
    if make is None:
        return None
    kv = check_live_fits(make, configs, session_budget())
    runs = start_live(make, configs, kv, live_requests(make.tokenizer, replay), token_text_lookup())
    cache.put(key, runs, sum(r.nbytes for r in runs))
    st.session_state["_live_key"] = key
    with st.spinner(f"SmolLM2's first step ({LIVE_BATCH_TOKENS} prompt tokens on each side)…"):
        advance_live(runs, 0)
    return runs


def _stepper(runs: list[LiveRun]) -> LiveStepper:
    """This session's stepper for ``runs``; a stepper of other runs (the settings changed) is
    stopped and replaced."""
    held = st.session_state.get("_live_stepper")
    if held is None or len(held.runs) != len(runs) or any(a is not b for a, b in zip(held.runs, runs)):
        if held is not None:
            held.cancel()
        from ui.models import step_together, tokenizer

        held = LiveStepper(runs, functools.partial(after_live_step, budget=session_budget(), tokenizer=tokenizer()),
                           together=step_together)
        st.session_state["_live_stepper"] = held
    return held


def advance_live(runs: list[LiveRun], to_step: int, *, ahead: int = 0) -> None:
    """Make every unfinished live run record step ``to_step`` (returns once each has, or has
    ended), and keep them stepping on their own thread up to ``to_step + ahead`` while the page
    draws. A page that plays asks for the step after the one it shows with a lookahead (the
    next frame is then usually computed already); Step asks for one more step and no lookahead;
    a lower step than before stops the stepping there. Shows st.warning if a step takes longer
    than the stepper's timeout; re-raises an error a step raised."""
    if not any(still_stepping(r) for r in runs):
        return
    if not _stepper(runs).advance(to_step, ahead=ahead):
        st.warning(f"SmolLM2 has not finished step {to_step} yet: the machine is busy. It keeps computing; "
                   "press Step or Play again in a moment.")
    key = st.session_state.get("_live_key")
    if key is not None:
        session_runs().touch(key, sum(r.nbytes for r in runs))
