"""A Plotly chart that stays on the screen while playing: mounted once per key, then updated in place.

``st.plotly_chart`` cannot do this in Streamlit 1.67: its browser side reads a figure only when it
mounts the element, and the element's id is a hash of the figure, so every frame of a playing page
was a new element that the browser built from scratch, showing blank for a moment in between (a
stable id froze the chart at its first figure instead: ``ui/streamlit_compat.py``).
:func:`show_chart` draws through a Custom Component v2 (inline JavaScript, no iframe, no build)
whose element id is its key alone. Its JavaScript keeps one Plotly graph per element and applies
each new message with ``Plotly.react`` (a diff against what is drawn: the axes, the toolbar and the
DOM node stay), or with ``Plotly.extendTraces`` when the only change since the message before is
curves grown by some points.

What travels. The first message for a key in a script run (and any figure whose traces differ in
number or type) carries the whole figure: the *keyframe*. Later ones carry only what differs from
the keyframe: a trace's changed attributes (a heatmap's ``z``, its hover ``text``), the points a
curve gained since the keyframe, and the top-level layout entries that changed (a title, the
current-step line). Every message is complete given its keyframe, so a message the browser never
drew (Streamlit renders only the newest of several that arrive together) costs nothing. The same
figure as the message before (a player holding its frame for a busy browser) is sent as the same
message, revision and all, and the browser does not draw a revision twice. A browser
without that keyframe (the element was mounted afresh by a fragment rerun) asks for it, and the
next run sends the whole figure. Numeric arrays travel as Plotly's typed-array form (base64), as
``st.plotly_chart`` sends them.

What is drawn again. ``Plotly.react`` redraws a whole plot when it is given a new array (it does not
compare the contents), so the browser hands it, for every trace and every layout entry that a
message changes exactly as the message drawn before did, the very object it drew then: a chart
whose only change is its layout (the event strip's step line) is relaid out, not drawn again
(its ``data-how`` says ``react-layout``). A heatmap whose cells alone changed on an unchanged layout
(a pool's next step: :mod:`ui.pool_cells` keeps its traces and their grid the same from step to
step) is not given to Plotly at all: its image, one pixel a cell as plotly.js draws it, is painted
from the message and put in place, and the title's text is set (``data-how="cells"``; see
``paintCells``). Plotly's hover then still reads the cells it drew last, so a chart under the pointer,
or resized, is drawn by Plotly in full.

plotly.js is served offline, from the ``plotly`` Python package's own ``plotly.min.js`` (through
Streamlit's component file route), and loaded once per page, not per chart or frame: nothing is
fetched from the network. The toolbar (:func:`ui.export.png_config`) works as on ``st.plotly_chart``.

    show_chart(fig, key=f"{KEY}_heat", config=export.png_config(f"{KEY}-pool"))
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import secrets
import time
from pathlib import Path

import numpy as np
import plotly
import plotly.io as pio
import streamlit as st
import streamlit.components.v2 as components_v2
from _plotly_utils.utils import to_typed_array_spec

COMPONENT = "pagedkv_live_chart"
PLOTLY_DIR = Path(plotly.__file__).resolve().parent / "package_data"
PLOTLY_FILE = "plotly.min.js"
_ASSETS = "plotlyjs"  # the name the file route serves PLOTLY_DIR under (prefixed with this module's name)
# A curve that has gained more points than this since its keyframe gets a new keyframe.
MAX_TAIL = 512

# Streamlit's own Plotly theme (what ``st.plotly_chart(theme="streamlit")`` applies in the browser),
# for the light theme: fonts, colors, the legend and axes as the other charts of the app draw them.
_TEXT, _GRID, _HEAD = "#31333F", "#e6eaf1", "#31333F"
_FONT = '"Source Sans", "Source Sans Pro", sans-serif'
THEME = {"layout": {
    "font": {"color": _TEXT, "family": _FONT, "size": 12},
    "title": {"font": {"family": _FONT, "size": 16, "color": _HEAD}, "xanchor": "left", "x": 0},
    "legend": {"font": {"size": 12, "color": _TEXT}, "bordercolor": "rgba(0,0,0,0)", "borderwidth": 0},
    "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
    "colorway": ["#0068c9", "#83c9ff", "#ff2b2b", "#ffabab", "#29b09d", "#7defa1", "#ff8700", "#ffd16a",
                 "#6d3fc0", "#d5dae5"],
    "xaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "tickcolor": _GRID, "showgrid": False, "zeroline": False,
              "automargin": True, "title": {"font": {"size": 14, "color": _TEXT}, "standoff": 12},
              "tickfont": {"size": 12, "color": _TEXT}},
    "yaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "tickcolor": _GRID, "automargin": True,
              "ticklabelposition": "outside", "title": {"font": {"size": 14, "color": _TEXT}, "standoff": 12},
              "tickfont": {"size": 12, "color": _TEXT}},
    "hoverlabel": {"bgcolor": "#ffffff", "bordercolor": "rgba(49, 51, 63, 0.2)",
                   "font": {"color": _TEXT, "family": _FONT, "size": 12}},
}}

JS = r"""
const charts = new WeakMap();

