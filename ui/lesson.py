"""The lesson contract: what a lesson declares, and the one function that draws its page.

A lesson (``ui/lessons/<name>.py``) ends with one :class:`Lesson`:

* ``key``: the prefix of its widgets' session-state keys (``rop``, ``live``...), ``title`` and
  ``help`` (the Guide-mode toggle's tooltip: what the guide's fixed scenario is);
* ``scenario(guided)``: what runs, returned as the lesson's data (runs, a recording, a view over
  them): the fixed, seeded one in guide mode, else the one the sidebar (or the lesson's own
  widgets) asks for. It may draw those widgets, a spinner, and ``st.error`` + ``st.stop`` when the
  settings are invalid;
* ``guide_steps(data)``: the walkthrough, :class:`~ui.guide.GuideStep` s with their
  :class:`~ui.predict.Prediction` s, every number read off ``data``;
* ``guide_view(data, show)``: what guide mode draws for a step (``show``, with ``reveal`` applied
  once its prediction is answered); ``slide(data, show)``: the same step as a slide, one figure
  (:mod:`ui.presenter`);
* ``explore(data)``: free play (the player, the lesson's widgets), also in presenter mode;
* ``export(data)``: what the page offers to download (an :class:`Export`), or None;
* ``sidebar_note(data)``, optional: which sidebar settings apply, in an expander at the top.

The page script (``pages/<name>.py``) is its prose and one call::

    page(lesson.LESSON, about="...", takeaways="...")

:func:`page` draws the title with the Guide-mode and Presenter-mode toggles, the prose, the
scenario, then the guide's narration, prediction and Previous / Next with the
step's view (or, in presenter mode, its slide and nothing else), or free play, then the takeaways
and the downloads.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from ui import export as exports
from ui import guide, presenter
from ui.guide import GuideStep



def sidebar_or_guided(guided_runs: Callable[[], Any]) -> Callable[[bool], Any]:
    """A ``scenario`` for a lesson over the sidebar's runs: the guide's fixed runs
    (``guided_runs()``) in guide mode, else the runs the sidebar's settings name (the page stops
    when there are none: the sidebar has said why)."""
    def scenario(guided: bool):
        if guided:
            return guided_runs()
        from ui.runs.sidebar import current_runs  # the sidebar's layer: imported when a page draws

        runs = current_runs()
        if runs is None:
            st.stop()
        return runs

    return scenario

@dataclass(frozen=True)
class Export:
    """A lesson's downloads: its runs' heatmaps as one animated HTML file (:mod:`ui.export`), and
    with ``traces`` each run's trace as ``.jsonl`` beside it."""

    runs: Sequence
    title: str
    file_stem: str
    traces: bool = False


@dataclass(frozen=True)
class Lesson:
    key: str
    title: str
    scenario: Callable[[bool], Any]
    guide_steps: Callable[[Any], list[GuideStep]]
    guide_view: Callable[[Any, dict], None]
    slide: Callable[[Any, dict], None]
    explore: Callable[[Any], None]
    export: Callable[[Any], Export | None] = lambda data: None
    help: str | None = None
    sidebar_note: Callable[[Any], str] | None = None


SIDEBAR_NOTE = "Which sidebar settings apply on this page"


def page(lesson: Lesson, *, intro: str = "", about: str = "", free_play_note: str = "", takeaways: str = "") -> None:
    """Draw the page around ``lesson``. The prose: ``intro`` above the lesson; ``about`` folded
    into an "About this lesson" expander, so that the figures start higher on a 1280 x 720 screen;
    ``free_play_note`` a caption above free play only; none of these on a projector (presenter
    mode). ``takeaways`` under the lesson, also under free play on a projector, never on a slide."""
    key = lesson.key
    guided = guide.mode(key, help=lesson.help, title=lesson.title)
    presenting = presenter.on(key)
    settings_box = None
    if not presenting:
        if about:
            st.expander("About this lesson", icon=":material/info:").markdown(about)
        if intro:
            st.markdown(intro)
        if free_play_note and not guided:
            st.caption(free_play_note)
        if lesson.sidebar_note is not None:
            settings_box = st.expander(SIDEBAR_NOTE, icon=":material/tune:")
    data = lesson.scenario(guided)
    if guided:
        show = guide.nav(key, lesson.guide_steps(data)).show
        if presenting:  # a slide: the step's one figure, nothing under it
            lesson.slide(data, show)
            st.stop()
        lesson.guide_view(data, show)
    else:
        lesson.explore(data)
    if takeaways:
        st.markdown(takeaways)
    if settings_box is not None:
        settings_box.markdown(lesson.sidebar_note(data))
    files = lesson.export(data)
    if files is not None:
        downloads(files, key)


def downloads(files: Export, key: str) -> None:
    """The animated HTML file and, with ``files.traces``, each finished run's trace."""
    if not files.traces:
        exports.download_animation(files.runs, key, files.title, files.file_stem)
    else:
        with st.container(horizontal=True, gap="small"):  # each button as wide as its label: none is cut short
            exports.download_animation(files.runs, key, files.title, files.file_stem)
            for run in files.runs:
                st.download_button(f"Download the {run.allocator} trace (.trace)", run.trace_bytes if run.done else b"",
                                   file_name=f"pagedkv-{run.allocator}.trace", mime="application/octet-stream",
                                   disabled=not run.done, key=f"{key}_dl_{run.allocator}", on_click="ignore")
    st.caption(exports.ANIMATION_NOTE)
