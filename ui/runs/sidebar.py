"""The runs the sidebar's settings name: the engine config of a page's allocator, the contiguous
baseline, and :func:`current_runs`, what a pool page shows. The one module of :mod:`ui.runs` that
reads :mod:`ui.settings` (which itself imports only :mod:`ui.runs.session` and
:mod:`ui.runs.scripted`: no import circle)."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.kv.registry import CONTIGUOUS_POLICIES
from ui import settings
from ui.runs.live import live_configs, live_workload_note
from ui.runs.model import Run
from ui.runs.scripted import scripted_pair
from ui.runs.session import live_pair, report_stops, uploaded_trace


def settings_config(allocator: str, **overrides) -> EngineConfig:
    """EngineConfig from the sidebar settings. Raises ConfigError (one line) on a bad combination."""
    return EngineConfig(**{**settings.engine_settings(), "allocator": allocator, **overrides})


def contiguous_allocator() -> str:
    """The sidebar's contiguous baseline: its registry name (Orca Max, Pow2 or Oracle)."""
    return CONTIGUOUS_POLICIES[settings.current("contiguous_policy")]


def current_runs() -> list[Run] | None:
    """The runs a pool page shows for the sidebar settings: an uploaded trace; else the workload on
    the sidebar's contiguous baseline and on paged blocks, scripted (finished, cached) or on the
    real model (live). Shows st.error and returns None when the settings are invalid or the runs
    would not fit the memory budget."""
    trace = uploaded_trace()
    if st.session_state.get("trace_upload") is not None:
        return [trace] if trace is not None else None
    try:
        if settings.current("source") == "model":
            # An Azure request-log workload in the sidebar: replay its first 16 requests' lengths
            # (x1/8) on SmolLM2, real-text prompts and answers of exactly those lengths.
            workload = str(settings.current("workload"))
            replay = workload.startswith("azure-conv")
            st.caption(live_workload_note(workload))
            return live_pair(live_configs(contiguous_allocator(), **settings.engine_settings()), replay)
        runs = scripted_pair(settings.current_workload(), contiguous_allocator(), **settings.engine_settings())
    except ConfigError as exc:
        st.error(str(exc))
        return None
    report_stops(runs)
    return runs
