"""Level-of-detail cells for the KV-pool heatmap, and the figure that draws them.

Why this module exists: a production pool holds up to 1,048,576 token slots. One heatmap cell
per slot, each with its own hover string, sends tens of megabytes to the browser on every step
and makes scrubbing crawl. So the pool is drawn at a level of detail that fits the screen:

* A window of at most ``max_cells`` slots (16,384 by default) is drawn one cell per slot, with
  the same colours as always (see :data:`LEGEND`).
* A larger pool is drawn one cell per block, or per group of ``g`` whole blocks (``g`` a power of
  two), at most ``max_groups`` cells (4,096 by default). A cell is coloured by the state most of its
  slots are in (the main owner's colour when slots holding tokens dominate), and its hover gives
  its slot and block range, the count of each slot state and its main owners.
* :func:`zoom_windows` lists block-aligned windows a page can offer, so that any part of a big
  pool can still be drawn slot by slot.

:func:`pool_cells` is pure numpy and vectorised (a few milliseconds at 1M slots). Its per-state
counts are exact: summed over the cells they equal ``np.bincount`` of the window's slot states.

The browser payload stays bounded because nothing per cell is sent as a string (except, for at
most :data:`TEXT_CELLS` cells, the request id and the token's text): every per-cell value travels
as a small-integer numpy array, which plotly encodes as base64 binary, and one ``hovertemplate``
per trace turns the numbers into words. Cells are split into one heatmap trace per hover layout
(per slot state; per number of owners), because a template cannot branch: each trace shows only
the fields that mean something for its cells and no "-1" placeholders. Those traces give x and y
per cell (plotly's column form of a heatmap); plotly.js lays a column-form heatmap out on the
distinct x and y values it is given, so every trace also carries one off-screen point for each
column and row it lacks, which keeps all traces on the same grid. ``text``, ``hovertext`` and
``customdata`` are three separate binary arrays, so each gets its own small dtype (a 32-bit slot
number does not widen the 8-bit counts).

Why aggregated cells stop at 4,096 and not 16,384: an aggregated hover needs about a dozen numbers
per cell (slot and block range, five state counts, three owners and their counts), about 30 bytes;
16,384 such cells would be some 650 KB of JSON, 4,096 are about 200 KB. A per-slot hover needs
far fewer numbers, so a per-slot window may hold 16,384 cells. When a figure's hover data would
still pass :data:`HOVER_BYTES`, the detail fields (offsets within blocks and reservations, block
ranges) are left out rather than the budget broken.

How a page uses it (``snap`` a :class:`~pagedkv_core.record.snapshot.StepSnapshot`)::

    windows = zoom_windows(snap.num_slots, snap.block_size)      # [(0, 16384), (16384, 32768), ...]
    window = None
    if len(windows) > 1:  # the pool is aggregated: offer windows drawn slot by slot
        window = st.selectbox("Draw slots one by one", [None, *windows], key="zoom",
                              format_func=lambda w: "whole pool" if w is None else window_label(w, snap.block_size))
    cells = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size, window=window)
    st.plotly_chart(pool_heatmap(cells, title, run.request_ids, token_text=text_of, snapshot=snap))

:func:`snapshot_heatmap` does the last two lines in one call, and :mod:`ui.pool_view` wraps it for a
page (the zoom select box, the chart and its per-state counts). Every pool heatmap of the app is
drawn here; :mod:`ui.export` reuses the cells and colours for its animations.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from pagedkv_core.record.slot_state import SLOT_STATE_NAMES, SlotState

MAX_CELLS = 16_384  # a window up to this many slots is drawn one cell per slot
MAX_GROUPS = 4_096  # a larger window is drawn in at most this many cells of whole blocks
TEXT_CELLS = 4_096  # up to this many cells, the hover names the request and the token's text
HOVER_BYTES = 180_000  # binary hover data per figure (about 240 KB once base64-encoded)
TOP_OWNERS = 3  # owners listed per aggregated cell
NUM_STATES = len(SlotState)
STATE_NAMES = tuple(SLOT_STATE_NAMES[s] for s in range(NUM_STATES))

# Colours: one fixed colour per state that is not "a request's own token", one palette colour per
# request for the slots holding its tokens. Code k of a cell is drawn in COLORS[k].
FREE_COLOR = "#e6e6e6"  # grey: free
EMPTY_COLOR = "#ff9f1c"  # orange: allocated but holding nothing
CACHED_COLOR = "#b8d8e8"  # pale blue: cached-free block, reusable until evicted
FRAGMENT_COLOR = "#c9a9a6"  # dusty red: a free hole too small for the next reservation
REQUEST_COLORS = (  # a qualitative palette without grey or orange
    "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
    "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#31a354", "#756bb1", "#e7298a",
)
STATE_CODES = {SlotState.FREE: 0, SlotState.EMPTY: 1, SlotState.CACHED: 2, SlotState.FRAGMENT: 3}
FIRST_REQUEST_CODE = len(STATE_CODES)
COLORS = (FREE_COLOR, EMPTY_COLOR, CACHED_COLOR, FRAGMENT_COLOR, *REQUEST_COLORS)
NUM_CODES = len(COLORS)
SHARED_DOT_COLOR = "white"

LEGEND = (
    "grey = free · orange = allocated but holding nothing · colour = the request whose tokens fill it · "
    "● = shared block (ref count > 1) · pale blue = cached block nobody uses (reusable) · "
    "dusty red = free hole too small for the next reservation"
)
# The same key in fewer words, for a slide (ui/presenter.py), where every line of caption is a line
# of figure less on a 720 px screen.
SLIDE_LEGEND = (
    "grey = free · orange = allocated, empty · colour = the request whose tokens fill it · ● = shared · "
    "pale blue = cached, reusable · dusty red = free hole too small for the next reservation"
)
AGGREGATE_LEGEND = (
    "each cell is a group of whole blocks, coloured by the state most of its slots are in "
    "(the main owner's colour when slots holding tokens dominate); ● = the cell holds shared blocks; "
    "hover a cell for its counts and owners, or pick a window to draw slot by slot"
)

STATE_WORDS = {
    SlotState.FREE: "free",
    SlotState.FILLED: "holds a token",
    SlotState.EMPTY: "allocated, holding nothing yet",
    SlotState.CACHED: "cached: no owner, reusable until evicted",
    SlotState.SHARED: "shared block",
    SlotState.FRAGMENT: "free, but in a hole too small for the next reservation",
}


# ---------------------------------------------------------------------------------------- cells
@dataclass(frozen=True, eq=False)
class PoolCells:
    """The slots ``lo..hi-1`` of a pool of ``num_slots``, cut into cells of ``slots_per_cell``.

    Cell ``i`` covers the slots ``starts[i]..stops[i]-1`` (the last cell may be shorter).
    ``counts[i, s]`` is how many of them are in state ``s`` (a :class:`SlotState` code);
    ``owners[i]`` the request indices owning most of them, best first (-1 = none), and
    ``owner_counts[i]`` how many slots each owns. In per-slot mode (``slots_per_cell == 1``)
    ``counts`` is one-hot and ``owners[:, 0]`` is the slot's owner.
    """

    num_slots: int
    lo: int
    hi: int
    block_size: int
    slots_per_cell: int
    counts: np.ndarray  # (cells, NUM_STATES) int32
    owners: np.ndarray  # (cells, TOP_OWNERS) int32
    owner_counts: np.ndarray  # (cells, TOP_OWNERS) int32

    @property
    def num_cells(self) -> int:
        return len(self.counts)

    @property
    def per_slot(self) -> bool:
        return self.slots_per_cell == 1

    @property
    def starts(self) -> np.ndarray:
        return self.lo + np.arange(self.num_cells, dtype=np.int64) * self.slots_per_cell

    @property
    def stops(self) -> np.ndarray:
        return np.minimum(self.starts + self.slots_per_cell, self.hi)

    @property
    def blocks_per_cell(self) -> int:
        """Whole blocks per cell (aggregate mode); 0 when a cell is less than a block."""
        return self.slots_per_cell // self.block_size

    @property
    def state_totals(self) -> np.ndarray:
        """Slots per state over the whole window: equals ``np.bincount`` of its slot states."""
        return self.counts.sum(axis=0)


def _window(num_slots: int, window) -> tuple[int, int]:
    if window is None:
        return 0, num_slots
    try:
        lo, hi = (int(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be a (lo, hi) slot range, got {window!r}") from None
    if not 0 <= lo < hi <= num_slots:
        raise ValueError(f"window ({lo}, {hi}) is not a non-empty range within the pool's {num_slots:,} slots")
    return lo, hi


def cell_size(num_slots: int, block_size: int, max_cells: int = MAX_CELLS, max_groups: int = MAX_GROUPS) -> int:
    """Slots per cell for a window of ``num_slots``: 1 up to ``max_cells`` slots, else ``g``
    whole blocks, ``g`` the smallest power of two that keeps the cells at most ``max_groups``."""
    if num_slots <= max_cells:
        return 1
    blocks = -(-num_slots // block_size)
    g = 1
    while -(-blocks // g) > max_groups:
        g *= 2
    return g * block_size


def pool_cells(slot_state, slot_owner, block_size: int, *, max_cells: int = MAX_CELLS,
               max_groups: int = MAX_GROUPS, window=None) -> PoolCells:
    """Cut the pool (or the ``window`` = (lo, hi) slot range) into heatmap cells; see :class:`PoolCells`.

    Cells start at ``lo``, so a block-aligned window (as :func:`zoom_windows` gives) makes every
    aggregated cell a run of whole blocks."""
    state = np.asarray(slot_state)
    owner = np.asarray(slot_owner)
    if state.ndim != 1 or owner.shape != state.shape:
        raise ValueError(f"slot_state and slot_owner must be 1-D and equally long, got {state.shape} and {owner.shape}")
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if max_cells < 1 or max_groups < 1:
        raise ValueError(f"max_cells and max_groups must be positive, got {max_cells} and {max_groups}")
    lo, hi = _window(len(state), window)
    state, owner = state[lo:hi], owner[lo:hi]
    if state.min() < 0 or state.max() >= NUM_STATES:
        raise ValueError(f"slot_state holds codes outside 0..{NUM_STATES - 1}")
    span = hi - lo
    spc = cell_size(span, int(block_size), max_cells, max_groups)
    cells = -(-span // spc)
    if spc == 1:
        counts = np.zeros((cells, NUM_STATES), dtype=np.int32)
        counts[np.arange(cells), state] = 1
        owners = np.full((cells, TOP_OWNERS), -1, dtype=np.int32)
        owner_counts = np.zeros((cells, TOP_OWNERS), dtype=np.int32)
        owned = owner >= 0
        owners[owned, 0] = owner[owned]
        owner_counts[:, 0] = owned
    else:
        pad = cells * spc - span
        if pad:  # padding slots get an extra state code (dropped) and no owner
            state = np.concatenate([state, np.full(pad, NUM_STATES, dtype=state.dtype)])
            owner = np.concatenate([owner, np.full(pad, -1, dtype=owner.dtype)])
        counts, owners, owner_counts = _aggregate(state.reshape(cells, spc), owner.reshape(cells, spc))
    return PoolCells(len(slot_state), lo, hi, int(block_size), spc, counts, owners, owner_counts)


def _aggregate(state: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of the (cells, slots_per_cell) grids: the count of each state code (code NUM_STATES,
    the padding, is dropped), and the TOP_OWNERS most frequent owners >= 0 with their counts
    (the lower request index first among equal counts).

    It works on runs, maximal stretches of one state and one owner within a row: a paged block is
    one owner and at most a few states, a contiguous reservation one owner and two states, so a
    busy 1M-slot pool has tens of thousands of runs, and only those are counted and sorted. Input
    whose slots change owner all the time (no allocator lays a pool out so) has about as many runs
    as slots; then sorting each row (numpy's vectorised sort) and counting equal values is cheaper."""
    cells, spc = state.shape
    flat_state, flat_owner = state.ravel(), owner.ravel()
    start = np.empty(cells * spc, dtype=bool)
    np.not_equal(flat_state[1:], flat_state[:-1], out=start[1:])
    np.logical_or(start[1:], flat_owner[1:] != flat_owner[:-1], out=start[1:])
    start[::spc] = True  # every row starts a run
    idx = np.flatnonzero(start)
    counts = np.zeros((cells, NUM_STATES + 1), dtype=np.int32)
    if len(idx) * 8 > cells * spc:
        row, value, total = _sorted_runs(state.astype(np.int32))  # numpy sorts int32 far faster than int8
        counts[row, value] = total
        row, value, total = _sorted_runs(owner.astype(np.int32, copy=False))
    else:
        length = np.diff(idx, append=cells * spc)
        row = idx // spc
        width = NUM_STATES + 1
        counts[:] = np.bincount(row * width + flat_state[idx], weights=length,
                                minlength=cells * width).reshape(cells, width)
        value = flat_owner[idx].astype(np.int64)
        keep = value >= 0
        row, value, length = row[keep], value[keep], length[keep]
        key = row * (int(value.max(initial=0)) + 1) + value
        order = np.argsort(key)  # equal keys are the same (row, owner): their order does not matter
        key, row, value, length = key[order], row[order], value[order], length[order]
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else order
        row, value, total = row[first], value[first], np.add.reduceat(length, first) if len(first) else length
    keep = value >= 0
    return (np.ascontiguousarray(counts[:, :NUM_STATES]), *_top_per_row(cells, spc, row[keep], value[keep].astype(np.int64), total[keep]))


