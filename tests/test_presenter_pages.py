"""Presenter mode on every lesson (issue 21), Real traffic included: ``?present=on`` opens the
guide as slides (large type, no sidebar, one figure and its narration, Previous / Next on the
arrow keys) on each page in pages_registry's lesson list; ``?present=on&guide=off`` is free play on
a projector. The Real traffic page is a lesson like the others, and its four pools share one grid.

The lessons on the real model (Live engine, Prefix sharing, Under pressure) run SmolLM2 and are
marked slow; their runs are cached per process."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from tests.apptest import figure, open_page
from ui.pages_registry import lessons
from ui.presenter import (BOTTOM_KEY, BOTTOM_MARGIN_PX, MIN_SLIDE_HEIGHT, NEXT_KEY, PREDICTION_SLIDE_HEIGHT,
                          PREVIOUS_KEY, SCREEN_PX, SLIDE_HEIGHT)

REAL_MODEL = {"live-engine", "prefix-sharing", "under-pressure"}


def lesson_key(page) -> str:
    """The lesson's state key: ``KEY`` of ui/lessons/<the page script's name>.py."""
    return importlib.import_module(f"ui.lessons.{Path(page.path).stem}").KEY


def charts(at) -> list:
    return list(at.get("plotly_chart"))


def prediction_widget(at):
    """The slide's open question (a radio or a number input), or None."""
    return next((w for w in list(at.radio) + list(at.number_input) if (w.label or "").startswith("Predict:")), None)


def answer(at, widget) -> None:
    widget.set_value(widget.options[0] if hasattr(widget, "options") else 5).run()


def assert_on_the_screen(at, slide) -> None:
    """The slide's estimated last line (its rows, figure and caption at the style sheet's sizes,
    :mod:`ui.presenter`) ends at least BOTTOM_MARGIN_PX above a 720 px screen's bottom edge, with
    its figure at full size or shrunk to fit, never below MIN_SLIDE_HEIGHT (checked against the real
    layout in Chromium by test_slide_fit_browser.py)."""
    bottom = at.session_state[BOTTOM_KEY] if BOTTOM_KEY in at.session_state else None
    shown = charts(at)
    if bottom is None:  # a slide without a figure (the calculator's numbers)
        assert not shown, slide
        return
    assert bottom <= SCREEN_PX - BOTTOM_MARGIN_PX, (slide, bottom)
    for c in shown:
        assert json.loads(c.proto.spec)["layout"]["height"] >= MIN_SLIDE_HEIGHT, (slide, c.proto.id)


def slide_style(at) -> bool:
    """The presenter style sheet: the sidebar hidden, the narration in large type."""
    return any("stSidebar" in m.value and "1.35rem" in m.value for m in at.markdown)


PAGES = [pytest.param(p, id=p.url_path, marks=[pytest.mark.slow] if p.url_path in REAL_MODEL else [])
         for p in lessons()]


def test_every_lesson_is_in_the_list():
    assert {"reserve-or-page", "live-engine", "prefix-sharing", "under-pressure", "block-size", "ops",
            "baselines"} <= {p.url_path for p in lessons()}


