"""The KV pool on a page: the zoom control, the level-of-detail heatmap and its per-state counts.

Every page that draws a pool goes through here, so a pool of any size (up to 1,048,576 slots)
costs the browser the same: at most 16,384 cells one per slot, or 4,096 cells of whole blocks
(:mod:`ui.pool_cells`). Above 16,384 slots a select box offers block-aligned windows of the pool
to draw slot by slot; the choice is kept per page (its key), so it survives scrubbing and applies
to every pool the page shows side by side.

    window = pool_view.zoom_control(KEY, snap.num_slots, snap.block_size)
    pool_view.pool_chart(snap, run.request_ids, "title", key=f"{KEY}_heat_paged", window=window)
"""
from __future__ import annotations

import streamlit as st

from ui import export
from ui.live_chart import show_chart
from ui.pool_cells import free_pool_heatmap, snapshot_heatmap, state_counts, window_label, zoom_windows


def zoom_control(key: str, num_slots: int, block_size: int = 1, *, where=None):
    """A select box of windows to draw slot by slot (only when the pool is drawn in groups of
    blocks); returns the chosen (lo, hi) window, or None for the whole pool."""
    windows = zoom_windows(num_slots, max(1, block_size))
    state_key = f"{key}_zoom"
    if len(windows) <= 1:
        return None
    options = [None, *windows]
    if st.session_state.get(state_key) not in options:  # the pool changed size since the choice
        st.session_state.pop(state_key, None)
    (where or st).selectbox(
        f"Zoom: the pool has {num_slots:,} slots, drawn in groups of blocks", options, key=state_key,
        format_func=lambda w: "the whole pool, in groups of blocks" if w is None else f"{window_label(w, block_size)}, slot by slot",
        help="Above 16,384 slots a cell stands for a group of whole blocks (hover it for its counts and owners). "
             "Pick a window to draw its slots one by one.")
    return st.session_state.get(state_key)


def pool_chart(snap, request_ids, title: str, *, key: str, window=None, token_text=None, height: int = 420,
               png_name: str | None = None, grid_block: int | None = None):
    """The pool of ``snap`` (or the ``window`` of it) as a heatmap, with the slots of each state
    in a caption under it. Returns the cells drawn (:class:`ui.pool_cells.PoolCells`).
    ``grid_block``: one grid for pools drawn side by side (:func:`ui.pool_cells.snapshot_cells`)."""
    fig, cells = snapshot_heatmap(snap, request_ids, title, token_text=token_text, window=window, height=height,
                                  grid_block=grid_block)
    show_chart(fig, key, config=export.png_config(png_name or key))
    st.caption(state_counts(cells))
    return cells


def free_pool_chart(num_slots: int, block_size: int, title: str, *, key: str, window=None, height: int = 420,
                    png_name: str | None = None):
    """A pool in which every slot is free (before step 0), drawn like :func:`pool_chart`."""
    fig, cells = free_pool_heatmap(num_slots, block_size, title, window=window, height=height)
    show_chart(fig, key, config=export.png_config(png_name or key))
    return cells
