"""The page layout every page shares, sized so that a lesson's figures start above the fold at
1280 x 720 (a projector, a laptop): less empty space above the title and beside the content,
titles a size smaller, and no grey fade over the figures while a page reruns.

Streamlit's defaults leave 6rem above the title and 5rem on each side of a wide page, and draw
the elements of the previous run half-transparent (a grey veil) until the new run replaces them;
on a page that redraws its figures on every step that veil is what a class sees for seconds. A
chart's code is loaded on demand, and until it is, Streamlit draws a grey skeleton in its place
(2-3 s on a slow machine): the skeletons keep their room but are not drawn. The style sheet goes
out as markdown (drawn at once; ``st.html`` is itself loaded on demand, so its style came seconds
late) whose element container the sheet itself hides, so it takes no room in the layout. The
lines between a pool's cells (:func:`ui.pool_cells.cell_grid`, found by their colour) are drawn on
whole pixels, one pixel wide, as plotly's own gaps between cells were.
Presenter mode (:mod:`ui.presenter`) adds its own, larger type on top.
"""
from __future__ import annotations

import streamlit as st

from ui.pool_cells import GRID_STROKE

CSS = """
<style>
[data-testid="stMainBlockContainer"] { padding-top: 2.6rem; padding-left: 2.2rem; padding-right: 2.2rem; }
header[data-testid="stHeader"] { background: transparent; }
[data-testid="stMain"] h1 { font-size: 1.9rem; padding-top: 0.4rem; padding-bottom: 0.4rem; }
[data-testid="stMain"] h2 { font-size: 1.6rem; }
[data-stale="true"] { opacity: 1 !important; transition: none !important; }
[data-testid="stSkeleton"], [data-testid="stSkeletonElement"] { visibility: hidden !important; }
[data-testid="stElementContainer"]:has(> [data-testid="stMarkdown"] style) { display: none; }
[data-testid="stElementContainer"][class*="st-key-_player_"] { display: none; }
.js-plotly-plot .shapelayer path[style*="GRID_STROKE"] { shape-rendering: crispEdges; }
</style>
""".replace("GRID_STROKE", GRID_STROKE)


def compact() -> None:
    st.markdown(CSS, unsafe_allow_html=True)
