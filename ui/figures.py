"""Plotly figures for the pages: the KV pool at a level of detail that fits the screen, and curves
over the steps.

Pure functions from snapshot arrays to figures, so the pages stay thin and the figures are testable.
The pool is drawn by :mod:`ui.pool_cells`: one cell per slot up to 16,384 slots, above that one
cell per group of whole blocks (:func:`snapshot_heatmap`); the Streamlit side (the zoom control,
the chart and its per-state counts) is :mod:`ui.pool_view`. :func:`pool_heatmap` and
:func:`slot_hover_text` are the older one-string-per-slot figure, for small fixed pools only.
"""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from pagedkv_core.record.slot_state import SlotState
from ui.pool_cells import (  # the colours and words every pool figure shares
    CACHED_COLOR, EMPTY_COLOR, FRAGMENT_COLOR, FREE_COLOR, LEGEND, NUM_CODES, REQUEST_COLORS, STATE_NAMES,
    STATE_WORDS, PoolCells, pool_cells,
)
from ui.pool_cells import pool_heatmap as cells_heatmap

_STATIC = {SlotState.FREE: 0, SlotState.EMPTY: 1, SlotState.CACHED: 2, SlotState.FRAGMENT: 3}
_STATIC_COLORS = [FREE_COLOR, EMPTY_COLOR, CACHED_COLOR, FRAGMENT_COLOR]

# One colour per allocator in every chart over the steps.
ALLOCATOR_COLORS = {"contiguous": "#c2410c", "paged": "#1d4ed8", "swap": "#0f766e", "recompute": "#a21caf"}


def series_color(name: str) -> str | None:
    for key, color in ALLOCATOR_COLORS.items():
        if name.startswith(key):
            return color
    return None


