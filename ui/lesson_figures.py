"""Figures of the teaching pages (block tables, timelines, sweeps, bars). Pure functions from
recorded numbers to Plotly figures; the pool heatmap itself is :func:`ui.pool_cells.snapshot_heatmap`."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from pagedkv_core.sequence import SequenceStatus
from ui.figures import vline
from ui.pool_cells import REQUEST_COLORS

FONT = dict(size=13)
REF_COLORS = ["#9ecae1", "#fdae6b", "#e6550d", "#a63603", "#7f2704", "#4a1402"]  # ref 1, 2, 3, 4, 5, 6+


def _layout_dict(title: str, height: int, *, legend: bool = False, margin=None) -> dict:
    """The layout every figure here shares, as plotly.js reads it."""
    return {"title": {"text": title, "x": 0.0, "font": {"size": 15}}, "height": height, "font": dict(FONT),
            "margin": dict(margin or dict(l=60, r=20, t=50, b=50)), "plot_bgcolor": "white", "showlegend": legend,
            "legend": {"orientation": "h", "y": -0.22, "x": 0}}


def _layout(fig: go.Figure, title: str, height: int, *, legend: bool = False, margin=None) -> go.Figure:
    fig.update_layout(**_layout_dict(title, height, legend=legend, margin=margin))
    return fig


def short_text(text: str, limit: int = 60) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------- one block table
def block_table_arrows(table: list[int], fills: list[int], block_size: int, title: str,
                       block_texts: list[str] | None = None, refs: list[int] | None = None) -> go.Figure:
    """Logical blocks (left, in order) -> physical blocks (right, sorted by id), one arrow each.
    Each logical box says how many of its ``block_size`` slots hold a token; the last one is yellow."""
    n = len(table)
    fig = go.Figure()
    if n == 0:
        fig.add_annotation(text="no blocks yet", x=0.5, y=0.5, showarrow=False, font=dict(size=14))
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return _layout(fig, title, 200)
    phys_sorted = sorted(set(table))
    rows = max(n, len(phys_sorted))
    ly = [i * (rows - 1) / max(n - 1, 1) if n > 1 else 0 for i in range(n)]
    py = {b: (k * (rows - 1) / max(len(phys_sorted) - 1, 1) if len(phys_sorted) > 1 else 0)
          for k, b in enumerate(phys_sorted)}
    texts = block_texts or [""] * n
    refs = refs or [1] * n
    L0, L1, P0, P1, H = 0.0, 0.36, 0.64, 1.0, 0.36
    for j in range(n):
        color = "#fde68a" if j == n - 1 else "#dbeafe"
        fig.add_shape(type="rect", x0=L0, x1=L1, y0=ly[j] - H, y1=ly[j] + H, line=dict(color="#1e3a8a", width=1),
                      fillcolor=color, layer="below")
    for b in phys_sorted:
        shared = refs[table.index(b)] > 1
        fig.add_shape(type="rect", x0=P0, x1=P1, y0=py[b] - H, y1=py[b] + H,
                      line=dict(color="#c2410c" if shared else "#374151", width=1),
                      fillcolor="#fed7aa" if shared else "#f3f4f6", layer="below")
    for j, b in enumerate(table):
        fig.add_annotation(x=P0 - 0.01, y=py[b], ax=L1 + 0.01, ay=ly[j], xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=2, arrowsize=1.1, arrowwidth=1.6,
                           arrowcolor="#c2410c" if refs[j] > 1 else "#4b5563", text="")
    fig.add_trace(go.Scatter(
        x=[(L0 + L1) / 2] * n, y=ly, mode="text", text=[f"logical {j} · {fills[j]}/{block_size}" for j in range(n)],
        textposition="middle center", textfont=dict(size=12, color="#111827"),
        hovertext=[f"logical block {j} → physical block {table[j]}<br>{fills[j]} of {block_size} slots hold a token"
                   + (f"<br>ref count {refs[j]} (shared)" if refs[j] > 1 else "")
                   + (f"<br>tokens: {texts[j]}" if texts[j] else "") for j in range(n)],
        hoverinfo="text", showlegend=False))
    fig.add_trace(go.Scatter(x=[(P0 + P1) / 2] * len(phys_sorted), y=[py[b] for b in phys_sorted], mode="text",
                             text=[f"physical {b}" for b in phys_sorted], textposition="middle center",
                             textfont=dict(size=12, color="#111827"), hoverinfo="skip", showlegend=False))
    fig.add_annotation(x=(L0 + L1) / 2, y=-0.95, text="<b>block table</b>", showarrow=False, font=dict(size=12))
    fig.add_annotation(x=(P0 + P1) / 2, y=-0.95, text="<b>KV pool</b>", showarrow=False, font=dict(size=12))
    fig.update_xaxes(visible=False, range=[-0.02, 1.02])
    fig.update_yaxes(visible=False, autorange=False, range=[rows - 0.4, -1.5])
    return _layout(fig, title, max(220, 70 + 36 * (rows + 1.5)), margin=dict(l=8, r=8, t=45, b=8))


# ---------------------------------------------------------------------------- every live table
def block_tables_grid(rows: list[tuple[str, list[int]]], block_ref, block_fill, block_size: int, title: str,
                      hover_extra=None) -> go.Figure:
    """One row per live sequence, one cell per logical block: the physical block id, coloured by
    its ref count (pale blue = private, orange to brown = shared by 2, 3, ... sequences).
    Built as plotly.js reads it and not validated, as :func:`status_timeline` is."""
    width = max((len(t) for _, t in rows), default=0)
    if not rows or width == 0:
        layout = _layout_dict(title, 180)
        layout.update(annotations=[{"text": "no sequence holds blocks at this step", "x": 0.5, "y": 0.5, "showarrow": False,
                                    "xref": "paper", "yref": "paper", "font": {"size": 14}}],
                      xaxis={"visible": False}, yaxis={"visible": False})
        return go.Figure(layout=layout, _validate=False)
    z = np.full((len(rows), width), np.nan)
    text = [[""] * width for _ in rows]
    hover = [[""] * width for _ in rows]
    for r, (label, table) in enumerate(rows):
        for j, b in enumerate(table):
            ref = int(block_ref[b])
            z[r, j] = min(ref, len(REF_COLORS))
            text[r][j] = str(b)
            extra = hover_extra(b) if hover_extra else ""
            hover[r][j] = (f"{label}: logical block {j} → physical block {b}<br>ref count {ref} · "
                           f"{int(block_fill[b])}/{block_size} slots filled" + (f"<br>{extra}" if extra else ""))
    n = len(REF_COLORS)
    scale = []
    for i, c in enumerate(REF_COLORS):
        scale += [[i / n, c], [(i + 1) / n, c]]
    heat = {"type": "heatmap", "z": z, "zmin": 0.5, "zmax": n + 0.5, "colorscale": scale, "text": text,
            "textfont": {"size": 10 if width > 32 else 12}, "hovertext": hover, "hoverinfo": "text",
            "xgap": 2 if width <= 64 else 0, "ygap": 3, "showscale": False}
    if width <= 64:  # wider tables: ids on hover only
        heat["texttemplate"] = "%{text}"
    traces = [heat]
    present = sorted({int(v) for v in z[~np.isnan(z)]})
    for v in present:  # a legend entry per ref count on screen
        name = "ref count 1 (private)" if v == 1 else (f"ref count {v} (shared)" if v < n else f"ref count {n}+")
        traces.append({"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name,
                       "marker": {"symbol": "square", "size": 12, "color": REF_COLORS[v - 1]}})
    xaxis = {"title": {"text": "logical block (position in the block table) · the number in a cell is the physical block"},
             "showgrid": False, "zeroline": False, "range": [-0.5, width - 0.5]}
    if width <= 64:
        xaxis["dtick"] = 1 if width <= 24 else 4
    layout = _layout_dict(title, 190 + 36 * len(rows), legend=True, margin=dict(l=120, r=20, t=50, b=50))
    layout.update(xaxis=xaxis, yaxis={"tickvals": list(range(len(rows))), "ticktext": [lab for lab, _ in rows],
                                      "autorange": "reversed", "showgrid": False, "zeroline": False},
                  legend={"orientation": "h", "y": 1.0, "x": 1, "yanchor": "bottom", "xanchor": "right"})
    return go.Figure(data=traces, layout=layout, _validate=False)


# ---------------------------------------------------------------------------- bars
def split_bars(labels: list[str], parts: dict[str, list[float]], colors: dict[str, str], title: str, x_title: str,
               *, height: int | None = None) -> go.Figure:
    """Horizontal stacked bars, one per label (e.g. prefill tokens computed vs taken from the cache).
    Built as plotly.js reads it and not validated, as :func:`status_timeline` is."""
    traces = []
    for name, values in parts.items():
        bar = {"type": "bar", "y": list(labels), "x": list(values), "name": name, "orientation": "h",
               "text": [f"{v:,.0f}" if v else "" for v in values], "textposition": "inside", "insidetextanchor": "middle"}
        if colors.get(name) is not None:
            bar["marker"] = {"color": colors[name]}
        traces.append(bar)
    height = height or 190 + 40 * len(labels)
    layout = _layout_dict(title, height, legend=True, margin=dict(l=90, r=20, t=50, b=100))
    # the legend sits 60 px below the plot area, under the axis title
    layout.update(barmode="stack", xaxis={"title": {"text": x_title}, "rangemode": "tozero"}, yaxis={"autorange": "reversed"},
                  legend={"orientation": "h", "y": -60 / (height - 150), "x": 0, "yanchor": "top", "xanchor": "left"})
    return go.Figure(data=traces, layout=layout, _validate=False)


def value_bars(labels: list[str], values: list[float], title: str, x_title: str, fmt, *, color="#1d4ed8",
               colors: list[str] | None = None, height: int | None = None) -> go.Figure:
    """Horizontal bars with their values printed beside them. Built as plotly.js reads it and not
    validated, as :func:`status_timeline` is."""
    top = max(values) if values else 1
    bar = {"type": "bar", "y": list(labels), "x": list(values), "orientation": "h",
           "marker": {"color": list(colors) if colors else color}, "text": [fmt(v) for v in values],
           "textposition": "outside", "cliponaxis": False}
    layout = _layout_dict(title, height or 190 + 40 * len(labels), margin=dict(l=90, r=30, t=50, b=100))
    layout.update(xaxis={"title": {"text": x_title}, "range": [0, top * 1.25 if top > 0 else 1]},
                  yaxis={"autorange": "reversed"})
    return go.Figure(data=[bar], layout=layout, _validate=False)


# ---------------------------------------------------------------------------- timelines
STATUS_STYLE = {
    # status -> (label, colour)
    int(SequenceStatus.WAITING): ("waiting", "#d1d5db"),
    int(SequenceStatus.RUNNING): ("running", "#2563eb"),
    int(SequenceStatus.SWAPPED): ("swapped out to host", "#0f766e"),
    int(SequenceStatus.PREEMPTED): ("preempted, waits to recompute", "#c026d3"),
}
# The most advanced first: a request with several samples shows the state of its most advanced one.
STATUS_ORDER = [int(SequenceStatus.RUNNING), int(SequenceStatus.SWAPPED), int(SequenceStatus.PREEMPTED),
                int(SequenceStatus.WAITING)]


def most_advanced(states) -> int:
    """The most advanced of a request's sample states (by STATUS_ORDER)."""
    return min(states, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else len(STATUS_ORDER))