function plotlyReady(url) {
  if (window.Plotly && window.Plotly.react) return Promise.resolve(window.Plotly);
  if (!window.__pagedkvPlotly) {
    window.__pagedkvPlotly = new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = url;
      s.async = true;
      s.dataset.pagedkv = "plotly";
      s.onload = () => (window.Plotly ? resolve(window.Plotly) : reject(new Error("plotly.js loaded without Plotly")));
      s.onerror = () => { window.__pagedkvPlotly = null; reject(new Error("plotly.js did not load from " + url)); };
      document.head.appendChild(s);
    });
  }
  return window.__pagedkvPlotly;
}

// The figure a message stands for: its keyframe with the message's changes on top (copies: Plotly
// extends the arrays it is given in place, and the keyframe must stay as it came). A trace the
// message changes as the message drawn before did (the same keyframe, the same changes) is that
// draw's trace object itself, arrays and all: Plotly.react takes a new array for new data and
// redraws the whole plot for it, so a chart whose only change is its layout (the event strip's
// step line) is then relaid out, not drawn again. ``c.made`` is what the last Plotly.react drew
// (``layout`` as given, before :func:`bold`).
function target(c, m) {
  const copy = (v) => (Array.isArray(v) ? v.slice() : v);
  const sigs = c.keyframe.data.map((t, i) => JSON.stringify([(m.set && m.set[i]) || null, (m.ext && m.ext[i]) || null]));
  const made = c.made && c.made.base === c.base ? c.made : null;  // the same keyframe: the same traces
  let kept = 0;
  const data = c.keyframe.data.map((t, i) => {
    if (made && made.sigs[i] === sigs[i]) { kept += 1; return made.data[i]; }
    const out = Object.assign({}, t, (m.set && m.set[i]) || {});
    out.x = copy(out.x);
    out.y = copy(out.y);
    const ext = m.ext && m.ext[i];
    if (ext) for (const [attr, e] of Object.entries(ext)) out[attr] = (t[attr] || []).slice(0, e.from).concat(e.tail);
    for (const k of ["x", "y"]) if (out[k] === undefined) delete out[k];
    return out;
  });
  // likewise each layout entry the message changes as the one before did (an axis's category
  // list is an array, which Plotly.react also takes as new data when it is a new array)
  const layout = Object.assign({}, c.keyframe.layout);
  const entries = {};
  for (const [k, v] of Object.entries(m.layout || {})) {
    entries[k] = JSON.stringify(v);
    layout[k] = made && made.entries[k] === entries[k] ? made.layout[k] : v;
  }
  return { data, sigs, kept, layout, entries };
}

