"""Guide mode, shared by the teaching pages: a fixed, seeded sequence of steps with one sentence
of narration each, and Previous / Next, so that a workshop can follow along and every screen shows
the same thing.

A guide is a list of :class:`GuideStep`. ``show`` says what the page draws for the step (a step of
a fixed recorded run, a request to select, a block size to highlight...); the page interprets it.
A step may ask a :class:`~ui.predict.Prediction` first: ``show`` is then the situation the
question is about, and ``reveal`` (merged over ``show``) what the page draws once the student has
answered, typically the step where the run answers it.

    if guide.mode(KEY):
        step = guide.nav(KEY, steps)      # draws the narration, the prediction and the buttons
        draw(**step.show)

A lesson page does not write this itself: :func:`ui.lesson.page` does, around the lesson's
:class:`~ui.lesson.Lesson`.

A link can open a guide at a given step: ``?guide=on&guide_step=3`` (1-based); ``?present=on``
opens it in presenter mode (:mod:`ui.presenter`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import streamlit as st

from ui import predict, presenter
from ui.predict import Prediction


@dataclass(frozen=True)
class GuideStep:
    title: str
    narration: str
    show: dict = field(default_factory=dict)
    predict: Prediction | None = None
    reveal: dict = field(default_factory=dict)  # merged over ``show`` once the prediction is answered


def _from_url(key: str) -> None:
    """Once per page and session: open guide mode (and a step) from the query string."""
    done = f"_{key}_guide_url"
    if st.session_state.get(done):
        return
    st.session_state[done] = True
    presenting = presenter.on(key)  # reads ?present= first: it turns the guide on unless guide=off
    if st.query_params.get("guide", "").lower() in ("1", "on", "true", "yes") or (presenting and st.session_state.get(f"{key}_guide")):
        st.session_state[f"{key}_guide"] = True
        raw = st.query_params.get("guide_step", "")
        if raw.isascii() and raw.isdigit() and int(raw) >= 1:  # "²".isdigit() is True, int("²") fails
            st.session_state[f"{key}_guide_step"] = int(raw) - 1


def mode(key: str, help: str | None = None, *, title: str | None = None) -> bool:
    """The page's title (when given) with the Guide-mode and Presenter-mode toggles beside it. True
    while the guide is on (:func:`ui.presenter.on` says whether it is shown as slides; presenter
    mode with the guide off is free play on a projector)."""
    _from_url(key)
    guide_key = f"{key}_guide"

    # Small gaps: at 1280 px beside the sidebar the longest title (Under pressure's) and the two
    # toggles share one row (with large gaps the toggles wrapped under it, leaving a blank band).
    with st.container(horizontal=True, gap="small", vertical_alignment="center"):
        if title:
            st.title(title, width="content")
        with st.container(horizontal=True, gap="small", vertical_alignment="center", width="content"):  # wrap together
            on = st.toggle(
                "Guide mode", key=guide_key,
                help=help or "A fixed, seeded walkthrough with Next / Previous: everyone in a workshop sees the same steps.",
            )
            presenter.toggle(key, guide_key)
    return on


def predictions(steps: list[GuideStep]) -> list[Prediction]:
    """The questions a guide asks, in order."""
    return [s.predict for s in steps if s.predict is not None]


def nav(key: str, steps: list[GuideStep]) -> GuideStep:
    """Draw the step's narration, its prediction (if any) and the Previous / Next buttons; return
    the step to show (with ``reveal`` applied once its prediction is answered)."""
    if not steps:
        raise ValueError("a guide needs at least one step")
    step_key = f"{key}_guide_step"
    i = max(0, min(int(st.session_state.get(step_key, 0)), len(steps) - 1))
    st.session_state[step_key] = i

    def go(delta: int) -> None:
        st.session_state[step_key] = max(0, min(len(steps) - 1, int(st.session_state.get(step_key, 0)) + delta))

    presenting = presenter.on(key)
    c = st.columns([1.2, 1.2, 6] if not presenting else [1.3, 1.3, 6])
    c[0].button("Previous", icon=":material/chevron_left:", key=f"{key}_guide_prev", on_click=go, args=(-1,),
                disabled=i == 0, width="stretch", shortcut=presenter.PREVIOUS_KEY if presenting else None)
    c[1].button("Next", icon=":material/chevron_right:", key=f"{key}_guide_next", on_click=go, args=(1,),
                disabled=i == len(steps) - 1, type="primary", width="stretch",
                shortcut=presenter.NEXT_KEY if presenting else None)
    step = steps[i]
    header = c[2].empty()  # filled last, so the score counts an answer given in this run
    if not presenting:
        st.progress((i + 1) / len(steps))
    st.info(step.narration, icon=":material/school:")
    shown = step
    if step.predict is not None:
        predict.ask(step.predict, key)
        if predict.answered(step.predict, key) and step.reveal:
            shown = replace(step, show={**step.show, **step.reveal})
    above = None  # on a slide the figure gets what the rows drawn above it leave of the screen
    if presenting:
        above = presenter.TOP_PX + presenter.box_px(step.narration) + presenter.GAP_PX
        if step.predict is not None:
            above += predict.slide_px(step.predict, key) + presenter.GAP_PX
    presenter.fit(step.predict is not None, above_px=above)
    right, answered = predict.score()
    asks = any(s.predict is not None for s in steps)
    header.markdown(f"**Part {i + 1} of {len(steps)}: {step.title}**"
                    + (f" · predictions right this session: **{right}** of {answered}" if asks else ""))
    return shown