def _sorted_runs(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, value, count) of every distinct value of every row of ``grid``, in (row, value) order."""
    cells, spc = grid.shape
    flat = np.sort(grid, axis=1).ravel()
    start = np.empty(flat.size, dtype=bool)
    np.not_equal(flat[1:], flat[:-1], out=start[1:])
    start[::spc] = True  # every row starts a run
    first = np.flatnonzero(start)
    return first // spc, flat[first], np.diff(first, append=flat.size)


def _top_per_row(cells: int, spc: int, row: np.ndarray, value: np.ndarray, total: np.ndarray):
    """The TOP_OWNERS largest totals per row, the lower value first among equal totals: one sort
    of a packed key (row, most first, value)."""
    owners = np.full((cells, TOP_OWNERS), -1, dtype=np.int32)
    counts = np.zeros((cells, TOP_OWNERS), dtype=np.int32)
    if not len(row):
        return owners, counts
    base = int(value.max()) + 1
    if cells * (spc + 1) * base < 1 << 62:
        key = np.sort((row * (spc + 1) + (spc - total)) * base + value)
        row, rest = np.divmod(key, (spc + 1) * base)
        less, value = np.divmod(rest, base)
        total = spc - less
    else:  # a key would not fit in 64 bits
        order = np.lexsort((value, -total, row))
        row, value, total = row[order], value[order], total[order]
    seg = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    rank = np.arange(len(row)) - np.repeat(seg, np.diff(seg, append=len(row)))
    top = rank < TOP_OWNERS
    owners[row[top], rank[top]] = value[top]
    counts[row[top], rank[top]] = total[top]
    return owners, counts


def cell_codes(cells: PoolCells) -> np.ndarray:
    """int8 colour code per cell (an index into :data:`COLORS`): the state most of its slots are in,
    counting FILLED and SHARED together as "holds tokens", drawn in the main owner's colour.
    In per-slot mode this is the slot's own colour. Ties go to holding tokens, then to the order
    empty, cached, fragment, free."""
    c = cells.counts
    candidates = np.stack([c[:, SlotState.FILLED] + c[:, SlotState.SHARED], c[:, SlotState.EMPTY],
                           c[:, SlotState.CACHED], c[:, SlotState.FRAGMENT], c[:, SlotState.FREE]], axis=1)
    pick = candidates.argmax(axis=1)
    fixed = np.array([0, STATE_CODES[SlotState.EMPTY], STATE_CODES[SlotState.CACHED],
                      STATE_CODES[SlotState.FRAGMENT], STATE_CODES[SlotState.FREE]], dtype=np.int8)
    codes = fixed[pick]
    holds = pick == 0
    codes[holds] = FIRST_REQUEST_CODE + np.maximum(cells.owners[holds, 0], 0) % len(REQUEST_COLORS)
    return codes


# ---------------------------------------------------------------------------------------- zoom
def zoom_windows(num_slots: int, block_size: int, max_cells: int = MAX_CELLS) -> list[tuple[int, int]]:
    """Block-aligned (lo, hi) windows of up to ``max_cells`` slots (whole blocks) covering the pool,
    each small enough for :func:`pool_cells` to draw slot by slot. A pool that is already drawn
    slot by slot gives the single window ``[(0, num_slots)]``.

    A page shows a select box when there is more than one window ("draw slots lo..hi one by one"),
    passes the chosen window to :func:`pool_cells` (``None`` = the whole pool) and keeps the choice
    in its state, so that it survives scrubbing."""
    if num_slots < 1 or block_size < 1 or max_cells < 1:
        raise ValueError(f"num_slots, block_size and max_cells must be positive, got {num_slots}, {block_size}, {max_cells}")
    if num_slots <= max_cells:
        return [(0, num_slots)]
    size = max(block_size, max_cells // block_size * block_size)
    return [(lo, min(lo + size, num_slots)) for lo in range(0, num_slots, size)]


def window_label(window: tuple[int, int], block_size: int = 1) -> str:
    """The select-box text of a window: its slots, and its blocks when blocks are bigger than a slot."""
    lo, hi = window
    text = f"slots {lo:,}–{hi - 1:,}"
    if block_size > 1:
        text += f" (blocks {lo // block_size:,}–{(hi - 1) // block_size:,})"
    return text


# ---------------------------------------------------------------------------------------- figure
def grid_columns(num_cells: int, unit: int = 1) -> int:
    """Cells per heatmap row: about twice as many columns as rows, a whole number of ``unit``
    (per-slot mode: a block) per row."""
    width = max(unit, math.isqrt(2 * num_cells))
    width = max(unit, width // unit * unit)
    return max(1, min(width, num_cells))


def colorscale() -> list:
    """A discrete plotly colour scale: code k (an integer) is drawn in COLORS[k]."""
    scale = []
    for i, color in enumerate(COLORS):
        scale += [[i / NUM_CODES, color], [(i + 1) / NUM_CODES, color]]
    return scale


def _small(a: np.ndarray) -> np.ndarray:
    """The array in the smallest integer dtype that holds it (plotly sends it as binary)."""
    a = np.asarray(a)
    if a.size == 0:
        return a.astype(np.uint8)
    lo, hi = int(a.min()), int(a.max())
    for dtype in ((np.uint8, np.uint16, np.uint32) if lo >= 0 else (np.int8, np.int16, np.int32)):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return a.astype(dtype, copy=False)
    return a.astype(np.float64)


@dataclass
class _Layer:
    """One hover layout: the cells it covers (indices), its per-cell channels and its template."""

    members: np.ndarray
    template: str
    text: np.ndarray | None = None  # numeric, shown as %{text}
    hovertext: np.ndarray | list | None = None  # numeric or strings, shown as %{hovertext}
    custom: list | None = None  # numeric columns, shown as %{customdata[i]}

    def nbytes(self) -> int:
        n = len(self.members)
        total = 3 * n  # x, y and the colour code, one byte each on most grids
        for a in (self.text, self.hovertext):
            if a is not None:
                total += _small(a).nbytes if isinstance(a, np.ndarray) else sum(len(s) + 3 for s in a)
        if self.custom:
            total += _small(np.stack(self.custom, axis=1)).nbytes
        return total


class _Template:
    """Builds a hovertemplate while collecting its customdata columns."""

    def __init__(self):
        self.columns: list[np.ndarray] = []

    def __call__(self, column, fmt: str = "") -> str:
        self.columns.append(np.asarray(column))
        return f"%{{customdata[{len(self.columns) - 1}]{fmt}}}"


def _token_words(token: int, token_text) -> str:
    if token_text is None:
        return f"token {token}"
    text = token_text(token)
    if text is None:
        return f"token {token}"
    shown = repr(str(text)[:24]).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"token {shown}"


PAGED_STATES = (SlotState.FREE, SlotState.FILLED, SlotState.EMPTY, SlotState.CACHED, SlotState.SHARED)
CONTIGUOUS_STATES = (SlotState.FREE, SlotState.FILLED, SlotState.EMPTY, SlotState.FRAGMENT)


def _per_slot_layers(cells: PoolCells, request_ids, token_text, snapshot, detail: bool) -> list[_Layer]:
    lo, hi, bs = cells.lo, cells.hi, cells.block_size
    state = cells.counts.argmax(axis=1)
    owner = cells.owners[:, 0]
    slots = np.arange(lo, hi, dtype=np.int64)
    token = snapshot.slot_token[lo:hi] if snapshot is not None else None
    paged = snapshot.num_blocks > 0 if snapshot is not None else bs > 1
    words = cells.num_cells <= TEXT_CELLS  # request id and token text per cell, as strings
    ref = res_offset = res_length = None
    if paged and snapshot is not None and len(snapshot.block_ref):
        ref = snapshot.block_ref[np.minimum(slots // bs, len(snapshot.block_ref) - 1)]
    if not paged and snapshot is not None and detail:
        res_offset = np.full(hi - lo, -1, dtype=np.int64)
        res_length = np.zeros(hi - lo, dtype=np.int64)
        for start, length in zip(snapshot.seq_reserved_start.tolist(), snapshot.seq_num_blocks.tolist()):
            a, b = max(start, lo), min(start + length, hi)
            if start >= 0 and a < b:
                res_offset[a - lo:b - lo] = np.arange(a - start, b - start)
                res_length[a - lo:b - lo] = length
    # A layer for every state this kind of pool can show, present or not (an absent one holds no cell):
    # the same traces at every step, so that a playing page repaints the cells of the trace it drew
    # (ui.live_chart) instead of drawing a figure with other traces.
    kinds = PAGED_STATES if paged else CONTIGUOUS_STATES
    layers = []
    for code in sorted(set(kinds) | set(np.unique(state).tolist())):
        s = SlotState(int(code))
        m = np.flatnonzero(state == code)
        t = _Template()
        has_owner = bool((owner[m] >= 0).all()) and s in (SlotState.FILLED, SlotState.EMPTY, SlotState.SHARED)
        has_token = token is not None and bool((token[m] >= 0).all()) and s in (
            SlotState.FILLED, SlotState.SHARED, SlotState.CACHED)
        lines, hovertext = [], None
        if words and (has_owner or has_token):
            hovertext = []
            for i in m.tolist():
                parts = []
                if has_owner:
                    o = int(owner[i])
                    parts.append(f"request {request_ids[o] if 0 <= o < len(request_ids) else o}")
                if has_token:
                    parts.append(_token_words(int(token[i]), token_text))
                hovertext.append("<br>".join(parts))
            lines.append("%{hovertext}")
        elif has_owner:
            lines.append(f"request #{t(owner[m])}")
        if paged:
            where = "block %{text:,}" + (f", slot {t(slots[m] % bs + 1)} of {bs}" if detail and bs > 1 else "")
            if s == SlotState.SHARED and ref is not None:
                where += f" · ref count {t(ref[m])}"
            text = slots[m] // bs
        else:
            where = "slot %{text:,}"
            text = slots[m]
            if res_offset is not None and s in (SlotState.FILLED, SlotState.EMPTY) and (res_offset[m] >= 0).all():
                where += f" · offset {t(res_offset[m])} of a {t(res_length[m])}-slot reservation"
        lines.append(where)
        lines.append(STATE_WORDS[s])
        if has_token and not words:
            lines.append("token %{hovertext}")
            hovertext = token[m]
        layers.append(_Layer(m, "<br>".join(lines), text=text, hovertext=hovertext, custom=t.columns))
    return layers


def _aggregate_layers(cells: PoolCells, detail: bool, blocks: bool = True) -> list[_Layer]:
    bs = cells.block_size if blocks else 1  # a contiguous pool cut on a paged pool's grid has no blocks to name
    starts, stops = cells.starts, cells.stops
    present = [s for s in range(NUM_STATES) if cells.state_totals[s] > 0]
    num_owners = (cells.owner_counts > 0).sum(axis=1)
    layers = []
    for k in np.unique(num_owners):
        m = np.flatnonzero(num_owners == k)
        t = _Template()
        head = "<b>slots %{text:,}–%{hovertext:,}</b>"
        if bs > 1 and detail:
            head += f" · blocks {t(starts[m] // bs, ':,')}–{t((stops[m] - 1) // bs, ':,')}"
        counts = " · ".join(f"{STATE_NAMES[s]} {t(cells.counts[m, s])}" for s in present)
        if k == 0:
            owners = "no owner"
        else:
            owners = "main owners: " + " · ".join(
                f"request #{t(cells.owners[m, j])} ({t(cells.owner_counts[m, j])} slots)" for j in range(k))
        layers.append(_Layer(m, "<br>".join([head, counts, owners]), text=starts[m], hovertext=stops[m] - 1,
                             custom=t.columns))
    return layers


GAP_COLUMNS = 96  # up to this many cells a row, a 1-pixel line parts the cells; wider grids have none (it would eat them)
# The lines that part the cells are one white path over the heatmap (:func:`cell_grid`), not plotly's
# ``xgap``/``ygap``. With gaps, plotly.js paints every cell of every trace into a canvas the size of
# the plot and encodes each as a PNG, on every frame of a playing page; without them it paints one
# pixel a cell and lets the browser scale the image. Measured in Chromium on the 2-core AMD EPYC
# (a pool of 2,048 slots in 3-4 traces, 20 frames of the guide's run drawn 6 times, three rounds
# alternating): 20-26 ms of the browser's CPU a frame with gaps, 14-17 with the path. The path's
# colour is white one step off, so that the app's style sheet (:mod:`ui.layout`) can find it and
# draw it on whole pixels, as the gaps were.
GRID_RGB = (255, 255, 254)
GRID_COLOR = "#%02x%02x%02x" % GRID_RGB
GRID_STROKE = "rgb(%d, %d, %d)" % GRID_RGB  # how the browser writes the path's stroke in its style


def cell_grid(width: int, rows: int) -> dict:
    """One path shape along every boundary between two cells of a ``width`` x ``rows`` grid."""
    columns = "".join(f"M{c - 0.5},-0.5V{rows - 0.5}" for c in range(1, width))
    lines = "".join(f"M-0.5,{r - 0.5}H{width - 0.5}" for r in range(1, rows))
    return dict(type="path", xref="x", yref="y", path=columns + lines, line=dict(width=1, color=GRID_COLOR))


def _trace(layer: _Layer, codes: np.ndarray, width: int, rows: int) -> dict:
    """A column-form heatmap of the layer's cells, padded with one off-screen point (x = width or
    y = rows) per grid column and row it lacks and one at (width, rows), so that plotly lays every
    layer, at every step, on the same grid of width + 1 by rows + 1 (the last column and row off the
    axes): a playing page repaints a layer's cells on the grid it drew (ui.live_chart)."""
    m = layer.members
    x, y = m % width, m // width
    miss_x = np.setdiff1d(np.arange(width), x)
    miss_y = np.setdiff1d(np.arange(rows), y)
    pad = len(miss_x) + len(miss_y) + 1

    def padded(a, fill=0):
        if a is None:
            return None
        if isinstance(a, list):
            return a + [""] * pad
        return _small(np.concatenate([np.asarray(a), np.full(pad, fill, dtype=np.asarray(a).dtype)]))

    custom = None
    if layer.custom:
        cols = np.stack([np.asarray(c, dtype=np.int64) for c in layer.custom], axis=1)
        custom = _small(np.concatenate([cols, np.zeros((pad, cols.shape[1]), dtype=np.int64)]))
    return dict(
        type="heatmap",
        x=_small(np.concatenate([x, miss_x, np.full(len(miss_y) + 1, width)])),
        y=_small(np.concatenate([y, np.full(len(miss_x), rows), miss_y, [rows]])),
        z=padded(codes[m]), text=padded(layer.text), hovertext=padded(layer.hovertext), customdata=custom,
        coloraxis="coloraxis", hovertemplate=layer.template + "<extra></extra>",
        hoverongaps=False, connectgaps=False, showlegend=False,
    )


