"""Under pressure: the same load spike on a pool too small for it, run twice on the real model,
once preempting by swap and once by recompute. Every cost on the page is measured from the runs."""
import streamlit as st

from ui import guide
from ui.lessons import under_pressure as lesson
from ui.models import token_text_lookup

st.title("Under pressure: swap versus recompute")
st.markdown(
    f"A load spike on a small KV pool, run **twice** on SmolLM2 with the same requests and greedy decoding: "
    f"{lesson.PRESSURE_FIRST} requests start at step 0 and {len(lesson.PRESSURE_QUESTIONS) - lesson.PRESSURE_FIRST} "
    f"more arrive together at step {lesson.PRESSURE_SPIKE_STEP}, each answering up to {lesson.PRESSURE_MAX_TOKENS} "
    "tokens. When the running sequences need a block that is not there, the scheduler **preempts** one. **Swap** "
    "copies its blocks to host memory and back later; **recompute** frees them and prefills its tokens again when "
    "it returns."
)

guided = guide.mode(lesson.KEY)
recs = lesson.recorded_runs(*lesson.settings_for(guided))
view = lesson.PressureView(recs, token_text_lookup())
if guided:
    view.show_guide()
else:
    view.explore()

st.markdown("**The answers, and whether both runs agree**")
view.outputs_table()
view.when_each_wins()