def grid_width(num_slots: int, block_size: int) -> int:
    """Columns of the heatmap: a whole number of blocks per row, about twice as wide as tall."""
    width = max(block_size, int(math.sqrt(2 * num_slots)))
    width = max(block_size, (width // block_size) * block_size)
    return min(width, num_slots)


def color_codes(slot_state: np.ndarray, slot_owner: np.ndarray) -> np.ndarray:
    """int8 code per slot: 0..3 the fixed states, 4.. the owner's palette colour."""
    z = np.zeros(slot_state.shape, dtype=np.int8)
    for state, code in _STATIC.items():
        z[slot_state == state] = code
    holds = (slot_state == SlotState.FILLED) | (slot_state == SlotState.SHARED)
    z[holds] = len(_STATIC_COLORS) + (np.maximum(slot_owner[holds], 0) % len(REQUEST_COLORS))
    return z


def _discrete_colorscale() -> list:
    colors = _STATIC_COLORS + list(REQUEST_COLORS)
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def pool_heatmap(slot_state, slot_owner, hover_text, block_size: int, title: str, *, width: int | None = None,
                 height: int = 420, shared_mask=None) -> go.Figure:
    """The KV pool as a grid of slots, row-major, ``width`` slots per row.

    ``hover_text``: one string per slot (request, block, offset, token); ``shared_mask``: slots of
    shared blocks, drawn with a dot."""
    n = len(slot_state)
    width = width or grid_width(n, block_size)
    rows = math.ceil(n / width)
    pad = rows * width - n

    def grid(a, fill):
        return np.concatenate([np.asarray(a), np.full(pad, fill, dtype=np.asarray(a).dtype)]).reshape(rows, width)

    z = grid(color_codes(np.asarray(slot_state), np.asarray(slot_owner)), 0)
    text = grid(np.asarray(hover_text, dtype=object), "")
    fig = go.Figure(go.Heatmap(
        z=z, zmin=-0.5, zmax=NUM_CODES - 0.5, colorscale=_discrete_colorscale(), showscale=False,
        text=text, hovertemplate="%{text}<extra></extra>", xgap=1, ygap=1,
    ))
    if shared_mask is not None and np.any(shared_mask):
        idx = np.flatnonzero(np.asarray(shared_mask))
        fig.add_trace(go.Scattergl(x=idx % width, y=idx // width, mode="markers", hoverinfo="skip",
                                   marker=dict(symbol="circle", size=4, color="white"), showlegend=False))
    # Block boundaries: a faint vertical line every block (when blocks are wide enough to see).
    if 1 < block_size < width and width // block_size <= 32:
        for x in range(block_size, width, block_size):
            fig.add_vline(x=x - 0.5, line_width=1.5, line_color="white")
    fig.update_layout(
        title=dict(text=title, x=0.0, font=dict(size=15)), height=height, margin=dict(l=40, r=10, t=40, b=30),
        plot_bgcolor="white", hoverlabel=dict(font_size=12),
    )
    fig.update_xaxes(title_text=f"slot within row ({width} per row)", showgrid=False, zeroline=False,
                     range=[-0.5, width - 0.5])
    fig.update_yaxes(title_text="row", autorange="reversed", showgrid=False, zeroline=False)
    return fig


def integer_ticks(max_value: float, most: int = 6) -> dict:
    """Axis settings for a count: whole-number ticks only (no 0.5 or 15.5), at most ``most`` of
    them, at a step of 1, 2 or 5 times a power of ten. For ``update_yaxes(**...)`` or an axis dict."""
    top = max(1.0, float(max_value))
    decade = 1
    while True:
        for m in (1, 2, 5):
            if top / (m * decade) <= most:
                return {"tick0": 0, "dtick": m * decade, "tickformat": ",d", "rangemode": "tozero"}
        decade *= 10


LEGEND_ROW_PX = 22  # one row of a horizontal legend
AXIS_TITLE_PX = 46  # tick labels and the x-axis title under a plot


def legend_below(fig: go.Figure, rows: int = 1) -> go.Figure:
    """A horizontal legend under the x-axis title, never over it: the bottom margin grows to hold
    it (``rows``: rows the legend wraps to at the chart's width). Needs the figure's height."""
    height = fig.layout.height or 450
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 40
    bottom = AXIS_TITLE_PX + rows * LEGEND_ROW_PX + 6
    plot = max(40, height - top - bottom)
    fig.update_layout(margin=dict(b=bottom), legend=dict(orientation="h", x=0.0, xanchor="left", yanchor="top",
                                                         y=-AXIS_TITLE_PX / plot))
    return fig


def step_curves(steps, series: dict[str, list], title: str, y_title: str, *, percent: bool = True,
                current_step: int | None = None, height: int = 300) -> go.Figure:
    """Several named curves over the engine steps, on one chart."""
    fig = go.Figure()
    for name, ys in series.items():
        fig.add_trace(go.Scatter(x=list(steps), y=list(ys), mode="lines", name=name,
                                 line=dict(color=series_color(name), width=2)))
    if current_step is not None:
        fig.add_vline(x=current_step, line_dash="dot", line_color="#555")
    fig.update_layout(title=dict(text=title, x=0.0, font=dict(size=15)), height=height,
                      margin=dict(l=50, r=10, t=40, b=40))
    legend_below(fig)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text=y_title, tickformat=".0%" if percent else None, rangemode="tozero")
    return fig


def slot_hover_text(snap, request_ids: list[str], token_text=None) -> list[str]:
    """One hover string per slot: state, request, physical block and offset (paged) or the
    reservation offset (contiguous), and the token it holds (its text when ``token_text`` maps
    ids to text, as for the real model)."""
    state, owner, token = snap.slot_state, snap.slot_owner, snap.slot_token
    n = len(state)
    words = {int(k): v for k, v in STATE_WORDS.items()}
    if snap.kind == "paged":
        bs = snap.block_size
        ref = snap.block_ref

        def where(s):
            b = s // bs
            r = int(ref[b]) if b < len(ref) else 0
            return f"block {b}, slot {s % bs + 1} of {bs}" + (f" · ref count {r}" if r > 1 else "")
    else:
        res_start = [-1] * n
        res_len = [0] * n
        for start, length in zip(snap.seq_reserved_start.tolist(), snap.seq_num_blocks.tolist()):
            if start >= 0:
                for s in range(start, min(n, start + length)):
                    res_start[s], res_len[s] = start, length

        def where(s):
            if res_start[s] < 0:
                return f"slot {s}"
            return f"slot {s} · offset {s - res_start[s]} of a {res_len[s]}-slot reservation"

    out = []
    for s in range(n):
        st_code = int(state[s])
        o = int(owner[s])
        who = f"request {request_ids[o] if 0 <= o < len(request_ids) else o}" if o >= 0 else ""
        t = int(token[s])
        tok = ""
        if t >= 0:
            tok = f"token {t}" if token_text is None else f"token {token_text(t)!r}"
        parts = [p for p in (who, where(s), words.get(st_code, "?"), tok) if p]
        out.append("<br>".join(parts))
    return out


# ---------------------------------------------------------------------------- level of detail
def snapshot_cells(snap, window=None, grid_block: int | None = None) -> PoolCells:
    """The snapshot's pool (or the ``window`` = (lo, hi) of it) cut into heatmap cells.
    ``grid_block``: the unit of the grid (cells per row a whole number of it, cells of whole
    units) instead of the snapshot's block size; pools drawn side by side pass the same one, so a
    contiguous pool (block size 1) and a paged pool get the same grid and cell size."""
    return pool_cells(snap.slot_state, snap.slot_owner, max(1, grid_block or snap.block_size), window=window)


def snapshot_heatmap(snap, request_ids, title: str, *, token_text=None, window=None,
                     height: int = 420, grid_block: int | None = None) -> tuple[go.Figure, PoolCells]:
    """The pool of ``snap`` at its level of detail (see :mod:`ui.pool_cells`), and the cells drawn."""
    cells = snapshot_cells(snap, window, grid_block)
    return cells_heatmap(cells, title, request_ids, token_text=token_text, snapshot=snap, height=height), cells


def free_pool_heatmap(num_slots: int, block_size: int, title: str, *, window=None,
                      height: int = 420) -> tuple[go.Figure, PoolCells]:
    """A pool in which every slot is free (before step 0)."""
    cells = pool_cells(np.zeros(num_slots, np.int8), np.full(num_slots, -1, np.int32), max(1, block_size),
                       window=window)
    return cells_heatmap(cells, title, [], height=height), cells


def state_counts(cells: PoolCells) -> str:
    """"All 2,048 slots: free 1,200 · filled 800 · empty 48": the slots of each state that occurs
    among the cells drawn (exact: they equal ``np.bincount`` of the slot states)."""
    totals = cells.state_totals.tolist()
    where = (f"All {cells.num_slots:,} slots" if (cells.lo, cells.hi) == (0, cells.num_slots)
             else f"Slots {cells.lo:,}–{cells.hi - 1:,} of {cells.num_slots:,}")
    return f"{where}: " + " · ".join(f"{STATE_NAMES[s]} {n:,}" for s, n in enumerate(totals) if n)
