"""Prefix cache on real traffic: Mooncake's production conversation trace on the paged engine. Why a
hit rate is low: the cache is too small, or the reuse is shorter than one block."""
import streamlit as st

from pagedkv_core.config import ConfigError
from ui import export, guide, presenter
from ui.lessons import prefix_traffic as lesson

guided = guide.mode(lesson.KEY, title="Prefix cache on real traffic",
                    help=f"A fixed walkthrough of the trace's {lesson.GUIDE_WINDOW.label}, lengths ÷ {lesson.SCALE}, "
                         f"blocks of {lesson.BLOCK_SIZE}, a {lesson.POOL_BLOCKS * lesson.BLOCK_SIZE:,}-slot pool, LRU.")
if not presenter.on(lesson.KEY):
    st.markdown(
        "How much of real traffic can a prefix cache serve, how big must the cache be, and why is a hit rate low? "
        "Mooncake's FAST'25 release publishes an hour of Kimi's production conversation requests with one hash id per "
        "512-token prompt block, so equal ids mean a reusable prefix. Here those requests run on the paged engine, and "
        "a replay of their hash ids measures every cache size."
    )
window, pool, eviction = (lesson.GUIDE_WINDOW, lesson.POOL_BLOCKS, "lru") if guided else lesson.explore_settings()
try:
    with st.spinner(f"Replaying {window.count:,} requests of the trace…"):
        view = lesson.view(window, pool, eviction)
except ConfigError as exc:
    st.error(str(exc))
    st.stop()
if not presenter.on(lesson.KEY):
    st.caption(f"The window: the trace's {window.label} ({len(view.rows):,} requests, {view.minutes:.0f} minutes of the "
               f"hour), every length ÷ {lesson.SCALE} so that one engine block of {lesson.BLOCK_SIZE} tokens is one "
               f"512-token hash block; one engine step = {lesson.SECONDS_PER_STEP * 1000:.0f} ms of trace time. "
               "Capacities are in the trace's tokens (blocks × 512). The whole hour is in the README's "
               "prefix-capacity benchmark.")

if guided:
    show = guide.nav(lesson.KEY, lesson.guide_steps(view)).show
    if presenter.on(lesson.KEY):
        lesson.slide(view, show)
        st.stop()
    lesson.guided(view, show)
else:
    lesson.explore(view)

st.markdown(
    """
**What to take away**
- A hit rate is low for one of two reasons: the cache is **too small** for how late the reuse comes back, or the reuse
  is **shorter than one block** (a block is cached only when full, found only when all of it matches).
- The capacity curve tells them apart: a curve that keeps climbing wants a bigger cache; a low ceiling with no limit
  means there is little reuse, or it is cut into blocks too big to share.
- Belady's optimum knows the future: the gap between it and LRU is all a cleverer eviction could win.
- Running sequences hold part of the pool, so a serving engine's cache is always smaller than its pool.
"""
)
export.download_animation([view.run], lesson.KEY, f"Prefix cache on real traffic: the trace's {window.label} on "
                          f"{view.pool_blocks:,} blocks of {lesson.BLOCK_SIZE}", "prefix-traffic")