def status_timeline(run, labels: list[str], title: str, *, current_step=None, preemptions=(),
                    upto: int | None = None) -> go.Figure:
    """Per request of ``run`` (rows, ``run.request_ids``) and step (columns, ``run.at``): waiting,
    running, swapped or preempted; finished is blank. ``preemptions``: (step, request id) pairs, drawn as ✕.
    ``upto``: draw the steps up to this one only (the axis still spans the run), so that a page at
    step ``upto`` does not show what comes next.

    Built as plotly.js reads it and not validated (:func:`ui.figures.step_curves` says why: a playing
    page builds one every tick); ``tests/test_figures.py`` checks it against a validated copy."""
    request_ids = run.request_ids
    steps = run.num_steps
    drawn = steps if upto is None else max(0, min(steps, upto + 1))
    n = len(request_ids)
    codes = np.full((n, steps), np.nan)
    for s in range(drawn):
        snap = run.at(s)
        for i in range(len(snap.seq_id)):
            r = int(snap.seq_request[i])
            if 0 <= r < n:
                st_code = int(snap.seq_status[i])
                prev = codes[r, s]
                codes[r, s] = st_code if np.isnan(prev) else most_advanced([st_code, int(prev)])
    keys = list(STATUS_STYLE)
    scale = []
    for i, k in enumerate(keys):
        scale += [[i / len(keys), STATUS_STYLE[k][1]], [(i + 1) / len(keys), STATUS_STYLE[k][1]]]
    z = np.full(codes.shape, np.nan)
    for i, k in enumerate(keys):
        z[codes == k] = i
    hover = [[f"{labels[r]} at step {s}: " + ("not yet" if s >= drawn else "finished or not arrived"
                                              if np.isnan(codes[r, s]) else STATUS_STYLE[int(codes[r, s])][0])
              for s in range(steps)] for r in range(n)]
    traces = [{"type": "heatmap", "z": z, "zmin": -0.5, "zmax": len(keys) - 0.5, "colorscale": scale, "showscale": False,
               "xgap": 1, "ygap": 4, "hovertext": hover, "hoverinfo": "text"}]
    for k in keys:  # legend entries
        traces.append({"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": STATUS_STYLE[k][0],
                       "marker": {"symbol": "square", "size": 12, "color": STATUS_STYLE[k][1]}})
    if preemptions:
        traces.append({"type": "scatter", "x": [s for s, _ in preemptions],
                       "y": [request_ids.index(rid) for _, rid in preemptions], "mode": "markers", "name": "preempted here",
                       "marker": {"symbol": "x", "size": 13, "color": "#111827", "line": {"width": 1, "color": "white"}}})
    layout = _layout_dict(title, 150 + 30 * n, legend=True, margin=dict(l=70, r=20, t=50, b=90))
    layout["xaxis"] = {"title": {"text": "engine step"}, "showgrid": False, "zeroline": False, "range": [-0.5, steps - 0.5]}
    layout["yaxis"] = {"tickvals": list(range(n)), "ticktext": list(labels), "autorange": "reversed", "showgrid": False,
                       "zeroline": False}
    if current_step is not None:
        layout["shapes"] = [vline(current_step, "#111827")]
    return go.Figure(data=traces, layout=layout, _validate=False)


