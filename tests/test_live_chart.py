"""What a live chart sends (ui/live_chart.py): a whole figure first, then only what changed."""
from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go

from ui import live_chart
from ui.live_chart import figure_json, message

URL = "/component/x/plotly.min.js"


def heat(z, title="t"):
    fig = go.Figure(go.Heatmap(z=np.asarray(z, dtype=np.int8), showscale=False))
    fig.update_layout(title=dict(text=title), height=300)
    return figure_json(fig)


def curve(n, marker=None):
    fig = go.Figure(go.Scatter(x=list(range(n)), y=[i % 7 / 7 for i in range(n)], mode="lines"))
    if marker is not None:
        fig.add_vline(x=marker)
    return figure_json(fig)


def rebuilt(keyframe: dict, msg: dict) -> dict:
    """The figure the browser's script builds from a keyframe and a message (its ``target``)."""
    data = []
    for i, t in enumerate(keyframe["data"]):
        t = {**t, **msg.get("set", {}).get(str(i), {})}
        for attr, e in msg.get("ext", {}).get(str(i), {}).items():
            t[attr] = keyframe["data"][i][attr][: e["from"]] + e["tail"]
        data.append(t)
    return {"data": data, "layout": {**keyframe["layout"], **msg.get("layout", {})}}


def test_first_message_is_the_whole_figure_then_only_the_changed_arrays():
    state = {}
    a, b = heat([[0, 1], [2, 3]], "step 1"), heat([[0, 1], [3, 3]], "step 2")
    first = message(state, a, {}, URL, fresh=False)
    assert first["full"] == a and first["rev"] == 0
    second = message(state, b, {}, URL, fresh=False)
    assert "full" not in second and second["base"] == first["base"] and second["prev"] == 0
    assert set(second["set"]) == {"0"} and set(second["set"]["0"]) == {"z"}  # the heatmap's cells, nothing else
    assert set(second["layout"]) == {"title"}
    assert rebuilt(a, second) == b
    assert len(json.dumps(second)) < len(json.dumps(a))


def test_every_message_stands_on_its_keyframe_alone():
    """A browser that drew only some of the messages (Streamlit draws the newest of a burst) still
    draws the right figure from any one of them."""
    state = {}
    figs = [heat(np.full((4, 4), k % 5), f"step {k}") for k in range(6)]
    msgs = [message(state, f, {}, URL, fresh=False) for f in figs]
    for f, m in zip(figs[1:], msgs[1:]):
        assert rebuilt(figs[0], m) == f


def test_a_grown_curve_sends_its_new_points():
    state = {}
    message(state, curve(10, marker=9), {}, URL, fresh=False)
    m = message(state, curve(11, marker=10), {}, URL, fresh=False)
    assert m["grow"] == {"0": {"x": [10], "y": [10 % 7 / 7]}}  # Plotly.extendTraces appends these
    assert set(m["relayout"]) == {"shapes"}  # the current-step line moved
    assert m["ext"]["0"]["x"] == {"from": 10, "tail": [10]}
    assert rebuilt(curve(10, marker=9), m) == curve(11, marker=10)
    again = message(state, curve(13, marker=12), {}, URL, fresh=False)
    assert again["ext"]["0"]["y"]["from"] == 10 and len(again["ext"]["0"]["y"]["tail"]) == 3
    assert again["grow"]["0"]["x"] == [11, 12]


def test_a_curve_that_changed_otherwise_is_redrawn():
    state = {}
    message(state, curve(10), {}, URL, fresh=False)
    shorter = message(state, curve(5), {}, URL, fresh=False)  # scrubbed back
    assert "grow" not in shorter and set(shorter["set"]["0"]) == {"x", "y"}


def test_a_new_keyframe_when_asked_when_the_traces_change_or_when_the_changes_outgrow_it():
    state = {}
    message(state, heat([[0]]), {}, URL, fresh=False)
    assert "full" in message(state, heat([[1]]), {}, URL, fresh=True)  # a full script run
    assert "full" in message(state, curve(3), {}, URL, fresh=False)  # other traces
    assert "full" not in message(state, curve(4), {}, URL, fresh=False)
    assert "full" in message(state, curve(4 + live_chart.MAX_TAIL + 1), {}, URL, fresh=False)


def test_the_template_is_the_apps_theme_not_plotlys_default():
    fig = heat([[0]])
    assert fig["layout"]["template"] == live_chart.THEME
    assert len(json.dumps(fig["layout"]["template"])) < 2_000


