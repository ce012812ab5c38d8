"""Lesson 4's scenario: a load spike on a pool too small for it, run on the real model twice, once
preempting by swap and once by recompute, with the same requests and greedy decoding (so both modes
must agree on every token).

The two runs are stepped in turn (:func:`pressure_pair`), so the machine's load weighs on both
alike. The lesson itself is :mod:`ui.lessons.under_pressure`."""
from __future__ import annotations

import streamlit as st

from pagedkv_core.config import ConfigError, EngineConfig
from pagedkv_core.sampling import SamplingParams
from ui.models import chat_prompt
from ui.timed_runs import TimedRun, cached, new_timed_run, run_interleaved

MODES = ("swap", "recompute")
PRESSURE_QUESTIONS = [
    "Explain what a CPU does.",
    "Why is the sky blue?",
    "How do plants make food?",
    "Why do we have seasons?",
    "Describe a cat to someone who has never seen one.",
    "What does a librarian do?",
]
PRESSURE_FIRST = 2  # requests at step 0; the rest arrive together at PRESSURE_SPIKE_STEP
PRESSURE_SPIKE_STEP = 2
PRESSURE_MAX_TOKENS = 32
PRESSURE_POOL_SLOTS = 256
GUIDE_BLOCK, GUIDE_POOL, GUIDE_WATERMARK = 16, PRESSURE_POOL_SLOTS, 0.1
POOL_CHOICES = [128, 160, 192, 224, 256, 320, 384, 512]


def add_pressure_requests(rec: TimedRun, tokenizer, max_tokens: int = PRESSURE_MAX_TOKENS) -> TimedRun:
    for i, q in enumerate(PRESSURE_QUESTIONS):
        arrival = 0 if i < PRESSURE_FIRST else PRESSURE_SPIKE_STEP
        rec.add(f"r{i}", chat_prompt(tokenizer, q), SamplingParams(max_tokens=max_tokens), text=q, arrival_step=arrival)
    return rec


def pressure_run(make_engine, tokenizer, config: EngineConfig, max_tokens: int = PRESSURE_MAX_TOKENS) -> TimedRun:
    """The spike under ``config``'s preemption mode, alone."""
    rec = add_pressure_requests(new_timed_run(config.preemption, config, make_engine), tokenizer, max_tokens)
    return rec.run().release()


def pressure_pair(make_engine, tokenizer, swap_config: EngineConfig, recompute_config: EngineConfig,
                  max_tokens: int = PRESSURE_MAX_TOKENS) -> dict[str, TimedRun]:
    """The spike under both modes, run interleaved step by step (:func:`ui.timed_runs.run_interleaved`)
    so that their measured step times share the machine's load."""
    recs = {m: add_pressure_requests(new_timed_run(m, cfg, make_engine), tokenizer, max_tokens)
            for m, cfg in (("swap", swap_config), ("recompute", recompute_config))}
    run_interleaved(list(recs.values()))
    return {m: r.release() for m, r in recs.items()}


def recorded_runs(block_size: int, pool_slots: int, watermark: float, prefix_caching: bool) -> dict[str, TimedRun]:
    """The spike under each preemption mode (swap pool: the config's default, the pool's size),
    cached; shows st.error and stops when the settings are invalid or the model cannot load."""
    try:
        configs = {m: EngineConfig(block_size=block_size, pool_slots=pool_slots, watermark=watermark, preemption=m,
                                   prefix_caching=prefix_caching) for m in MODES}
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
    try:
        recs = cached(pressure_pair, configs["swap"], configs["recompute"],
                      spinner="Running the spike with swap and with recompute on SmolLM2, a step of each in turn…")
    except ConfigError as exc:  # the pools would not fit the memory budget (BudgetError)
        st.error(str(exc))
        st.stop()
    if recs is None:
        st.stop()
    for m, rec in recs.items():
        for rid, reason in rec.rejected.items():
            st.error(f"{m}: request {rid} was rejected: {reason}")
    return recs
