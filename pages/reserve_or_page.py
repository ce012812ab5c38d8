"""Reserve or page: the same requests on the same memory, contiguous reservations beside paged blocks."""
import streamlit as st

from ui import guide, presenter
from ui.lessons import reserve_or_page as lesson
from ui.runs.sidebar import current_runs

guided = guide.mode(lesson.KEY, help=lesson.GUIDE_HELP, title="Reserve or page")
if not presenter.on(lesson.KEY) and not guided:  # one line above the player: the pools start above the fold
    st.caption("The same requests on the same KV memory, twice. **Left**: each request reserves room for its longest "
               "possible answer in one contiguous piece. **Right**: paging hands out small blocks as tokens arrive. "
               "Press **Play** and watch who gets to run.")

if guided:
    runs = lesson.guided_runs()
    show = guide.nav(lesson.KEY, lesson.guide_steps(runs)).show
    if presenter.on(lesson.KEY):
        lesson.slide(runs, show)
        st.stop()
    lesson.draw_step(runs, show)
else:
    runs = current_runs()
    if runs is None:
        st.stop()
    lesson.explore(runs)

st.markdown(
    """
**What you are looking at**
- **Reservation waste** (orange on the left): the contiguous allocator reserves prompt + `max_tokens`
  slots at admission. Most answers stop long before `max_tokens`, so most of each reservation never
  holds a token, yet nobody else may use it.
- **External fragmentation** (dusty red on the left): free runs shorter than the reservation the head of
  the waiting queue needs, whatever their size. The head is admitted only into one free run at least that
  long (grey), at the start of the next step; while every free run is shorter, the queue waits although
  memory is free. The line under each pool says what the head needs and the largest free run.
- **Internal fragmentation** (orange on the right): paging allocates one block at a time, so only the
  unfilled end of each sequence's last block is empty: less than one block per sequence.
- The result: the paged side runs many more requests at once (*running*) and finishes the same work in
  fewer steps.
"""
)
lesson.download_buttons(runs)
