"""Guide mode, shared by the teaching pages: a fixed, seeded sequence of steps with one sentence
of narration each, and Previous / Next, so that a workshop can follow along and every screen shows
the same thing.

A guide is a list of :class:`GuideStep`. ``show`` says what the page draws for the step (a step of
a fixed recorded run, a request to select, a block size to highlight...); the page interprets it.

    if guide.mode(KEY):
        step = guide.nav(KEY, steps)      # draws the narration and the buttons
        draw(**step.show)

A link can open a guide at a given step: ``?guide=on&guide_step=3`` (1-based).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import streamlit as st


@dataclass(frozen=True)
class GuideStep:
    title: str
    narration: str
    show: dict = field(default_factory=dict)


def _from_url(key: str) -> None:
    """Once per page and session: open guide mode (and a step) from the query string."""
    done = f"_{key}_guide_url"
    if st.session_state.get(done):
        return
    st.session_state[done] = True
    if st.query_params.get("guide", "").lower() in ("1", "on", "true", "yes"):
        st.session_state[f"{key}_guide"] = True
        raw = st.query_params.get("guide_step", "")
        if raw.isdigit() and int(raw) >= 1:
            st.session_state[f"{key}_guide_step"] = int(raw) - 1


def mode(key: str, help: str | None = None) -> bool:
    """The Guide-mode toggle at the top of a page. True while it is on."""
    _from_url(key)
    return st.toggle(
        "Guide mode", key=f"{key}_guide",
        help=help or "A fixed, seeded walkthrough with Next / Previous: everyone in a workshop sees the same steps.",
    )


def nav(key: str, steps: list[GuideStep]) -> GuideStep:
    """Draw the step's narration and the Previous / Next buttons; return the step to show."""
    if not steps:
        raise ValueError("a guide needs at least one step")
    step_key = f"{key}_guide_step"
    i = max(0, min(int(st.session_state.get(step_key, 0)), len(steps) - 1))
    st.session_state[step_key] = i

    def go(delta: int) -> None:
        st.session_state[step_key] = max(0, min(len(steps) - 1, int(st.session_state.get(step_key, 0)) + delta))

    c = st.columns([1.2, 1.2, 6])
    c[0].button("Previous", icon=":material/chevron_left:", key=f"{key}_guide_prev", on_click=go, args=(-1,),
                disabled=i == 0, width="stretch")
    c[1].button("Next", icon=":material/chevron_right:", key=f"{key}_guide_next", on_click=go, args=(1,),
                disabled=i == len(steps) - 1, type="primary", width="stretch")
    step = steps[i]
    c[2].markdown(f"**Step {i + 1} of {len(steps)}: {step.title}**")
    st.progress((i + 1) / len(steps))
    st.info(step.narration, icon=":material/school:")
    return step
