"""Live engine: submit prompts to the paged engine running SmolLM2 and watch the text stream while
the blocks fill the pool. Select a request to see its block table as logical -> physical arrows."""
import streamlit as st

from ui import export, guide, presenter
from ui.lessons import live_engine as lesson
from ui.models import engine_factory, token_text_lookup
from ui.timed_runs import cached

guided = guide.mode(lesson.KEY, title="Live engine")
if not presenter.on(lesson.KEY):  # the prose folded away: the figures start higher on a 1280 x 720 screen
    st.expander("About this lesson", icon=":material/info:").markdown(
        "Submit a few prompts and press **Play**: the paged engine runs SmolLM2 one step at a time. Each step every "
        "running request gets one more token, and its K/V lands in a slot of the pool. When a request's last block is "
        "full the block manager hands it another one, from wherever the free list has one. **Hover** a cell to read the "
        "token it holds; **select** a request to see its block table."
    )

make = engine_factory()
if make is None:
    st.stop()
view = lesson.LiveView(token_text_lookup())

if guided:
    rec = cached(lesson.guide_run, lesson.GUIDE_CONFIG,
                 spinner=f"Running the guide's {len(lesson.GUIDE_QUESTIONS)} prompts on SmolLM2, up to "
                         f"{lesson.GUIDE_MAX_TOKENS} tokens each…")
    if rec is None:
        st.stop()
    show = guide.nav(lesson.KEY, lesson.guide_steps(rec)).show
    if presenter.on(lesson.KEY):
        view.slide(rec, show)
        st.stop()
    view.render(rec, int(show["step"]), show["select"])
    export.download_animation([rec], lesson.KEY, "Live engine: three chat prompts on SmolLM2", "live-engine")
else:
    lesson.explore(view, make)
