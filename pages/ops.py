"""Ops: the signals an operator watches on a serving loop, over the steps of the current run."""
import streamlit as st

from ui import export, guide, presenter
from ui.lessons import ops as lesson
from ui.runs.sidebar import current_runs

guided = guide.mode(lesson.KEY, help=lesson.GUIDE_HELP, title="Ops dashboard")
if not presenter.on(lesson.KEY):
    st.markdown(
        "The signals of a healthy serving loop, named as vLLM exports them, for the current settings and "
        "workload on both allocators. Each chart says what healthy looks like and what a bad pattern means."
    )

if guided:
    runs = lesson.guided_runs()
    show = guide.nav(lesson.KEY, lesson.guide_steps(runs)).show
    if presenter.on(lesson.KEY):
        lesson.slide(runs, show)
        st.stop()
    marker, upto = show["step"], show.get("upto")
else:
    runs = current_runs()
    marker = upto = None
if runs is None:
    st.stop()
if any(r.engine is not None and r.num_steps == 0 for r in runs):
    st.info("The live run has no steps yet: press Play on *Reserve or page* first.")
    st.stop()
lesson.dashboard(runs, marker, upto)
if all(r.done for r in runs):
    export.download_animation(runs, lesson.KEY, "Ops dashboard: the KV pools of the run", "ops")
