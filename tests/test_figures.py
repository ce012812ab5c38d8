"""The figures a playing page rebuilds every tick are built as plotly.js reads them, without plotly's
validation (ui/figures.py step_curves, ui/run_events.py event_strip; the pool heatmap's own check is in
test_pool_cells.py): validating a copy must change nothing the browser gets, also after the updates
the pages make to them."""
from __future__ import annotations

import json

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