// A heatmap whose cells alone changed since the chart was last laid out (a pool's next step) is
// repainted, not drawn again: Plotly.react's own work per plot (defaults, axes, shapes) is most of
// a pool frame, while its picture of the cells is one image of a pixel a cell ("fast" drawing, as
// plotly.js draws a heatmap on an even grid without gaps). Here that image is painted the same way
// from the message (the colours from the figure's colour axis) and put in place, and the title's
// text is set; gd.data and gd.layout take the message's traces and title, so an export draws what
// is shown. Plotly's own hover data stays that of the last full draw, so a pointer over the chart,
// a resize, or anything this cannot repaint exactly, draws it in full.
const CELL_KEYS = new Set(["x", "y", "z", "text", "hovertext", "customdata", "hovertemplate"]);
const XLINK = "http://www.w3.org/1999/xlink";
const TYPED = { i1: Int8Array, u1: Uint8Array, i2: Int16Array, u2: Uint16Array, i4: Int32Array, u4: Uint32Array,
                f4: Float32Array, f8: Float64Array };

function sorted(v) {
  if (v === null || typeof v !== "object" || Array.isArray(v)) return v;
  const out = {};
  for (const k of Object.keys(v).sort()) out[k] = sorted(v[k]);
  return out;
}

// What a message lays out apart from its heatmaps' cells and its title's text: two messages with the
// same layout key differ on the screen only by those.
function layoutKey(c, m) {
  const traces = c.keyframe.data.map((t, i) => {
    const kept = {};
    for (const [k, v] of Object.entries((m.set && m.set[i]) || {})) if (!(t.type === "heatmap" && CELL_KEYS.has(k))) kept[k] = v;
    return [kept, (m.ext && m.ext[i]) || null];
  });
  const layout = sorted(Object.assign({}, c.keyframe.layout, m.layout || {}));
  if (layout.title && typeof layout.title === "object") layout.title = Object.assign({}, layout.title, { text: null });
  return JSON.stringify([traces, layout]);
}

function numbers(v) {
  if (Array.isArray(v) || ArrayBuffer.isView(v)) return v;
  if (!v || typeof v.bdata !== "string" || !TYPED[v.dtype] || (v.shape !== undefined && String(v.shape).includes(","))) return null;
  const bin = atob(v.bdata);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new TYPED[v.dtype](bytes.buffer);
}

// The grid a column-form heatmap lies on when its x and y are every integer from 0 up (the pools'
// traces are padded to it: ui.pool_cells): {w, h}, or null.
function evenGrid(t) {
  const x = numbers(t.x), y = numbers(t.y);
  if (!x || !y || x.length !== y.length || !x.length) return null;
  const dims = [x, y].map((a) => {
    let hi = -1;
    for (const v of a) { if (!Number.isInteger(v) || v < 0 || v > 65535) return 0; if (v > hi) hi = v; }
    const seen = new Uint8Array(hi + 1);
    for (const v of a) seen[v] = 1;
    return seen.every((s) => s === 1) ? hi + 1 : 0;
  });
  return dims[0] && dims[1] ? { w: dims[0], h: dims[1], x, y } : null;
}

// code -> [r, g, b, 255] for a colour axis whose scale is constant over each code's place in it.
function cellColours(axis) {
  if (!axis || !Array.isArray(axis.colorscale) || typeof axis.cmin !== "number" || !(axis.cmax > axis.cmin)) return null;
  const stops = axis.colorscale.map(([f, colour]) => {
    const hex = /^#([0-9a-f]{6})$/i.exec(colour || "");
    return hex ? [f, [0, 2, 4].map((k) => parseInt(hex[1].slice(k, k + 2), 16))] : null;
  });
  if (stops.some((s) => !s)) return null;
  const cache = new Map();
  return (z) => {
    if (cache.has(z)) return cache.get(z);
    const f = (z - axis.cmin) / (axis.cmax - axis.cmin);
    let out = null;
    for (let i = 0; i + 1 < stops.length; i++) {
      const [f0, a] = stops[i], [f1, b] = stops[i + 1];
      if (f0 < f && f < f1 && a.every((v, k) => v === b[k])) { out = [...a, 255]; break; }
    }
    cache.set(z, out);
    return out;
  };
}