def lines(x, series: dict[str, list], title: str, x_title: str, y_title: str, *, colors: dict | None = None,
          percent: bool = False, hline: tuple[float, str] | None = None, current_x=None, height: int = 300,
          log_x: bool = False, x_ticks=None, dash: dict | None = None, markers: bool = True,
          point_labels: dict | None = None) -> go.Figure:
    """Curves over x. ``point_labels``: series name -> format function, to print each point's value.
    Built as plotly.js reads it and not validated, as :func:`status_timeline` is."""
    xs = [math.log2(v) for v in x] if log_x else list(x)
    traces = []
    for name, ys in series.items():
        fmt = (point_labels or {}).get(name)
        line = {"width": 2}
        color, line_dash = (colors or {}).get(name), (dash or {}).get(name)
        if color is not None:
            line["color"] = color
        if line_dash is not None:
            line["dash"] = line_dash
        ys = list(ys)
        trace = {"type": "scatter", "x": list(xs), "y": ys, "name": name,
                 "mode": ("lines+markers" if markers else "lines") + ("+text" if fmt else ""), "line": line,
                 "marker": {"size": 7}, "textposition": ["bottom right"] * (len(xs) - 1) + ["bottom left"],
                 "textfont": {"size": 11}}
        if fmt:
            trace["text"] = [fmt(y) for y in ys]
        traces.append(trace)
    many = len(series) > 1
    layout = _layout_dict(title, height, legend=many, margin=dict(l=65, r=20, t=50, b=100 if many else 60))
    if many:  # the legend sits under the x-axis title, whatever the height
        layout["legend"] = {"orientation": "h", "y": -64 / (height - 150), "x": 0, "yanchor": "top", "xanchor": "left"}
    xaxis = {"title": {"text": x_title}}
    if log_x:  # powers of two, evenly spaced, labelled with their values
        ticks = list(x_ticks or x)
        xaxis.update(tickvals=[math.log2(v) for v in ticks], ticktext=[str(v) for v in ticks])
    yaxis = {"title": {"text": y_title}, "rangemode": "tozero"}
    if percent:
        yaxis["tickformat"] = ".0%"
    layout.update(xaxis=xaxis, yaxis=yaxis)
    shapes = []
    if hline is not None:  # as fig.add_hline(..., annotation_position="top left") draws it
        shapes.append({"type": "line", "x0": 0, "x1": 1, "xref": "x domain", "y0": hline[0], "y1": hline[0], "yref": "y",
                       "line": {"color": "#6b7280", "dash": "dash"}})
        layout["annotations"] = [{"text": hline[1], "x": 0, "xanchor": "left", "xref": "x domain", "y": hline[0],
                                  "yanchor": "bottom", "yref": "y", "showarrow": False,
                                  "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 12, "color": "#374151"}}]
    if current_x is not None:
        shapes.append(vline(math.log2(current_x) if log_x else current_x, "#111827"))
    if shapes:
        layout["shapes"] = shapes
    return go.Figure(data=traces, layout=layout, _validate=False)


def request_color(index: int) -> str:
    return REQUEST_COLORS[index % len(REQUEST_COLORS)]
