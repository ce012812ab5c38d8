"""Under pressure: the same load spike on a pool too small for it, run twice on the real model,
once preempting by swap and once by recompute. Every cost on the page is measured from the runs."""
import streamlit as st

from ui import export, guide, presenter
from ui.lessons import under_pressure as lesson
from ui.models import token_text_lookup

guided = guide.mode(lesson.KEY, title="Under pressure: swap versus recompute")
if not presenter.on(lesson.KEY):  # the prose folded away: the figures start higher on a 1280 x 720 screen
    st.expander("About this lesson", icon=":material/info:").markdown(
        f"A load spike on a small KV pool, run **twice** on SmolLM2 with the same requests and greedy decoding: "
        f"{lesson.PRESSURE_FIRST} requests start at step 0 and {len(lesson.PRESSURE_QUESTIONS) - lesson.PRESSURE_FIRST} "
        f"more arrive together at step {lesson.PRESSURE_SPIKE_STEP}, each answering up to {lesson.PRESSURE_MAX_TOKENS} "
        "tokens. When the running sequences need a block that is not there, the scheduler must **preempt** one of "
        "them (which one? the guide asks you to predict it). **Swap** copies its blocks to host memory and back later; "
        "**recompute** frees them and prefills its tokens again when it returns. The two runs are stepped in turn, so "
        "both share the machine's load."
    )

recs = lesson.recorded_runs(*lesson.settings_for(guided))
view = lesson.PressureView(recs, token_text_lookup(), lesson.measured_cost_model(recs))
show = view.show_guide() if guided else view.explore() or {"costs": True}

st.markdown("**The answers, and whether both runs agree**")
view.outputs_table()
if show.get("costs"):
    view.when_each_wins()
else:
    st.caption("What each mode cost, and when each wins, come with the guide's bill, after you have predicted it.")
export.download_animation([recs[m] for m in lesson.MODES], lesson.KEY,
                          "Under pressure: the spike preempted by swap and by recompute", "under-pressure")