// Repaint the changed heatmaps of ``fig`` in place; false (nothing touched) where that would not be
// exactly what Plotly draws.
function paintCells(c, fig) {
  const gd = c.div, shown = c.shown, lay = c.keyframe.layout || {};
  const xr = lay.xaxis && lay.xaxis.range, yr = lay.yaxis && lay.yaxis.range;
  if (!Array.isArray(xr) || !Array.isArray(yr) || !(xr[0] < xr[1]) || !(yr[0] > yr[1])) return false;
  const colour = cellColours(lay.coloraxis);
  if (!colour) return false;
  const groups = new Map();
  for (const g of gd.querySelectorAll("g.hm")) {
    const cd = g.__data__;
    if (cd && cd[0] && cd[0].trace) groups.set(cd[0].trace.index, g);
  }
  const paints = [];
  for (let i = 0; i < fig.data.length; i++) {
    if (fig.sigs[i] === shown.sigs[i]) continue;
    const t = fig.data[i], grid = shown.grids[i];
    const img = groups.has(i) && groups.get(i).querySelector("image");
    if (t.type !== "heatmap" || t.coloraxis !== "coloraxis" || !grid || !img) return false;
    if ((t.xaxis || "x") !== "x" || (t.yaxis || "y") !== "y") return false;  // the axes checked above only
    if (!/pixelated/.test(img.getAttribute("style") || "")) return false;  // not Plotly's "fast" drawing
    const now = evenGrid(t), z = numbers(t.z);
    if (!now || now.w !== grid.w || now.h !== grid.h || !z || z.length !== now.x.length) return false;
    const px = new Uint8ClampedArray(grid.w * grid.h * 4);
    for (let k = 0; k < z.length; k++) {
      if (z[k] === null || Number.isNaN(z[k])) continue;
      const rgba = colour(z[k]);
      if (!rgba) return false;
      px.set(rgba, (now.y[k] * grid.w + now.x[k]) * 4);
    }
    paints.push([i, img, new ImageData(px, grid.w, grid.h)]);
  }
  const title = fig.layout.title && fig.layout.title.text;
  const node = gd.querySelector(".gtitle");
  const span = node && node.children.length === 1 ? node.firstElementChild : null;
  if (title !== shown.title) {
    if (typeof title !== "string" || /[<&]/.test(title) || !span || node.textContent !== shown.title) return false;
  }
  const canvas = document.createElement("canvas");
  for (const [i, img, pixels] of paints) {
    canvas.width = pixels.width;
    canvas.height = pixels.height;
    canvas.getContext("2d").putImageData(pixels, 0, 0);
    img.setAttributeNS(XLINK, "xlink:href", canvas.toDataURL("image/png"));
    gd.data[i] = fig.data[i];
  }
  if (title !== shown.title) {
    span.textContent = title;
    if (gd.layout) gd.layout.title = bold({ title: fig.layout.title }).title;
  }
  return true;
}

// Draw the chart's last message again, by Plotly in full (a newer message, if one waits, instead).
function redrawFully(c) {
  if (!c.shown || !c.shown.msg || c.shown.base !== c.base) return;
  c.force = true;
  if (!c.next) c.next = c.shown.msg;
  if (!c.busy) { c.busy = true; draw(c); }
}

// Titles in bold, as Streamlit's own Plotly theme draws them.
function bold(layout) {
  const t = layout && layout.title;
  if (!t || typeof t.text !== "string" || !t.text || t.text.startsWith("<b>")) return layout;
  return Object.assign({}, layout, { title: Object.assign({}, t, { text: "<b>" + t.text + "</b>" }) });
}

