"""Where things happen in a run: for each kind of engine event a student may look for, the steps
at which it happens, and the thin strip that marks them under the player's slider.

The engine's events (:mod:`pagedkv_core.events`) are finer than a student needs: a preemption is
either ``preempt_swap`` or ``preempt_recompute``. :data:`EVENT_GROUPS` names what the player
offers. An :class:`EventIndex` reads each step's events once, through ``run.at(step)`` only (so it
works on any run: a list of snapshots, a delta recording, a live run that is still growing), and
:func:`index` keeps one per run object, extended when the run has grown.
"""
from __future__ import annotations

import bisect
import weakref
from collections.abc import Sequence

import plotly.graph_objects as go

from pagedkv_core.events import ADMIT, CACHE_HIT, COW, FINISH, PREEMPT_RECOMPUTE, PREEMPT_SWAP, REJECT, SWAP_IN
from ui.figures import series_color, vline
from ui.pool_cells import REQUEST_COLORS
from ui.runs.model import still_stepping

EVENT_GROUPS: dict[str, tuple[str, ...]] = {
    "admission": (ADMIT,),
    "finish": (FINISH,),
    "preemption (swap or recompute)": (PREEMPT_SWAP, PREEMPT_RECOMPUTE),
    "swap-in": (SWAP_IN,),
    "copy-on-write": (COW,),
    "cache hit": (CACHE_HIT,),
    "rejection": (REJECT,),
}
SHORT_NAMES = {g: g.split(" (")[0] for g in EVENT_GROUPS}


class EventIndex:
    """Per event group, the sorted steps (indices for ``run.at``) whose events include it."""

    def __init__(self):
        self.upto = 0
        self.steps: dict[str, list[int]] = {g: [] for g in EVENT_GROUPS}

    def extend(self, run) -> "EventIndex":
        """Read the steps recorded since the last call."""
        for i in range(self.upto, run.num_steps):
            kinds = {e.kind for e in run.at(i).events}
            for group, members in EVENT_GROUPS.items():
                if kinds.intersection(members):
                    self.steps[group].append(i)
        self.upto = max(self.upto, run.num_steps)
        return self

    def next_after(self, group: str, step: int) -> int | None:
        steps = self.steps[group]
        k = bisect.bisect_right(steps, step)
        return steps[k] if k < len(steps) else None


_INDEXES: dict[int, tuple[weakref.ref, EventIndex]] = {}


def index(run) -> EventIndex:
    """The run's event index, built once per run object and extended as the run grows."""
    held = _INDEXES.get(id(run))
    if held is None or held[0]() is not run:
        for k in [k for k, (ref, _) in _INDEXES.items() if ref() is None]:
            del _INDEXES[k]
        held = (weakref.ref(run), EventIndex())
        _INDEXES[id(run)] = held
    return held[1].extend(run)


def group_of(name: str) -> str:
    """The event group a short or full name refers to (ValueError for an unknown one)."""
    for group, short in SHORT_NAMES.items():
        if name in (group, short):
            return group
    raise ValueError(f"unknown event kind {name!r}: one of {', '.join(SHORT_NAMES.values())}")


def next_event(runs: Sequence, name: str, after: int) -> int | None:
    """The first step after ``after`` at which any of ``runs`` has an event of the group ``name``."""
    group = group_of(name)
    found = [s for s in (index(r).next_after(group, after) for r in runs) if s is not None]
    return min(found) if found else None


def run_color(run, k: int) -> str:
    """The run's colour in every chart over the steps (by allocator or preemption mode), else the k-th palette colour."""
    return series_color(run.label) or REQUEST_COLORS[k % len(REQUEST_COLORS)]


# A run still stepping (the real model, live) gains a step a frame. Its strip's axis grows by this
# many steps at a time, not by one: a frame whose axis and events are those of the frame before is
# only relaid out (its step line moved), where a new axis makes plotly.js draw the whole chart again.
STRIP_CHUNK = 32


def strip_extent(runs: Sequence, num_steps: int) -> int:
    """The steps the strip's axis spans: ``num_steps`` for recorded runs, rounded up to a whole
    number of :data:`STRIP_CHUNK` while any run is still stepping (the steps to come stay blank)."""
    if any(still_stepping(r) for r in runs):
        return -(-max(num_steps, 1) // STRIP_CHUNK) * STRIP_CHUNK
    return num_steps


def event_strip(runs: Sequence, num_steps: int, current: int | None = None, extent: int | None = None) -> go.Figure:
    """A thin chart: one row per event group that occurs, a tick at every step where it does
    (one colour per run), and the current step as a dotted line. ``extent``: the steps its x-axis
    spans (at least ``num_steps``; :func:`strip_extent` for runs still growing).

    Built as plotly.js reads it and not validated, as :func:`ui.figures.step_curves` is (a playing page
    draws one every tick); ``tests/test_figures.py`` checks it against a validated copy."""
    rows = [g for g in EVENT_GROUPS if any(index(r).steps[g] for r in runs)]
    traces = []
    for k, run in enumerate(runs):
        idx = index(run)
        xs, ys = [], []
        for g in rows:
            xs += idx.steps[g]
            ys += [SHORT_NAMES[g]] * len(idx.steps[g])
        if xs:
            traces.append({"type": "scatter", "x": xs, "y": ys, "mode": "markers", "name": run.label,
                           "marker": {"symbol": "line-ns", "size": 11, "line": {"width": 2, "color": run_color(run, k)}},
                           "hovertemplate": f"{run.label}: %{{y}} at step %{{x}}<extra></extra>"})
    yaxis = {"categoryorder": "array", "categoryarray": [SHORT_NAMES[g] for g in reversed(rows)], "showgrid": True,
             "gridcolor": "#f1f5f9", "zeroline": False}
    layout = {
        "height": 46 + 19 * max(1, len(rows)), "margin": {"l": 100, "r": 10, "t": 4, "b": 26},
        "plot_bgcolor": "white", "showlegend": len(runs) > 1,
        "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom", "font": {"size": 11}},
        "font": {"size": 11},
        "xaxis": {"range": [-0.5, max(num_steps, extent or 0, 1) - 0.5], "showgrid": False, "zeroline": False},
        "yaxis": yaxis,
    }
    if current is not None:
        layout["shapes"] = [vline(current, "#111827")]
    if not rows:
        layout["annotations"] = [{"text": "no admissions, finishes, preemptions, swaps, copies, cache hits or rejections yet",
                                  "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper", "showarrow": False,
                                  "font": {"size": 11, "color": "#6b7280"}}]
        yaxis["visible"] = False
    return go.Figure(data=traces, layout=layout, _validate=False)