def test_the_same_figure_again_is_the_same_message_and_a_changed_one_is_not():
    """A player holding its frame (the browser still draws it) sends the same figure each tick: the
    same message, revision included, which the browser has drawn and so skips."""
    state = {}
    first = message(state, heat([[0, 1]], "step 1"), {}, URL, fresh=False)
    assert message(state, heat([[0, 1]], "step 1"), {}, URL, fresh=False) is first  # the keyframe, held
    second = message(state, heat([[1, 1]], "step 2"), {}, URL, fresh=False)
    assert second["rev"] == 1 and second["prev"] == 0
    held = message(state, heat([[1, 1]], "step 2"), {}, URL, fresh=False)
    assert held is second and held["rev"] == 1
    assert message(state, heat([[1, 1]], "step 2"), {"displaylogo": False}, URL, fresh=False)["rev"] == 2  # config
    assert "full" in message(state, heat([[1, 1]], "step 2"), {}, URL, fresh=True)  # a full run: a keyframe
    live_chart.forget(state)  # the browser mounted the chart afresh and asked for it
    assert "full" in message(state, heat([[1, 1]], "step 2"), {}, URL, fresh=False)


def plotly_json(fig) -> dict:
    """What plotly's own path makes of ``fig`` (what figure_json gave before its walk), themed."""
    import plotly.io as pio

    out = json.loads(pio.to_json(fig, validate=False))
    out.pop("frames", None)
    out["layout"]["template"] = live_chart.THEME
    return out


def test_figure_json_is_plotlys_own_json_on_every_chart_a_page_plays():
    """figure_json walks the figure itself instead of plotly's encode-decode round trip: the same
    JSON, on the pool heatmaps, the event strip and the curves of a playing page, and on the values
    plotly treats specially (NaN, numpy scalars, big ints, ranges, empty and string arrays)."""
    from ui.figures import step_curves
    from ui.lessons import reserve_or_page as lesson
    from ui.pool_cells import snapshot_heatmap
    from ui.run_events import event_strip

    runs = lesson.guided_runs()
    figs = [snapshot_heatmap(r.at(s), r.request_ids, "pool", grid_block=16)[0] for r in runs for s in (0, 7, 25)]
    figs.append(event_strip(runs, max(r.num_steps for r in runs), 7))
    figs.append(step_curves(range(30), lesson.utilization_series(runs, None), "utilization", "share", current_step=7))
    odd = go.Figure([
        go.Scatter(x=np.arange(5, dtype=np.int64) * 10**10, y=[1.0, float("nan"), np.float32(2.5), float("inf"), None]),
        go.Bar(x=np.array(["a", "b"]), y=np.array([], dtype=np.int64), text=[np.int64(3), np.bool_(True)]),
        go.Heatmap(z=np.arange(6, dtype=np.uint64).reshape(2, 3), customdata=np.zeros((2, 3, 2))),
    ], layout=dict(xaxis=dict(range=np.array([0.5, 4.5])), yaxis=dict(range=[np.float64(-1), np.nan])))
    figs.append(odd)
    for fig in figs:
        assert figure_json(fig) == plotly_json(fig)
    dated = go.Figure(go.Scatter(x=[__import__("datetime").date(2026, 12, 4)], y=[1]))
    assert figure_json(dated) == plotly_json(dated)  # plotly's own path, for a value the walk does not know


def test_a_held_chart_is_sent_again_unbuilt_until_its_time_is_up(monkeypatch):
    """``show_chart(..., hold_s=)``: within ``hold_s`` of the chart's last send it goes out again as
    the same message (the browser draws nothing) and its figure is not built; past it, or in a new
    full run, or once the browser has asked for the whole figure, the figure is built and sent."""
    from types import SimpleNamespace

    mounted, built, clock, run = [], [], [100.0], [object()]
    monkeypatch.setattr(live_chart, "st", SimpleNamespace(session_state={}))
    monkeypatch.setattr(live_chart, "_mount", lambda key, data, **kw: mounted.append(data[0]))
    monkeypatch.setattr(live_chart, "_full_run", lambda: run[0])
    monkeypatch.setattr(live_chart, "plotly_url", lambda: URL)
    monkeypatch.setattr(live_chart.time, "monotonic", lambda: clock[0])

    def show(n, hold_s=1.0):
        def build():
            built.append(n)
            return go.Figure(go.Scatter(x=list(range(n)), y=list(range(n))))
        live_chart.show_chart(build, "k", hold_s=hold_s)
        return mounted[-1]

    first = show(3)
    clock[0] += 0.4
    assert show(4) is first and built == [3]  # held: the same message, nothing built
    clock[0] += 0.7  # 1.1 s since the send
    grown = show(5)
    assert built == [3, 5] and grown["rev"] == first["rev"] + 1
    assert show(6, hold_s=None)["rev"] == grown["rev"] + 1 and built[-1] == 6  # not playing: every step
    clock[0] += 0.1
    run[0] = object()  # a new full run (the page mounted afresh): the whole figure
    fresh = show(7)
    assert built[-1] == 7 and "full" in fresh
    live_chart._forget("_live_chart_k")  # the browser lacks the keyframe
    assert "full" in show(8) and built[-1] == 8