async function draw(c) {
  while (c.next) {
    const m = c.next;
    c.next = null;
    try {
      const Plotly = await plotlyReady(m.plotly);
      if (c.base !== m.base) {  // mounted afresh after its keyframe was sent: ask for the whole figure
        if (c.asked !== m.base) {
          c.asked = m.base;
          c.div.dataset.asks = String(Number(c.div.dataset.asks || 0) + 1);
          c.setStateValue("missing", m.base + "@" + Date.now());
        }
        continue;
      }
      if (c.drawn && m.rev === c.rev && m.base === c.base && !c.force) continue;  // drawn already: a held frame
      const grown = m.grow && c.rev === m.prev && c.drawn && !c.force;
      const fig = grown ? null : target(c, m);
      const key = grown || !c.keyframe.data.some((t) => t.type === "heatmap") ? null : layoutKey(c, m);
      const cells = key !== null && !m.full && !c.force && !c.hover && c.drawn && c.shown && c.shown.base === c.base
        && c.shown.key === key && paintCells(c, fig);
      if (cells) {
        c.made = null;  // gd.data now holds this message's traces: the next full draw takes them all anew
        c.stale = true;
        c.shown = Object.assign({}, c.shown, { sigs: fig.sigs, title: fig.layout.title && fig.layout.title.text, msg: m });
      } else if (grown) {  // only curves grew (and perhaps the layout changed): extend them in place
        const idx = Object.keys(m.grow).map(Number);
        const attrs = [...new Set(idx.flatMap((i) => Object.keys(m.grow[i])))];
        const update = {};
        for (const a of attrs) update[a] = idx.map((i) => m.grow[i][a] || []);
        c.made = null;  // the arrays drawn grow in place: no longer what their message said
        if (idx.length) Plotly.extendTraces(c.div, update, idx);
        if (m.relayout && Object.keys(m.relayout).length) await Plotly.relayout(c.div, bold(m.relayout));
      } else {
        c.made = null;
        await Plotly.react(c.div, fig.data, bold(fig.layout), m.config || {});
        c.made = { base: c.base, sigs: fig.sigs, data: fig.data, entries: fig.entries, layout: fig.layout };
      }
      if (!cells) {
        c.stale = false;
        c.force = false;
        c.shown = grown ? null : { base: c.base, key, sigs: fig.sigs, msg: m, title: fig.layout.title && fig.layout.title.text,
                                   grids: fig.data.map((t) => (t.type === "heatmap" ? evenGrid(t) : null)) };
      }
      c.drawn = true;
      // drawn before its container had its width (a busy browser): fit the width now
      const full = c.div._fullLayout;
      if (!cells && full && Math.abs(full.width - c.div.getBoundingClientRect().width) > 1) Plotly.Plots.resize(c.div);
      c.rev = m.rev;
      c.div.dataset.rev = String(m.rev);
      // how it was drawn: curves extended, a keyframe, its traces as drawn before (the layout changed), or new traces
      c.div.dataset.how = cells ? "cells" : grown ? "extend" : (m.full ? "react-full" : (fig.kept === fig.data.length ? "react-layout" : "react"));
    } catch (err) {  // draw the next message on a clean plot
      console.error("live chart", err);
      c.div.dataset.error = String(err && err.message || err);
      try { window.Plotly && window.Plotly.purge(c.div); } catch (e) { /* nothing drawn */ }
      c.drawn = false;
      c.shown = null;
      c.force = false;
    }
  }
  c.busy = false;
}

