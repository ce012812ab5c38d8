"""Presenter mode: a lesson's guide as slides for a projector.

One figure and its narration at a time, in large type, the sidebar out of the way, and Next /
Previous on the arrow keys (``st.button(shortcut=...)``, Streamlit 1.67). With guide mode on it is
the guide with a different layout; with guide mode off it is free play on a projector (the
player and the lesson's figures, large, without the sidebar). ``?present=on`` in a lesson's URL
opens the guide's slides (with ``guide_step`` to pick the slide); ``?present=on&guide=off`` opens
free play in presenter mode.

The layout is sized for 1280 x 720, the lowest common projector resolution: the page's chrome
(Streamlit's header, the sidebar) is hidden and the type is scaled up with a style sheet, and
:func:`slide` draws the step's one figure at a height that fits under the narration.
"""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from ui import export
from ui.live_chart import show_chart

PARAM = "present"
NEXT_KEY, PREVIOUS_KEY = "Right", "Left"  # arrow keys; a clicker's PageDown/PageUp also scroll the slide
SLIDE_HEIGHT = 380  # px: fits under the title, buttons and a two-line narration at 1280 x 720
# A slide that asks a prediction also holds the question and, once answered, the measured answer:
# its figure is shorter, so that it still ends above the fold at 1280 x 720.
PREDICTION_SLIDE_HEIGHT = 290
_HEIGHT_KEY = "_presenter_slide_height"
SLIDE_FONT = 17

# Large type and no chrome. Selectors are Streamlit 1.67's data-testids (checked by screenshot).
CSS = """
<style>
section[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], [data-testid="stExpandSidebarButton"],
header[data-testid="stHeader"], [data-testid="stToolbar"], [data-testid="stDecoration"] { display: none !important; }
[data-testid="stMainBlockContainer"] { padding: 0.8rem 2.2rem 1rem 2.2rem !important; max-width: 100% !important; }
[data-testid="stMain"] h1 { font-size: 1.5rem !important; padding: 0 !important; }
[data-testid="stMain"] [data-testid="stMarkdownContainer"] p,
[data-testid="stMain"] [data-testid="stMarkdownContainer"] li { font-size: 1.3rem !important; line-height: 1.4 !important; }
[data-testid="stMain"] [data-testid="stAlertContainer"] [data-testid="stMarkdownContainer"] p {
  font-size: 1.35rem !important; line-height: 1.35 !important; }
[data-testid="stMain"] [data-testid="stWidgetLabel"] p { font-size: 1.3rem !important; }
[data-testid="stMain"] [data-testid="stRadio"] label p { font-size: 1.25rem !important; }
[data-testid="stMain"] button p { font-size: 1.15rem !important; }
[data-testid="stMain"] [data-testid="stCaptionContainer"] p { font-size: 1.05rem !important; }
[data-testid="stMain"] [data-testid="stNumberInput"] input { font-size: 1.25rem !important; }
</style>
"""


def _state_key(key: str) -> str:
    return f"{key}_present"


def from_url(key: str) -> None:
    """Once per page and session: ``?present=on`` turns presenter mode (and guide mode, unless the
    link says ``guide=off``) on."""
    done = f"_{key}_present_url"
    if st.session_state.get(done):
        return
    st.session_state[done] = True
    if st.query_params.get(PARAM, "").lower() in ("1", "on", "true", "yes"):
        st.session_state[_state_key(key)] = True
        if st.query_params.get("guide", "").lower() not in ("0", "off", "false", "no"):
            st.session_state[f"{key}_guide"] = True


def on(key: str) -> bool:
    """Whether the page ``key`` is in presenter mode (reads the URL the first time)."""
    from_url(key)
    return bool(st.session_state.get(_state_key(key)))


def toggle(key: str, guide_key: str) -> bool:
    """The Presenter-mode toggle (beside Guide mode): the guide's slides while the guide is on,
    free play in large type without the sidebar while it is off."""
    from_url(key)
    value = st.toggle("Presenter mode", key=_state_key(key),
                      help="For a projector: large type, no sidebar. With Guide mode on, one figure and its narration "
                           "at a time, ← and → for Previous and Next; with Guide mode off, the player and the figures. "
                           f"`?{PARAM}=on` in the URL opens the guide's slides, `?{PARAM}=on&guide=off` free play.")
    if value:
        style()
    return value


