"""Plotly figures over the engine steps: curves of several runs on one chart, integer ticks, a
legend under the plot, and one colour per allocator.

Pure functions from recorded numbers to figures, so the pages stay thin and the figures are
testable. The KV pool itself is drawn by :mod:`ui.pool_cells` (:func:`ui.pool_cells.snapshot_heatmap`:
one cell per slot up to 16,384 slots, above that one cell per group of whole blocks) and put on a
page by :mod:`ui.pool_view` (the zoom control, the chart and its per-state counts).
"""
from __future__ import annotations

import plotly.graph_objects as go

# One colour per allocator in every chart over the steps.
ALLOCATOR_COLORS = {"contiguous": "#c2410c", "paged": "#1d4ed8", "swap": "#0f766e", "recompute": "#a21caf"}


def series_color(name: str) -> str | None:
    for key, color in ALLOCATOR_COLORS.items():
        if name.startswith(key):
            return color
    return None


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


def legend_below_layout(height: int, top: int, rows: int = 1) -> tuple[int, dict]:
    """(the bottom margin, the legend) that put a horizontal legend under the x-axis title of a
    plot ``height`` px high with a ``top`` margin, never over it (``rows``: rows the legend wraps to)."""
    bottom = AXIS_TITLE_PX + rows * LEGEND_ROW_PX + 6
    plot = max(40, height - top - bottom)
    return bottom, {"orientation": "h", "x": 0.0, "xanchor": "left", "yanchor": "top", "y": -AXIS_TITLE_PX / plot}


def legend_below(fig: go.Figure, rows: int = 1) -> go.Figure:
    """A horizontal legend under the x-axis title, never over it: the bottom margin grows to hold
    it (``rows``: rows the legend wraps to at the chart's width). Needs the figure's height."""
    top = fig.layout.margin.t if fig.layout.margin.t is not None else 40
    bottom, legend = legend_below_layout(fig.layout.height or 450, top, rows)
    fig.update_layout(margin=dict(b=bottom), legend=legend)
    return fig


def vline(x, color: str) -> dict:
    """A dotted vertical line at ``x`` across the plot, as ``fig.add_vline(x=x, line_dash="dot",
    line_color=color)`` adds it."""
    return {"type": "line", "x0": x, "x1": x, "xref": "x", "y0": 0, "y1": 1, "yref": "y domain",
            "line": {"dash": "dot", "color": color}}


def step_curves(steps, series: dict[str, list], title: str, y_title: str, *, percent: bool = True,
                current_step: int | None = None, height: int = 300) -> go.Figure:
    """Several named curves over the engine steps, on one chart.

    Built as plotly.js reads it and not validated (``go.Figure(..., _validate=False)``): a playing page
    builds one every tick, and validating its lists took most of that (every point
    checked). Every key is plotly.js's own and nothing is None; ``tests/test_figures.py`` checks the
    figure, and the callers' updates to it, against a validated copy."""
    xs = list(steps)
    traces = []
    for name, ys in series.items():
        color = series_color(name)
        traces.append({"type": "scatter", "x": list(xs), "y": list(ys), "mode": "lines", "name": name,
                       "line": {"color": color, "width": 2} if color else {"width": 2}})
    bottom, legend = legend_below_layout(height, top=40)
    yaxis = {"title": {"text": y_title}, "rangemode": "tozero"}
    if percent:
        yaxis["tickformat"] = ".0%"
    layout = {
        "title": {"text": title, "x": 0.0, "font": {"size": 15}}, "height": height,
        "margin": {"l": 50, "r": 10, "t": 40, "b": bottom}, "legend": legend,
        "xaxis": {"title": {"text": "engine step"}}, "yaxis": yaxis,
    }
    if current_step is not None:
        layout["shapes"] = [vline(current_step, "#555")]
    return go.Figure(data=traces, layout=layout, _validate=False)