export default function (component) {
  const { parentElement, setStateValue } = component;
  const data = Array.isArray(component.data) ? component.data[0] : component.data;  // see wire()
  let c = charts.get(parentElement);
  if (!c) {
    const div = document.createElement("div");
    div.className = "pagedkv-live-chart";
    div.style.width = "100%";
    parentElement.appendChild(div);
    c = { div, keyframe: null, base: null, rev: -1, drawn: false, next: null, busy: false };
    c.resize = new ResizeObserver(() => {
      if (c.drawn && c.stale) redrawFully(c);  // Plotly would lay out the cells it drew last
      else if (c.drawn && window.Plotly) window.Plotly.Plots.resize(div);
    });
    // Plotly's hover reads the cells of its last full draw: under a pointer the chart is drawn in full
    div.addEventListener("pointerenter", () => { c.hover = true; if (c.stale) redrawFully(c); });
    div.addEventListener("pointerleave", () => { c.hover = false; });
    c.resize.observe(parentElement instanceof ShadowRoot ? parentElement.host : parentElement);
    charts.set(parentElement, c);
  }
  c.setStateValue = setStateValue;
  if (data && data.key && c.div.dataset.key !== data.key) c.div.dataset.key = data.key;
  if (data) {
    if (data.full) { c.keyframe = data.full; c.base = data.base; }  // kept even if a newer message comes first
    c.next = data;  // only the newest message is drawn: each is complete given its keyframe
    if (!c.busy) { c.busy = true; draw(c); }
  }
  // Streamlit also calls this when a newer message overtook this call (the element stays): only
  // an element that has left the page is cleaned up.
  return () => setTimeout(() => {
    if (parentElement.isConnected || charts.get(parentElement) !== c) return;
    c.resize.disconnect();
    if (window.Plotly && c.drawn) window.Plotly.purge(c.div);
    charts.delete(parentElement);
  }, 0);
}
"""

CSS = ".pagedkv-live-chart { width: 100%; }"

_mount = components_v2.component(COMPONENT, js=JS, css=CSS, isolate_styles=False)
_declared: set[int] = set()


def plotly_url() -> str:
    """Where the browser loads plotly.js from: the ``plotly`` package's own file, served by this
    Streamlit server (a component file route), so a page plays without a network."""
    import streamlit.components.v1 as components
    from streamlit import config
    from streamlit.runtime import Runtime

    rt = id(Runtime.instance()) if Runtime.exists() else 0
    if rt not in _declared:
        declared = components.declare_component(_ASSETS, path=str(PLOTLY_DIR))
        _declared.add(rt)
        _NAME[0] = declared.name
    base = (config.get_option("server.baseUrlPath") or "").strip("/")
    return f"{'/' + base if base else ''}/component/{_NAME[0]}/{PLOTLY_FILE}"


_NAME = [f"{__name__}.{_ASSETS}"]


def figure_json(fig) -> dict:
    """``fig`` as the JSON the browser gets (numeric arrays as base64 typed arrays), with the app's
    theme as its template (not Plotly's default one, about 10 kB a message).

    It is what ``json.loads(plotly.io.to_json(fig))`` gives, built without the round trip: that deep-
    copies the figure, walks it for arrays, and encodes, decodes and encodes it again (for NaN), about
    half of a live frame's figure time. A value this walk does not know (a date, a Decimal, a
    non-string key) sends the figure through plotly's own path instead. ``tests/test_live_chart.py``
    checks the two against each other on every kind of chart a page plays."""
    try:
        layout = {k: v for k, v in fig._layout.items() if k != "template"}  # replaced by THEME below
        out = {"data": [_plain_trace(t) for t in fig._data], "layout": _plain(layout)}
    except (_NotPlain, AttributeError):  # AttributeError: not a plotly Figure
        out = json.loads(pio.to_json(fig, validate=False))
        out.pop("frames", None)
    out.setdefault("layout", {})["template"] = THEME
    return out


class _NotPlain(Exception):
    """A value :func:`_plain` leaves to plotly's own JSON encoder."""


# Keys whose values plotly leaves as plain lists, never typed arrays (``_plotly_utils.utils.is_skipped_key``).
_PLAIN_KEYS = frozenset(("geojson", "layer", "layers", "range"))


def _plain_trace(trace: dict) -> dict:
    out = _plain(trace)
    out.pop("uid", None)  # as plotly.io.to_json(remove_uids=True)
    return out


def _plain(value, typed: bool = True):
    """``value`` as plotly's JSON has it: numpy arrays as typed-array specs (plain lists under the
    keys of :data:`_PLAIN_KEYS`), numpy scalars as numbers, NaN and infinities as null."""
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _NotPlain(k)
            out[k] = _plain(v, typed and k not in _PLAIN_KEYS)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, typed) for v in value]
    if isinstance(value, np.ndarray):
        if typed:
            spec = to_typed_array_spec(value)
            if isinstance(spec, dict):
                return spec
        return _plain(value.tolist(), False)
    if isinstance(value, np.generic):
        return _plain(value.item(), typed)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    raise _NotPlain(type(value).__name__)


