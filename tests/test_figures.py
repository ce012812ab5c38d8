"""The figures a playing page rebuilds every tick are built as plotly.js reads them, without plotly's
validation (ui/figures.py step_curves, ui/run_events.py event_strip, ui/lesson_figures.py status_timeline,
lines, block_tables_grid and the bars; the pool heatmap's own check is in test_pool_cells.py):
validating a copy must change nothing the browser gets, also after the updates the pages make to them."""
from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from ui.figures import step_curves
from ui.lessons import reserve_or_page as lesson
from ui.run_events import event_strip


def sent(fig) -> dict:
    out = json.loads(fig.to_json())
    out["layout"].pop("template", None)
    return out


def assert_as_validated(fig) -> None:
    assert sent(fig) == sent(go.Figure(fig.to_dict()))  # go.Figure(dict) validates every key and value


@pytest.fixture(scope="module")
def runs():
    return lesson.guided_runs()


@pytest.mark.parametrize("kw", [{}, {"current_step": 5}, {"percent": False, "current_step": 0, "height": 200}])
def test_step_curves_is_what_validation_makes_of_it(runs, kw):
    n = max(r.num_steps for r in runs)
    figs = [step_curves(range(n), lesson.utilization_series(runs, 7), "Token utilization", "share", **kw),
            step_curves(range(3), {"paged": [1, None, 2], "no colour of its own": [0.5, 0.5, 0.1]}, "t", "y", **kw)]
    for fig in figs:
        assert_as_validated(fig)
        fig.update_xaxes(range=[0, n - 1])  # what the pages do to it
        fig.update_yaxes(tickformat=",d")
        fig.data[0].line.color = "#123456"
        assert_as_validated(fig)
    assert [t.name for t in figs[0].data] == list(lesson.utilization_series(runs, 7))
    assert figs[0].layout.yaxis.tickformat == ",d" and figs[0].layout.xaxis.range == (0, n - 1)


@pytest.mark.parametrize("current", [None, 0, 9])
def test_event_strip_is_what_validation_makes_of_it(runs, current):
    n = max(r.num_steps for r in runs)
    for shown in (runs, runs[:1], []):
        fig = event_strip(shown, n, current)
        assert_as_validated(fig)
        assert len(fig.layout.shapes) == (current is not None)
        assert bool(fig.layout.annotations) == (not shown)  # "no admissions ... yet"


def test_a_growing_runs_strip_spans_whole_chunks_of_steps(runs):
    """A recorded run's strip spans its steps; while a run still steps (live), the axis grows 32
    steps at a time, so that most frames keep the axis of the frame before."""
    from types import SimpleNamespace

    from ui.run_events import STRIP_CHUNK, strip_extent

    n = max(r.num_steps for r in runs)
    assert strip_extent(runs, n) == n and strip_extent([], 5) == 5
    live = SimpleNamespace(engine=object(), done=False)
    assert [strip_extent([*runs, live], k) for k in (0, 1, 32, 33, 64, 65)] == [32, 32, 32, 64, 64, 96]
    assert strip_extent([*runs, SimpleNamespace(engine=object(), done=True)], 33) == 33
    assert STRIP_CHUNK == 32
    fig = event_strip(runs, 33, 20, strip_extent([*runs, live], 33))
    assert_as_validated(fig)
    assert fig.layout.xaxis.range == (-0.5, 63.5)
    assert event_strip(runs, 33, 20).layout.xaxis.range == (-0.5, 32.5)


@pytest.mark.parametrize("kw", [{}, {"upto": 12}, {"current_step": 30, "upto": 30, "preemptions": "all"}])
def test_status_timeline_is_what_validation_makes_of_it(runs, kw):
    from ui.lesson_figures import status_timeline

    run = runs[0]  # the contiguous side: requests wait, run and finish
    if kw.get("preemptions") == "all":
        kw = {**kw, "preemptions": [(3, run.request_ids[0]), (9, run.request_ids[2])]}
    fig = status_timeline(run, list(run.request_ids), "each request's state", **kw)
    assert_as_validated(fig)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z.shape == (len(run.request_ids), run.num_steps)
    if "upto" in kw:
        assert np.isnan(z[:, kw["upto"] + 1:]).all()  # nothing drawn past the step shown


