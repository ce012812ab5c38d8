"""Exports for slides and course sites: every chart as a PNG, a lesson's run as one HTML file.

* PNG: each ``st.plotly_chart`` gets :func:`png_config`, which keeps Plotly's toolbar (shown on
  hover) with its camera button set to a 2x PNG named after the chart.
* HTML: :func:`animation_html` turns one or more runs into a single self-contained HTML file that
  animates their KV-pool heatmaps offline, with Play / Pause and a scrub slider (Plotly frames,
  plotly.js inlined, so it opens without a network). The file stays bounded: at most
  :data:`MAX_FRAMES` steps are sampled evenly (first and last included), a pool larger than
  :data:`MAX_CELLS` slots is drawn in cells of whole blocks (each coloured by the state most of
  its slots are in), and the frames never hold more than :data:`MAX_VALUES` cells in all. Cells
  travel as int8 codes (base64), so 200 frames of two 2,048-slot pools add under 1 MB to the
  4.8 MB of plotly.js.
"""
from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.pool_cells import LEGEND, NUM_CODES, PoolCells, cell_codes, colorscale, grid_columns, pool_cells

MAX_FRAMES = 200
MAX_CELLS = 16_384  # per run; a larger pool is drawn in cells of whole blocks
MAX_VALUES = 4_000_000  # cells x frames over all runs
FRAME_MS = 120  # Play's pace in the exported file: about 8 steps per second


def png_config(name: str) -> dict:
    """``st.plotly_chart(config=...)``: the toolbar on hover, its camera button saving a 2x PNG."""
    return {
        "displaylogo": False,
        "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
        "toImageButtonOptions": {"format": "png", "filename": f"pagedkv-{name}", "scale": 2},
    }


# ---------------------------------------------------------------------------- sampling
def sampled_steps(num_steps: int, max_frames: int = MAX_FRAMES) -> list[int]:
    """At most ``max_frames`` steps, evenly spread over ``0 .. num_steps - 1``, first and last included."""
    if num_steps <= 0:
        return []
    if num_steps <= max_frames:
        return list(range(num_steps))
    return sorted({int(round(x)) for x in np.linspace(0, num_steps - 1, max(2, max_frames))})


def frame_cells(snap, max_cells: int = MAX_CELLS, grid_block: int | None = None) -> PoolCells:
    """The snapshot's pool cut into at most ``max_cells`` cells: per slot when it fits, else cells
    of whole blocks (the pages' level-of-detail rule, :func:`ui.pool_cells.pool_cells`).
    ``grid_block``: the grid's unit instead of the snapshot's block size (one grid for every run)."""
    return pool_cells(snap.slot_state, snap.slot_owner, max(1, grid_block or snap.block_size), max_cells=max_cells,
                      max_groups=max_cells)


def _grid(codes: np.ndarray, width: int) -> np.ndarray:
    """Row-major cells, the last row padded with code 0 (free), as the pages' heatmaps do."""
    rows = math.ceil(len(codes) / width)
    out = np.zeros(rows * width, dtype=np.int8)
    out[: len(codes)] = codes
    return out.reshape(rows, width)


# ---------------------------------------------------------------------------- the file
def _summary(run, step: int) -> str:
    m = run.at(step).metrics
    ended = f" (its run ended at step {run.num_steps - 1})" if step >= run.num_steps else ""
    return (f"{run.label}{ended}: {m.num_running} running, {m.num_waiting} waiting, "
            f"{m.token_utilization:.0%} of allocated slots hold a token, KV usage {m.kv_usage:.0%}")