@pytest.mark.parametrize("page", PAGES)
def test_presenter_mode_on_every_lesson(page):
    """Every slide of the guide: the narration, at most one figure (at least one slide has one, in
    slide type), Previous / Next with the arrow keys, the style sheet that hides the sidebar."""
    key = lesson_key(page)
    at = open_page(page.path, present="on")
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.session_state[f"{key}_present"] and at.session_state[f"{key}_guide"]
    figures_seen = 0
    slides = 0
    while True:
        slides += 1
        assert not at.exception, (slides, at.exception)
        assert slide_style(at), f"slide {slides}: no presenter style sheet"
        # a slide has no sidebar: nothing on it offers to set the sidebar (it would only push the slide down)
        assert not [b for b in at.button if "sidebar" in (b.label or "")], (slides, [b.label for b in at.button])
        assert at.info and at.info[0].value, f"slide {slides}: no narration"
        assert any(m.value.startswith(f"**Part {slides} of ") for m in at.markdown), f"slide {slides}: no part header"
        shown = charts(at)
        assert len(shown) <= 1, (slides, [c.proto.id for c in shown])  # one figure a slide
        for c in shown:
            spec = json.loads(c.proto.spec)
            if all(t["type"] in ("heatmap", "scattergl") for t in spec["data"]) and "font" not in spec["layout"]:
                assert spec["layout"]["height"] >= MIN_SLIDE_HEIGHT, (slides, c.proto.id)  # a pool, at slide height
            else:
                assert spec["layout"]["font"]["size"] >= 16, (slides, c.proto.id)  # slide type
            figures_seen += 1
        assert_on_the_screen(at, slides)
        question = prediction_widget(at)
        if question is not None:  # the answer and its why take room too: the slide still fits
            answer(at, question)
            assert not at.exception, (slides, at.exception)
            assert prediction_widget(at) is None
            assert_on_the_screen(at, f"{slides}, answered")
        nxt, prev = at.button(key=f"{key}_guide_next"), at.button(key=f"{key}_guide_prev")
        assert nxt.proto.shortcut.lower() == NEXT_KEY.lower() and prev.proto.shortcut.lower() == PREVIOUS_KEY.lower()
        assert prev.disabled == (slides == 1)
        if nxt.disabled:
            break
        nxt.click().run()
    assert slides >= 5 and figures_seen >= slides // 2, (slides, figures_seen)
    at.button(key=f"{key}_guide_prev").click().run()  # Previous goes back one slide
    assert not at.exception
    assert any(m.value.startswith(f"**Part {slides - 1} of ") for m in at.markdown)


def test_real_traffic_slides_show_the_four_pools_on_one_grid():
    at = open_page("pages/baselines.py", present="on")
    spec = figure(at, "base_slide")
    heat = [t for t in spec["data"] if t["type"] == "heatmap"]
    assert {t.get("xaxis", "x") for t in heat} == {"x", "x2", "x3", "x4"}  # four pools, one figure
    ranges = {json.dumps(spec["layout"][f"xaxis{i or ''}"]["range"]) for i in ("", 2, 3, 4)}
    assert len(ranges) == 1, ranges  # the same cells per row on all four
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert [t.split(":")[0] for t in titles] == ["Orca Max", "Orca Pow2", "Orca Oracle", "vLLM (paged)"]


def test_real_traffic_guide_asks_both_predictions_before_it_shows_the_breakdown():
    at = open_page("pages/baselines.py", guide="on")
    asked = []
    while True:
        widgets = [w for w in list(at.radio) if w.label.startswith("Predict:")]
        for w in widgets:
            assert not any("base_guide_figure" in c.proto.id for c in charts(at))  # not before the answer
            asked.append(w.key)
            w.set_value(w.options[0]).run()
            assert not at.exception, at.exception
            assert any("base_guide_figure" in c.proto.id for c in charts(at))  # the reveal: the measured chart
            assert [e for e in list(at.success) + list(at.warning) if "Measured in this run" in e.value]
        nxt = at.button(key="base_guide_next")
        if nxt.disabled:
            break
        nxt.click().run()
    assert asked == ["predict_base_base_worst", "predict_base_base_paged_share"]
    assert any(b.proto.label.startswith("Download the run as an animated HTML file") for b in at.get("download_button"))


