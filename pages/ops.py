"""Ops: the signals an operator watches on a serving loop, over the steps of the current run."""
import streamlit as st

from ui import guide
from ui.lessons import ops as lesson
from ui.runs import current_runs

st.title("Ops dashboard")
st.markdown(
    "The signals of a healthy serving loop, named as vLLM exports them, for the current settings and "
    "workload on both allocators. Each chart says what healthy looks like and what a bad pattern means."
)

if guide.mode(lesson.KEY, help=lesson.GUIDE_HELP):
    runs = lesson.guided_runs()
    marker = guide.nav(lesson.KEY, lesson.guide_steps(runs)).show["step"]
else:
    runs = current_runs()
    marker = None
if runs is None:
    st.stop()
if any(r.engine is not None and r.num_steps == 0 for r in runs):
    st.info("The live run has no steps yet: press Play on *Reserve or page* first.")
    st.stop()
lesson.dashboard(runs, marker)