def style() -> None:
    st.markdown(CSS, unsafe_allow_html=True)


def enlarge(fig: go.Figure, height: int = SLIDE_HEIGHT) -> go.Figure:
    """The figure in slide proportions: its height, larger type (a copy; the original is untouched)."""
    fig = go.Figure(fig)
    fig.update_layout(height=height, font=dict(size=SLIDE_FONT), title_font=dict(size=SLIDE_FONT + 4),
                      hoverlabel=dict(font_size=SLIDE_FONT))
    fig.update_xaxes(title_font=dict(size=SLIDE_FONT), tickfont=dict(size=SLIDE_FONT - 2))
    fig.update_yaxes(title_font=dict(size=SLIDE_FONT), tickfont=dict(size=SLIDE_FONT - 2))
    fig.update_annotations(font_size=SLIDE_FONT)
    fig.update_layout(legend_font_size=SLIDE_FONT - 2)
    fig.update_traces(textfont_size=SLIDE_FONT - 1, selector=dict(type="scatter"))
    return fig


def fit(asks_prediction: bool) -> None:
    """Called by the guide for each step: the figure height that keeps this slide on the screen."""
    st.session_state[_HEIGHT_KEY] = PREDICTION_SLIDE_HEIGHT if asks_prediction else SLIDE_HEIGHT


def slide_height(at_most: int | None = None) -> int:
    """The height for this slide's figure (:func:`fit`), at most ``at_most``."""
    height = int(st.session_state.get(_HEIGHT_KEY, SLIDE_HEIGHT))
    return height if at_most is None else min(height, at_most)


def slide(fig: go.Figure, key: str, caption: str | None = None, *, height: int | None = None) -> None:
    """Draw a slide's one figure (and an optional one-line caption under it). ``height``: at most
    this (default: what :func:`fit` allows for the step)."""
    height = slide_height(height)
    show_chart(enlarge(fig, height), f"{key}_slide", config=export.png_config(f"{key}-slide"))
    if caption:
        st.caption(caption)


def side_by_side(figs: list[go.Figure], titles: list[str], title: str, *, heatmaps: bool = True) -> go.Figure:
    """One figure from several: their traces and shapes in columns, each under its own title, so a
    slide still shows one figure. ``heatmaps``: pool grids (rows top-down, no tick labels); else
    charts that keep their axis titles."""
    from plotly.subplots import make_subplots

    out = make_subplots(rows=1, cols=max(1, len(figs)), subplot_titles=titles, horizontal_spacing=0.03 if heatmaps else 0.08)
    for col, fig in enumerate(figs, start=1):
        for trace in fig.data:
            out.add_trace(trace, row=1, col=col)
        for shape in fig.layout.shapes or ():
            out.add_shape(shape, row=1, col=col)
        if heatmaps:
            out.update_xaxes(range=fig.layout.xaxis.range, showgrid=False, zeroline=False, showticklabels=False,
                             row=1, col=col)
            out.update_yaxes(autorange="reversed", showgrid=False, zeroline=False, showticklabels=False, row=1, col=col)
        else:  # keep each chart's axes: titles, ranges, category labels
            for name, update in (("xaxis", out.update_xaxes), ("yaxis", out.update_yaxes)):
                axis = fig.layout[name]
                update(title_text=axis.title.text, range=axis.range, autorange=axis.autorange, tickvals=axis.tickvals,
                       ticktext=axis.ticktext, showgrid=axis.showgrid, zeroline=axis.zeroline, row=1, col=col)
    if figs and figs[0].layout.coloraxis:  # traces that share a colour axis (the pool's cells) keep its scale
        out.update_layout(coloraxis=figs[0].layout.coloraxis)
    out.update_layout(title=dict(text=title, x=0.0), plot_bgcolor="white", showlegend=False,
                      margin=dict(l=10, r=10, t=80, b=10))
    return out