@pytest.mark.parametrize("kw", [
    {}, {"percent": True, "current_x": 4, "markers": False, "height": 260},
    {"colors": {"a": "#111111"}, "dash": {"b": "dash"}, "hline": (2.5, "the reserve"), "current_x": 2, "log_x": True,
     "point_labels": {"a": lambda v: f"{v:.0f}"}},
    {"log_x": True, "x_ticks": [1, 4], "hline": (1, "one")},
])
def test_lines_is_what_validation_makes_of_it(kw):
    from ui.lesson_figures import lines

    for series in ({"a": [1, 2, 3]}, {"a": [1, 2, 3], "b": [3, None, 1]}):
        fig = lines([1, 2, 4], series, "title", "x", "y", **kw)
        assert_as_validated(fig)
        fig.update_yaxes(range=[0, 4])  # what the block-size lesson does to it
        assert_as_validated(fig)
        assert len(fig.layout.shapes) == ("hline" in kw) + ("current_x" in kw)


def test_free_blocks_follow_each_steps_snapshot(runs):
    """The pressure lesson's free blocks come from the recorded usage, as from each step's snapshot."""
    from ui.lessons.pressure_figures import free_figure

    run = runs[1]
    want = [s.num_blocks - round(s.metrics.kv_usage * s.num_blocks) for s in map(run.at, range(run.num_steps))]
    fig = free_figure(run, "swap", 5, 2)
    assert list(fig.data[0].y) == want
    assert_as_validated(fig)


def test_a_slide_enlarges_them_as_it_enlarges_validated_ones(runs):
    """presenter.enlarge restyles with plotly's shorthand (title_font, legend_font_size): the same on
    these figures as on validated copies of them."""
    from ui import presenter
    from ui.lesson_figures import lines
    from ui.pool_cells import snapshot_heatmap

    n = max(r.num_steps for r in runs)
    for fig in (step_curves(range(n), lesson.utilization_series(runs, None), "t", "y", current_step=4),
                event_strip(runs, n, 3), lines([1, 2, 4], {"a": [1, 2, 3], "b": [1, 1, 1]}, "T", "x", "y", hline=(2, "h")),
                snapshot_heatmap(runs[1].at(9), runs[1].request_ids, "pool")[0]):
        slide = presenter.enlarge(fig)
        assert sent(slide) == sent(presenter.enlarge(go.Figure(fig.to_dict())))
        assert slide.layout.title.font.size == presenter.SLIDE_FONT + 4


@pytest.mark.parametrize("width", [0, 5, 30, 100])  # none, ids and a tick per block, ids and every 4th, hover only
def test_block_tables_grid_is_what_validation_makes_of_it(width):
    from ui.lesson_figures import block_tables_grid

    rng = np.random.default_rng(width)
    ref, fill = rng.integers(1, 8, 500), rng.integers(0, 17, 500)
    rows = [(f"seq {i}", rng.integers(0, 500, width).tolist()) for i in range(4)] if width else []
    fig = block_tables_grid(rows, ref, fill, 16, "block tables", hover_extra=lambda b: f"block {b}'s tokens")
    assert_as_validated(fig)
    if width:
        assert fig.data[0].text[2][3] == str(rows[2][1][3])  # the physical block id in its cell
        assert (fig.data[0].texttemplate is not None) == (width <= 64)


def test_bars_are_what_validation_makes_of_them():
    from ui.lesson_figures import split_bars, value_bars

    for fig in (split_bars(["r0: 10 computed", "r1: 0 computed"], {"computed": [10, 0], "skipped": [0, 640]},
                           {"computed": "#1d4ed8"}, "prompt tokens", "tokens"),
                value_bars(["r0", "r1"], [1.5, 0.25], "time to first token", "seconds", lambda v: f"{v:.2f} s"),
                value_bars(["a", "b"], [0, 0], "nothing yet", "ms", str, colors=["#111111", "#222222"]),
                value_bars([], [], "empty", "ms", str)):
        assert_as_validated(fig)