def _shape(fig: dict) -> list:
    return [t.get("type", "scatter") for t in fig.get("data", [])]


def _extension(old, new) -> list | None:
    """The points ``new`` adds to ``old`` when it is ``old`` with points appended (plain JSON lists)."""
    if isinstance(old, list) and isinstance(new, list) and len(new) > len(old) and new[: len(old)] == old:
        return new[len(old):]
    return None


def changes(keyframe: dict, fig: dict) -> dict:
    """What a message carries on top of ``keyframe`` to stand for ``fig`` (same traces, in order):
    ``set`` (trace index → attributes that differ), ``ext`` (trace index → attribute → the keyframe's
    first ``from`` points and a ``tail``, for curves that grew) and ``layout`` (top-level entries
    that differ)."""
    set_, ext = {}, {}
    for i, (a, b) in enumerate(zip(keyframe["data"], fig["data"])):
        for attr in a.keys() | b.keys():
            va, vb = a.get(attr), b.get(attr)
            if va == vb:
                continue
            tail = _extension(va, vb) if attr in ("x", "y") else None
            if tail is not None:
                ext.setdefault(str(i), {})[attr] = {"from": len(va), "tail": tail}
            else:
                set_.setdefault(str(i), {})[attr] = vb
    la, lb = keyframe.get("layout", {}), fig.get("layout", {})
    layout = {k: lb.get(k) for k in la.keys() | lb.keys() if la.get(k) != lb.get(k)}
    return {"set": set_, "ext": ext, "layout": layout}


def growth(last: dict, fig: dict) -> tuple[dict, dict] | None:
    """When ``fig`` differs from ``last`` (the figure sent before) only by points appended to
    curves' x/y and by top-level layout entries: (trace index → attribute → new points, the layout
    entries that changed). None otherwise (Plotly.react draws it)."""
    grow = {}
    for i, (a, b) in enumerate(zip(last["data"], fig["data"])):
        for attr in a.keys() | b.keys():
            va, vb = a.get(attr), b.get(attr)
            if va == vb:
                continue
            tail = _extension(va, vb) if attr in ("x", "y") else None
            if tail is None:
                return None
            grow.setdefault(str(i), {})[attr] = tail
    for i, attrs in grow.items():  # extendTraces grows x and y together
        a = last["data"][int(i)]
        if isinstance(a.get("x"), list) and isinstance(a.get("y"), list) and set(attrs) != {"x", "y"}:
            return None
    la, lb = last.get("layout", {}), fig.get("layout", {})
    relayout = {k: lb.get(k) for k in la.keys() | lb.keys() if la.get(k) != lb.get(k)}
    return grow, relayout


def message(state: dict, fig: dict, config: dict, url: str, *, fresh: bool) -> dict:
    """The message for ``fig`` given what this key sent before (``state``, updated in place);
    ``fresh``: start with a keyframe whatever was sent. The same figure as the message before (a
    player holding its frame for a browser still drawing it) is the same message, revision
    included: the browser has drawn it already and draws nothing."""
    sent = state.get("sent")
    if not fresh and sent is not None and state.get("last") == fig and sent["config"] == config:
        return sent
    rev = state.get("rev", -1) + 1
    msg = {"plotly": url, "config": config, "rev": rev, "prev": state.get("rev", -1)}
    kf = state.get("keyframe")
    diff = None if fresh or kf is None or _shape(kf) != _shape(fig) else changes(kf, fig)
    if diff is None or any(len(e["tail"]) > MAX_TAIL for t in diff["ext"].values() for e in t.values()):
        kf = None
    if kf is None:
        state["keyframe"], state["base"] = fig, secrets.token_hex(6)
        msg.update(full=fig, base=state["base"])
    else:
        msg.update(diff, base=state["base"])
        last = state.get("last")
        grown = growth(last, fig) if last is not None and _shape(last) == _shape(fig) else None
        if grown is not None and grown[0]:
            msg["grow"], msg["relayout"] = grown
    state["last"], state["rev"], state["sent"] = fig, rev, msg
    return msg


