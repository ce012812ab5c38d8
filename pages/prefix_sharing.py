"""Prefix sharing and copy-on-write: requests A, B, C (three parallel samples) and D share a
~620-token system prompt on the real model. Every number is read from the recorded run."""
import streamlit as st

from pagedkv_core.config import ConfigError
from ui import export, guide, presenter
from ui.lessons import prefix_sharing as lesson
from ui.models import token_text_lookup
from ui.timed_runs import cached

guided = guide.mode(lesson.KEY, title="Prefix sharing and copy-on-write")
if not presenter.on(lesson.KEY):  # the prose folded away: the figures start higher on a 1280 x 720 screen
    st.expander("About this lesson", icon=":material/info:").markdown(
        "Four requests to a library help desk start with the **same long system prompt** (its length in tokens "
        "is measured below). "
        "**A** arrives first and pays for all of it. **B** follows with the same preamble: the engine finds "
        "A's blocks by their chained hash and skips their prefill. **C** asks for **three samples** (n = 3), "
        "which share every block until each writes its own token: copy-on-write. **D** comes after everyone "
        "has finished and still finds the preamble cached. SmolLM2 runs every step for real."
    )
config, seed = (lesson.GUIDE_CONFIG, lesson.GUIDE_SEED) if guided else lesson.explore_settings()
try:
    rec = cached(lesson.prefix_sharing_run, config, seed, spinner=lesson.SPINNER)
except ConfigError as exc:  # the sidebar's pool does not fit the memory budget (BudgetError)
    st.error(str(exc))
    st.stop()
if rec is None:
    st.stop()
for rid, reason in rec.rejected.items():
    st.error(f"Request {rid} was rejected: {reason}")
if not rec.num_steps:
    st.stop()

view = lesson.PrefixView(rec, token_text_lookup())
if guided:
    lesson.show_guide(view)
else:
    lesson.explore(view)

st.markdown(lesson.takeaways(rec))
export.download_animation([rec], lesson.KEY, "Prefix sharing and copy-on-write: A, B, C (n = 3) and D on SmolLM2",
                          "prefix-sharing")