def animation_figure(runs: Sequence, title: str, *, max_frames: int = MAX_FRAMES) -> tuple[go.Figure, dict]:
    """The runs' heatmaps side by side with one frame per sampled step; also returns what was
    sampled (``steps``, ``num_steps``, ``slots_per_cell``) for the file's caption."""
    if not runs or not all(r.num_steps for r in runs):
        raise ValueError("every run to export needs at least one step")
    num_steps = max(r.num_steps for r in runs)
    block = max(max(1, r.at(0).block_size) for r in runs)  # one grid for all: contiguous pools on the paged one's
    layout = []  # per run: (slots per cell, cells per row)
    for r in runs:
        cells = frame_cells(r.at(0), grid_block=block)
        layout.append((cells.slots_per_cell, grid_columns(cells.num_cells, block if cells.per_slot else 1)))
    total_cells = sum(frame_cells(r.at(0), grid_block=block).num_cells for r in runs)
    frames_cap = max(2, min(max_frames, MAX_VALUES // max(1, total_cells)))
    steps = sampled_steps(num_steps, frames_cap)

    def z(run, width, step):
        return _grid(cell_codes(frame_cells(run.at(step), grid_block=block)), width)

    def heading(step):
        return f"{title} · step {step} of {num_steps - 1}<br><sup>" + "<br>".join(_summary(r, step) for r in runs) + "</sup>"

    fig = make_subplots(rows=1, cols=len(runs), horizontal_spacing=0.04,
                        subplot_titles=[f"{r.label} ({r.at(0).num_slots:,} slots"
                                        + (f", {g} per cell)" if g > 1 else ")") for r, (g, _) in zip(runs, layout)])
    scale = colorscale()
    for col, (r, (group, width)) in enumerate(zip(runs, layout), start=1):
        fig.add_trace(go.Heatmap(z=z(r, width, steps[0]), zmin=-0.5, zmax=NUM_CODES - 0.5, colorscale=scale,
                                 showscale=False, xgap=1 if width <= 96 else 0, ygap=1 if width <= 96 else 0,
                                 hovertemplate=f"{html.escape(r.label)}: row %{{y}}, cell %{{x}}<extra></extra>"),
                      row=1, col=col)
        fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False, showticklabels=False, row=1, col=col)
        fig.update_xaxes(showgrid=False, zeroline=False, showticklabels=False, row=1, col=col)
    fig.frames = [go.Frame(name=str(s), data=[go.Heatmap(z=z(r, w, s)) for r, (_, w) in zip(runs, layout)],
                           traces=list(range(len(runs))), layout=go.Layout(title_text=heading(s)))
                  for s in steps]
    anim = {"frame": {"duration": FRAME_MS, "redraw": True}, "fromcurrent": True, "transition": {"duration": 0}}
    fig.update_layout(
        title=dict(text=heading(steps[0]), x=0.01, font=dict(size=16)), height=620, plot_bgcolor="white",
        margin=dict(l=20, r=20, t=130, b=150),
        updatemenus=[dict(type="buttons", direction="left", x=0.0, y=-0.08, xanchor="left", yanchor="top",
                          showactive=False, pad=dict(r=10, t=10),
                          buttons=[dict(label="▶ Play", method="animate", args=[None, anim]),
                                   dict(label="❚❚ Pause", method="animate",
                                        args=[[None], {"frame": {"duration": 0, "redraw": False}, "mode": "immediate"}])])],
        sliders=[dict(active=0, x=0.16, len=0.84, y=-0.04, yanchor="top", pad=dict(t=10, b=10),
                      currentvalue=dict(prefix="step ", font=dict(size=14)),
                      steps=[dict(label=str(s), method="animate",
                                  args=[[str(s)], {"mode": "immediate", "frame": {"duration": 0, "redraw": True},
                                                   "transition": {"duration": 0}}]) for s in steps])],
    )
    info = {"steps": steps, "num_steps": num_steps, "slots_per_cell": [g for g, _ in layout]}
    return fig, info


def animation_html(runs: Sequence, title: str, *, max_frames: int = MAX_FRAMES) -> str:
    """One self-contained HTML document (plotly.js inline) animating the runs' heatmaps."""
    fig, info = animation_figure(runs, title, max_frames=max_frames)
    steps, n = info["steps"], info["num_steps"]
    sampled = (f"All {n} steps of the run." if len(steps) == n else
               f"{len(steps)} of the run's {n} steps, sampled evenly (about one in {round(n / len(steps))}) to keep the file small.")
    grouped = [f"{r.label}: one cell per {g} slots (the state most of them are in)"
               for r, g in zip(runs, info["slots_per_cell"]) if g > 1]
    div = fig.to_html(full_html=False, include_plotlyjs=True, auto_play=False, div_id="pagedkv-animation",
                      config={"displaylogo": False, "responsive": True})
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)} · pagedkv</title>\n"
        "<style>body{font-family:system-ui,sans-serif;margin:1.2rem 2rem;color:#111827}"
        "p{max-width:70rem;line-height:1.45}</style>\n</head>\n<body>\n"
        f"<h2>{html.escape(title)}</h2>\n"
        "<p>The KV pool of each run, one cell per token slot, step by step: press <b>Play</b> or drag the slider. "
        f"{html.escape(sampled)} {html.escape(' · '.join(grouped))}</p>\n"
        f"<p><small>{html.escape(LEGEND)} (not drawn in this file: the shared-block dots). "
        "Exported by pagedkv; works offline.</small></p>\n"
        f"{div}\n</body>\n</html>\n"
    )


# ---------------------------------------------------------------------------- Streamlit side
# What the animated file is, said under the download buttons (not as the button's tooltip: Streamlit
# 1.67 draws a button that has one twice, the second copy zero-width, and a click can land on it).
ANIMATION_NOTE = (f"The animated HTML file is one self-contained file (about 5 MB, plotly.js included) that plays "
                  f"the heatmaps offline with Play and a scrub slider, for slides and course sites; runs longer than "
                  f"{MAX_FRAMES} steps are sampled evenly. Every chart on the page also saves as a PNG: the camera "
                  f"in its toolbar.")


def download_animation(runs: Sequence, key: str, title: str, file_stem: str) -> None:
    """A download button for :func:`animation_html` of ``runs``; the file is built when clicked."""
    import streamlit as st

    ready = [r for r in runs if r.num_steps]
    st.download_button(
        "Download the run as an animated HTML file", (lambda: animation_html(ready, title).encode("utf-8")) if ready else b"",
        file_name=f"pagedkv-{file_stem}.html", mime="text/html", key=f"{key}_dl_html", icon=":material/movie:",
        disabled=not ready, on_click="ignore")
