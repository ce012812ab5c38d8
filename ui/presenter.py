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

Fitting a slide. The guide says how much of the screen its rows take above the figure (the
title row, Previous / Next, the narration, the question and its answer: :func:`fit`), estimated
from their text at the style sheet's sizes (:func:`box_px`, :func:`line_px`, :func:`caption_px`,
measured in Chromium at 1280 x 720); :func:`slide` gives the figure what is left once its caption
has its lines, so that the slide's last line ends :data:`BOTTOM_MARGIN_PX` above the screen's
bottom edge. The estimate is what :data:`BOTTOM_KEY` records, for the tests.
"""
from __future__ import annotations

import re
import textwrap

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

# A slide's rows at 1280 x 720 in the style sheet below, in px, measured in Chromium (the widths in
# characters a little under the measured ones, so that an estimate errs towards one line more).
SCREEN_PX = 720
BOTTOM_MARGIN_PX = 20  # free under the slide's last line
TOP_PX = 101  # the top of the narration: the padding, the title row and Previous / Next above it
GAP_PX = 10  # between two elements (0.6rem, below)
BOX_PAD_PX, BOX_LINE_PX, BOX_CHARS = 18, 29.3, 118  # a narration or answer box: padding, a line, its width
LINE_PX, LINE_CHARS = 29.3, 115  # a line of text (a question) across the page
CAPTION_LINE_PX, CAPTION_CHARS = 27, 155  # a caption's line
CHOICES_PX = 43  # a row of multiple-choice options under their question
NUMBER_INPUT_PX, NUMBER_LABEL_CHARS = 44, 68  # a number question: its input, its label's width (a column)
EXPANDER_PX = 50  # a folded expander (a long why)
MIN_SLIDE_HEIGHT = 200  # a figure is never drawn smaller: a slide with more text must say less
_ROOM_KEY = "_presenter_slide_room"  # px from the figure's top to the last line the screen may show
BOTTOM_KEY = "_presenter_slide_bottom"  # the estimated bottom of the slide's last line, px

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
[data-testid="stMain"] [data-testid="stVerticalBlock"] { gap: 0.6rem !important; }
[data-testid="stMain"] [data-testid="stAlertContainer"] { padding-top: 0.55rem !important; padding-bottom: 0.55rem !important; }
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


def lines(text: str, chars: int) -> int:
    """Lines ``text`` (markdown) takes at ``chars`` characters a line, wrapped at words."""
    plain = re.sub(r"[*`_]{1,2}", "", text or "")
    return sum(max(1, len(textwrap.wrap(part, chars))) for part in plain.split("\n\n")) if plain.strip() else 0


def box_px(text: str) -> int:
    """The height of a narration or answer box (``st.info``, ``st.success``...) holding ``text``."""
    return round(BOX_PAD_PX + BOX_LINE_PX * lines(text, BOX_CHARS))


def line_px(text: str) -> int:
    """The height of a paragraph (or a widget's label) across the page."""
    return round(LINE_PX * lines(text, LINE_CHARS))


def caption_px(text: str | None) -> int:
    return round(CAPTION_LINE_PX * lines(text or "", CAPTION_CHARS))


def fit(asks_prediction: bool = False, *, above_px: int | None = None) -> None:
    """Called by the guide for each step: the figure height that keeps this slide on the screen.
    ``above_px``: where the slide's figure starts (its rows above it, the gap under them included);
    the figure and its caption get the rest of the screen. Without it (free play on a projector)
    the figure is :data:`SLIDE_HEIGHT` or :data:`PREDICTION_SLIDE_HEIGHT` high."""
    st.session_state[_HEIGHT_KEY] = PREDICTION_SLIDE_HEIGHT if asks_prediction else SLIDE_HEIGHT
    st.session_state[_ROOM_KEY] = None if above_px is None else (SCREEN_PX - BOTTOM_MARGIN_PX - above_px, above_px)
    st.session_state.pop(BOTTOM_KEY, None)


def slide_height(at_most: int | None = None, *, caption: str | None = None, caption_lines: int = 0) -> int:
    """The height for this slide's figure (:func:`fit`), at most ``at_most``, leaving room for
    ``caption`` (or ``caption_lines`` lines of one not written yet) under it. Records the slide's
    estimated bottom (:data:`BOTTOM_KEY`)."""
    height = int(st.session_state.get(_HEIGHT_KEY, SLIDE_HEIGHT))
    if at_most is not None:
        height = min(height, at_most)
    fitted = st.session_state.get(_ROOM_KEY)
    if fitted is None:
        return height
    room, above = fitted
    lines_under = max(lines(caption or "", CAPTION_CHARS), caption_lines)
    below = GAP_PX + round(CAPTION_LINE_PX * lines_under) if lines_under else 0
    height = max(MIN_SLIDE_HEIGHT, min(height, room - below))
    st.session_state[BOTTOM_KEY] = above + height + below
    return height


def slide(fig: go.Figure, key: str, caption: str | None = None, *, height: int | None = None) -> None:
    """Draw a slide's one figure (and an optional caption under it). ``height``: at most this
    (default: what :func:`fit` allows for the step, less the caption's lines)."""
    height = slide_height(height, caption=caption)
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