def pool_heatmap(cells: PoolCells, title: str, request_ids, *, token_text=None, snapshot=None,
                 height: int = 420) -> go.Figure:
    """The pool (or its window) as a grid of cells, row-major, in both modes of :class:`PoolCells`.

    ``request_ids``: request index -> id, named in the hover of up to :data:`TEXT_CELLS` per-slot
    cells (beyond that the hover shows the request index). ``token_text``: a callable or mapping from
    token id to text (the real model), shown likewise; beyond it the hover shows token ids.
    ``snapshot``: the :class:`~pagedkv_core.record.snapshot.StepSnapshot` the cells came from, for the
    per-slot hover's tokens, ref counts and reservations (without it those are left out)."""
    if isinstance(token_text, Mapping):
        token_text = token_text.get
    if token_text is not None and not callable(token_text):
        raise ValueError(f"token_text must be a callable or a mapping, got {type(token_text).__name__}")
    n = cells.num_cells
    width = grid_columns(n, cells.block_size if cells.per_slot else 1)
    # The cells' block size is the grid's unit; it names allocator blocks unless the snapshot is a
    # contiguous pool drawn on a paged pool's grid (``grid_block`` of :func:`snapshot_cells`).
    blocks = snapshot is None or snapshot.num_blocks > 0 or snapshot.block_size == cells.block_size
    rows = -(-n // width)
    codes = cell_codes(cells)

    def build(detail: bool) -> list[_Layer]:
        if cells.per_slot:
            return _per_slot_layers(cells, list(request_ids), token_text, snapshot, detail)
        return _aggregate_layers(cells, detail, blocks)

    layers = build(True)
    if sum(layer.nbytes() for layer in layers) > HOVER_BYTES:
        layers = build(False)  # drop the detail fields (block offsets, reservations, block ranges)
    traces = [_trace(layer, codes, width, rows) for layer in layers]

    shared = np.flatnonzero(cells.counts[:, SlotState.SHARED] > 0)
    if len(shared):
        traces.append(dict(type="scattergl", x=_small(shared % width), y=_small(shared // width), mode="markers",
                                   hoverinfo="skip", showlegend=False,
                                   marker=dict(symbol="circle", size=4, color=SHARED_DOT_COLOR)))
    bs = cells.block_size
    lines = [cell_grid(width, rows)] if width <= GAP_COLUMNS else []  # under the block boundaries
    if blocks and cells.per_slot and 1 < bs < width and width // bs <= 32:  # block boundaries, when wide enough to see
        lines += [dict(type="line", xref="x", yref="paper", x0=x - 0.5, x1=x - 0.5, y0=0, y1=1,
                      line=dict(width=1.5, color="white")) for x in range(bs, width, bs)]

    spc = cells.slots_per_cell
    if cells.per_slot:
        x_title = f"{width} slots a row"
    else:
        n_blocks = cells.blocks_per_cell
        in_blocks = f" ({n_blocks} block{'s' if n_blocks != 1 else ''})" if blocks and cells.block_size > 1 and n_blocks else ""
        x_title = f"{width} cells a row; a cell = {spc:,} slots{in_blocks}"
    ticks = np.unique(np.linspace(0, rows - 1, num=min(rows, 6)).round().astype(int)).tolist()
    # The figure is built as plotly.js reads it and not validated: validating it (each trace's arrays
    # copied and checked, the traces deep-copied into the figure) took about 55% of a live frame's
    # figure (13.4 -> 6.1 ms a pool of 2,048 slots), and a playing classroom draws one per session and
    # tick. So every key here is plotly.js's own (``font=dict(size=12)``, not the ``font_size``
    # shorthand that only validation expands), and empty lists are left out, as validation leaves them;
    # ``tests/test_pool_cells.py`` checks the figure against a validated copy of itself.
    layout = dict(
        title=dict(text=title, x=0.0, font=dict(size=15)), height=height, margin=dict(l=70, r=10, t=40, b=30),
        plot_bgcolor="white", hoverlabel=dict(font=dict(size=12)), **({"shapes": lines} if lines else {}),
        coloraxis=dict(colorscale=colorscale(), cmin=-0.5, cmax=NUM_CODES - 0.5, showscale=False),
        xaxis=dict(title=dict(text=x_title), showgrid=False, zeroline=False, range=[-0.5, width - 0.5]),
        yaxis=dict(title=dict(text="first slot of the row"), showgrid=False, zeroline=False, range=[rows - 0.5, -0.5],
                   tickmode="array", tickvals=ticks, ticktext=[f"{cells.lo + r * width * spc:,}" for r in ticks]),
    )
    return go.Figure(data=traces, layout=layout, _validate=False)


# ---------------------------------------------------------------------------------------- snapshots
def snapshot_cells(snap, window=None, grid_block: int | None = None) -> PoolCells:
    """The snapshot's pool (or the ``window`` = (lo, hi) of it) cut into heatmap cells.
    ``grid_block``: the unit of the grid (cells per row a whole number of it, cells of whole
    units) instead of the snapshot's block size; pools drawn side by side pass the same one, so a
    contiguous pool (block size 1) and a paged pool get the same grid and cell size."""
    return pool_cells(snap.slot_state, snap.slot_owner, max(1, grid_block or snap.block_size), window=window)


def snapshot_heatmap(snap, request_ids, title: str, *, token_text=None, window=None,
                     height: int = 420, grid_block: int | None = None) -> tuple[go.Figure, PoolCells]:
    """The pool of ``snap`` at its level of detail (:func:`pool_cells`), and the cells drawn."""
    cells = snapshot_cells(snap, window, grid_block)
    return pool_heatmap(cells, title, request_ids, token_text=token_text, snapshot=snap, height=height), cells


def free_pool_heatmap(num_slots: int, block_size: int, title: str, *, window=None,
                      height: int = 420) -> tuple[go.Figure, PoolCells]:
    """A pool in which every slot is free (before step 0)."""
    cells = pool_cells(np.zeros(num_slots, np.int8), np.full(num_slots, -1, np.int32), max(1, block_size),
                       window=window)
    return pool_heatmap(cells, title, [], height=height), cells


def state_counts(cells: PoolCells) -> str:
    """"All 2,048 slots: free 1,200 · filled 800 · empty 48": the slots of each state that occurs
    among the cells drawn (exact: they equal ``np.bincount`` of the slot states)."""
    totals = cells.state_totals.tolist()
    where = (f"All {cells.num_slots:,} slots" if (cells.lo, cells.hi) == (0, cells.num_slots)
             else f"Slots {cells.lo:,}–{cells.hi - 1:,} of {cells.num_slots:,}")
    return f"{where}: " + " · ".join(f"{STATE_NAMES[s]} {n:,}" for s, n in enumerate(totals) if n)


# ---------------------------------------------------------------------------------------- reading back
def plotly_array(value) -> np.ndarray:
    """A figure's array as the browser gets it: plotly 6 writes numpy arrays as
    ``{"dtype", "bdata" (base64), "shape"}``; a plain list stays a list."""
    if isinstance(value, dict) and "bdata" in value:
        import base64

        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return a.reshape([int(x) for x in str(shape).split(",")]) if shape else a
    return np.asarray(value)


def figure_cells(spec: Mapping) -> tuple[np.ndarray, list[str]]:
    """What a :func:`pool_heatmap` figure draws, read back from its JSON (``fig.to_plotly_json()``
    or what Streamlit sends): the colour code of every cell in row-major cell order (-1 where the
    grid has no cell), and each cell's ``hovertext`` string ("" where its layer carries numbers).

    The figure spreads its cells over several column-form traces, so this is how a test or an
    export checks what was drawn against a snapshot (``cell_codes(pool_cells(...))``)."""
    layout = spec["layout"]
    width = int(round(layout["xaxis"]["range"][1] + 0.5))
    rows = int(round(layout["yaxis"]["range"][0] + 0.5))
    codes = np.full(rows * width, -1, dtype=np.int64)
    texts = [""] * (rows * width)
    for trace in spec["data"]:
        if trace.get("type") != "heatmap":
            continue
        x, y = plotly_array(trace["x"]).astype(np.int64), plotly_array(trace["y"]).astype(np.int64)
        z = plotly_array(trace["z"]).astype(np.int64)
        on_grid = np.flatnonzero((x < width) & (y < rows))  # the rest are the off-screen padding points
        idx = y[on_grid] * width + x[on_grid]
        codes[idx] = z[on_grid]
        hover = trace.get("hovertext")
        if isinstance(hover, (list, tuple)):
            for i, k in zip(idx.tolist(), on_grid.tolist()):
                texts[i] = str(hover[k])
    drawn = np.flatnonzero(codes >= 0)
    n = int(drawn[-1]) + 1 if len(drawn) else 0
    return codes[:n], texts[:n]