def forget(state: dict) -> None:
    """What a key sent is unknown to the browser (it mounted the chart afresh): the next
    :func:`message` is the whole figure."""
    for name in ("keyframe", "last", "sent"):
        state.pop(name, None)


def _forget(state_key: str) -> None:
    """The browser lacks this key's keyframe: send the whole figure next."""
    state = st.session_state.get(state_key)
    if state is not None:
        forget(state)


def _full_run() -> object | None:
    """An object that is new in every full script run and the same through the fragment reruns
    after it (a full run may mount the page's elements afresh: another page, the presenter view).
    None in a fragment rerun before any full run, or outside a script run."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:
        return None
    if not ctx.fragment_ids_this_run and st.session_state.get(_RUN) is not ctx.cursors:
        st.session_state[_RUN] = ctx.cursors  # a new dict at the start of every run
    return st.session_state.get(_RUN)


_RUN = "_live_chart_full_run"


def show_chart(fig, key: str, *, config: dict | None = None, where=None, hold_s: float | None = None) -> None:
    """Draw ``fig`` (a plotly Figure, or a function that builds one) full width under ``key``,
    updating the chart drawn under the same key in place (no new element, nothing blank).
    ``config``: Plotly's config (the toolbar, :func:`ui.export.png_config`); ``where``: a container
    or column (default: here).

    ``hold_s``: a chart sent less than this many seconds ago is sent again as it was, and ``fig``
    is not built: the browser has drawn it and draws nothing. A playing page passes it for what
    may change once a second (its curves), so that the browser's frames go to the pools, which
    change every step; a page that is not playing passes None and always shows the step's chart."""
    state_key = f"_live_chart_{key}"
    state = st.session_state.setdefault(state_key, {})
    run = _full_run()
    fresh = state.get("run") is not run
    state["run"] = run
    now = time.monotonic()
    held = (not fresh and hold_s is not None and state.get("sent") is not None
            and now - state.get("sent_at", -math.inf) < hold_s)
    if held:
        _draw(state_key, state["sent"], key, where)
        return
    if callable(fig):
        fig = fig()
    state["sent_at"] = now
    # Not Plotly's "responsive" mode: there the plot's box is 100% of a node that has no height of its
    # own, and a chart first drawn into a node that already had a height (a busy browser, now and
    # then) stayed 0 px high: a slide without its figure. The box is the figure's size in pixels, and
    # the chart follows its container's width through the component's ResizeObserver.
    msg = message(state, figure_json(fig), {"responsive": False, **(config or {})}, plotly_url(), fresh=fresh)
    msg["key"] = key  # on the chart's node as data-key, for tests and style sheets
    _draw(state_key, msg, key, where)


def _draw(state_key: str, msg: dict, key: str, where) -> None:
    with where if where is not None else contextlib.nullcontext():
        _mount(key=key, data=wire(msg), width="stretch", height="content",
               on_missing_change=functools.partial(_forget, state_key))


def wire(msg: dict) -> list:
    """The message as the component's data: a one-item list. Streamlit scans a dict's values for
    dataframes, and its first look imports pandas and pyarrow into the app server (about 80 MiB,
    measured: the classroom load test's server peak went from about 130 to 250 MiB); a list is
    sent as JSON untouched."""
    return [msg]


def received(data) -> dict | None:
    """The message a component's data carries (:func:`wire`)."""
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict):
        return data[0]
    return data if isinstance(data, dict) else None


def sent_figure(data) -> dict | None:
    """The whole figure a message carries (a keyframe), or None for a message of changes. For tests
    that read a chart's figure off an element (AppTest runs are full runs: every chart is a keyframe)."""
    msg = received(data)
    return msg.get("full") if msg is not None else None