@pytest.mark.parametrize("query", [{}, {"pool_slots": "65536"}])
def test_real_traffic_pools_share_one_grid(query):
    """Same cells per row, same cell size, same level of detail on all four pools, also when a
    large pool is drawn in groups of blocks (the contiguous pools have blocks of one slot)."""
    at = open_page("pages/baselines.py", **query)
    assert not at.exception and not at.error, [e.value for e in at.error]
    specs = [figure(at, f"base_heat_{a}") for a in ("contiguous", "contiguous-pow2", "contiguous-oracle", "paged")]
    assert len({json.dumps(s["layout"]["xaxis"]["range"]) for s in specs}) == 1
    grids = [s["layout"]["xaxis"]["title"]["text"].split(" (")[0] for s in specs]  # paged adds "(1 block)"
    assert len(set(grids)) == 1, grids
    assert len({json.dumps(s["layout"]["yaxis"]["ticktext"]) for s in specs}) == 1
    assert len({s["layout"]["height"] for s in specs}) == 1
    if query:
        assert "cells a row; a cell = " in specs[0]["layout"]["xaxis"]["title"]["text"]


def test_real_traffic_says_which_sidebar_settings_apply():
    at = open_page("pages/baselines.py")
    note = next(m.value for m in at.markdown if m.value.startswith("**Sidebar settings on this page.**"))
    assert "Applied: block size" in note and "Not applied: *Contiguous policy*" in note and "*Token source*" in note


def test_free_play_in_presenter_mode():
    """``?present=on&guide=off``: the player and both pools in one large figure, without the sidebar."""
    at = open_page("pages/reserve_or_page.py", present="on", guide="off")
    assert not at.exception, at.exception
    assert at.session_state["rop_present"] and not at.session_state["rop_guide"]
    assert slide_style(at)
    ids = [c.proto.id for c in charts(at)]
    assert any("rop_slide" in i for i in ids) and not any("rop_heat_" in i for i in ids), ids
    assert at.button(key="rop_play")  # the player is there
    spec = figure(at, "rop_slide")
    assert {t.get("xaxis", "x") for t in spec["data"] if t["type"] == "heatmap"} == {"x", "x2"}
    at.button(key="rop_fwd").click().run()
    assert not at.exception and "step 1" in figure(at, "rop_slide")["layout"]["title"]["text"]


def test_a_slide_that_asks_draws_a_shorter_figure():
    """The question and the revealed answer take room: the slide's figure shrinks so that the
    slide, caption included, still ends above the bottom of a 1280 x 720 screen (issue 21: slide
    5's caption touched the bottom edge; checked in Chromium by test_slide_fit_browser.py)."""
    at = open_page("pages/reserve_or_page.py", present="on")  # slide 1 asks
    asked = figure(at, "rop_slide")["layout"]["height"]
    assert MIN_SLIDE_HEIGHT <= asked <= PREDICTION_SLIDE_HEIGHT
    answer(at, prediction_widget(at))
    answered = figure(at, "rop_slide")["layout"]["height"]
    assert MIN_SLIDE_HEIGHT <= answered < asked  # the answer box took its room from the figure
    assert at.session_state[BOTTOM_KEY] <= SCREEN_PX - BOTTOM_MARGIN_PX
    for _ in range(4):
        at.button(key="rop_guide_next").click().run()  # slide 5, external fragmentation: a long caption
    assert any(m.value.startswith("**Part 5 of ") for m in at.markdown)
    assert any("are external fragmentation" in c.value for c in at.caption)  # why the head of the queue waits
    assert MIN_SLIDE_HEIGHT <= figure(at, "rop_slide")["layout"]["height"] <= SLIDE_HEIGHT
    assert at.session_state[BOTTOM_KEY] <= SCREEN_PX - BOTTOM_MARGIN_PX


@pytest.mark.parametrize("page", PAGES)
def test_free_play_in_presenter_mode_on_every_lesson(page):
    """``?present=on&guide=off`` on every lesson: the page's free play, in slide type, without the
    sidebar and without an error."""
    key = lesson_key(page)
    at = open_page(page.path, present="on", guide="off")
    assert not at.exception, at.exception
    assert at.session_state[f"{key}_present"] and not at.session_state[f"{key}_guide"]
    assert slide_style(at)
