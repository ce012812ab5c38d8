"""Engagement features of the lessons (issue 15): predict then reveal, the player's speed and
"Next event", presenter mode, the HTML export and the honest swap-versus-recompute costs.

The scripted lessons (reserve or page, block size, ops) run under AppTest; the real-model lessons'
predictions are checked on their scenarios driven by the scripted token source (the slow tests in
test_teaching_pages.py answer them on the real pages)."""
import json
import re
import subprocess
import sys
import time
from html.parser import HTMLParser

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import APPEND, COW, FINISH
from pagedkv_core.sizing.kv_math import KVShape
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.workloads.scenarios import build_workload
from tests.apptest import figure, open_page, plotly_array
from tests.test_teaching_pages import CharTokenizer
from ui import costs, export, guide, player, predict, run_events
from ui.pool_cells import cell_codes, pool_cells
from ui.runs.scripted import play_scripted

SMOLLM2_PARAMS = 134_515_008  # SmolLM2-135M-Instruct, counted from the loaded model
SMOLLM2 = KVShape("SmolLM2-135M", 30, 3, 64, 9)


def make_scripted(config, recording=None):
    return Engine(config, ScriptedSource(), recording=recording)


def explainer_pair():
    return [play_scripted(EngineConfig(allocator=a, pool_slots=2048, block_size=16), build_workload("explainer40", seed=0), a)
            for a in ("contiguous", "paged")]


def prediction_widgets(at):
    return [w for w in list(at.radio) + list(at.number_input) if w.label.startswith("Predict:")]


def reveals(at) -> list[str]:
    return [e.value for e in list(at.success) + list(at.warning) if "Measured" in e.value or "Computed" in e.value]


# ---------------------------------------------------------------------------- predictions
def test_prediction_rules():
    p = predict.Prediction("k", "Predict: how many?", 3, "Because.", tolerance=1, unit="requests")
    assert p.grade(4) and p.grade(2.0) and not p.grade(5)
    assert p.answer_text() == "3 requests"
    c = predict.Prediction("c", "Predict: which?", "b", "Why.", options=("a", "b"))
    assert c.grade("b") and not c.grade("a")
    with pytest.raises(ValueError, match="Predict:"):
        predict.Prediction("x", "How many?", 3, "")
    with pytest.raises(ValueError, match="not one of the options"):
        predict.Prediction("x", "Predict: which?", "z", "", options=("a", "b"))
    ranges = [("low", 0.25), ("mid", 0.75), ("high", float("inf"))]
    assert predict.range_options(0.1, ranges)["answer"] == "low"
    assert predict.range_options(0.75, ranges)["answer"] == "high"


# (page, guide key, the first prediction's widget key, an answer to give, the measured answer)
def _contiguous_running_at_step_0() -> int:
    return explainer_pair()[0].at(0).metrics.num_running


@pytest.mark.parametrize("page, key", [("pages/reserve_or_page.py", "rop"), ("pages/block_size.py", "bsize"),
                                       ("pages/ops.py", "ops")])
def test_scripted_lesson_guides_ask_and_reveal(page, key):
    """Each guide asks at least two questions; answering one reveals the measured answer, replaces
    the widget by the answer given (it stands) and counts in the session's score."""
    at = open_page(page)
    at.toggle(key=f"{key}_guide").set_value(True).run()
    asked = []
    while True:
        for w in prediction_widgets(at):
            asked.append(w.key)
            assert not reveals(at)
            if len(asked) == 1:  # answer the first one
                w.set_value(w.options[0] if hasattr(w, "options") else 1).run()
                assert not at.exception, at.exception
                shown = reveals(at)
                assert len(shown) == 1 and ("Measured in this run" in shown[0] or "Computed" in shown[0]), shown
                assert w.key not in [x.key for x in prediction_widgets(at)]  # the first answer stands
                assert any("You said" in m.value for m in at.markdown)
                assert any("predictions right this session" in m.value and "of 1" in m.value for m in at.markdown)
        nxt = at.button(key=f"{key}_guide_next")
        if nxt.disabled:
            break
        nxt.click().run()
        assert not at.exception, at.exception
    assert len(asked) >= 2, asked


def test_reserve_or_page_reveal_is_the_engine_measurement():
    want = _contiguous_running_at_step_0()
    at = open_page("pages/reserve_or_page.py")
    at.toggle(key="rop_guide").set_value(True).run()
    # the situation: the pools before step 0, nothing admitted yet
    assert "before step 0" in figure(at, "rop_heat_contiguous")["layout"]["title"]["text"]
    at.number_input(key="predict_rop_rop_contiguous_running").set_value(want).run()
    assert f"**Right.** Measured in this run: **{want} requests**" in reveals(at)[0]
    # the reveal moves the figures to the step that answers it
    assert "at step 0" in figure(at, "rop_heat_contiguous")["layout"]["title"]["text"]
    assert at.session_state["_predictions"]["predict_rop_rop_contiguous_running"] == (want, True)


def test_real_model_lesson_predictions_are_read_off_their_runs():
    """The live engine, prefix sharing and under pressure guides (real model on the pages) ask at
    least two questions each, and every answer is the run's own fact (scripted token source here)."""
    from ui.lessons import live_engine, prefix_sharing, under_pressure

    tok = CharTokenizer()
    live = live_engine.guide_run(make_scripted, tok, live_engine.GUIDE_CONFIG)
    asked = {p.key: p for p in guide.predictions(live_engine.guide_steps(live))}
    assert len(asked) >= 2
    first_append = live.events(APPEND)[0]
    assert asked["live_new_block"].answer == first_append[0]
    fin_step, fin = live.events(FINISH)[0]
    before, after = live.at(fin_step - 1), live.at(fin_step)
    i = next(k for k in range(len(before.seq_id)) if live.request_ids[int(before.seq_request[k])] == fin.request_id)
    table = before.block_table(int(before.seq_id[i]))
    assert asked["live_cached_blocks"].answer == sum(int(before.block_fill[b]) == live.config.block_size for b in table)
    assert asked["live_cached_blocks"].answer == sum(int(after.block_state[b]) == 3 for b in table)  # CACHED

    rec = prefix_sharing.prefix_sharing_run(make_scripted, tok, EngineConfig(block_size=16, pool_slots=16384))
    asked = {p.key: p for p in guide.predictions(prefix_sharing.guide_steps(rec))}
    assert len(asked) >= 2
    assert asked["prefix_b_computed"].answer == rec.prefill_tokens("B")[0]
    cow_step = rec.events(COW)[0][0]
    assert asked["prefix_cow_copies"].answer == sum(1 for s, _ in rec.events(COW) if s == cow_step) == rec.requests["C"].n - 1

    cfg = {m: EngineConfig(block_size=16, pool_slots=384, preemption=m, watermark=0.1) for m in ("swap", "recompute")}
    recs = under_pressure.pressure_pair(make_scripted, tok, cfg["swap"], cfg["recompute"])
    model = costs.CostModel(2 * 8 * SMOLLM2.bytes_per_block(16, "float32"), recs["recompute"].recomputed_tokens(),
                            costs.flops_per_token(SMOLLM2_PARAMS), costs.Rates(5e9, 5e10, 5, 2))
    view = under_pressure.PressureView(recs, str, model)
    asked = {p.key: p for p in guide.predictions(view.guide_steps())}
    assert len(asked) >= 2
    first = recs["swap"].preemptions()[0]
    assert asked["pressure_victim"].answer == first["victim"] == first["running_before"][-1]
    assert asked["pressure_cheaper"].answer.startswith(model.winner)


# ---------------------------------------------------------------------------- the player
def test_steps_per_tick_follows_the_wall_clock():
    assert player.steps_per_tick(1, 1.0) == 1
    assert player.steps_per_tick(50, 0.0) == 50 * player.MIN_INTERVAL_S  # a tick at least one interval
    assert player.steps_per_tick(50, 0.5) == 25  # drawing took 0.5 s: skip the frames it had no time for
    assert player.steps_per_tick(50, 30.0) == 50 * player.MAX_CATCH_UP_S  # a stalled tab does not leap
    assert player.tick_interval(50) == player.MIN_INTERVAL_S and player.tick_interval(2) == 0.5


def test_speed_control_advances_more_than_one_step_per_tick():
    at = open_page("pages/reserve_or_page.py")
    at.select_slider(key="rop_speed").set_value(50).run()
    at.button(key="rop_play").click().run()
    assert not at.exception
    before = at.slider(key="rop_step").value
    at.run()  # one tick of the fragment's timer
    after = at.slider(key="rop_step").value
    assert after - before >= 50 * player.MIN_INTERVAL_S > 1, (before, after)
    at.button(key="rop_play").click().run()  # pause: the step stays
    paused = at.slider(key="rop_step").value
    at.run()
    assert at.slider(key="rop_step").value == paused


@pytest.mark.parametrize("kind", ["preemption", "finish", "admission"])
def test_next_event_lands_on_a_step_with_that_kind(kind):
    runs = explainer_pair()
    kinds = run_events.EVENT_GROUPS[run_events.group_of(kind)]
    at = open_page("pages/reserve_or_page.py")
    at.selectbox(key="rop_event_kind").set_value(kind).run()
    seen = [0]
    for _ in range(3):
        at.button(key="rop_next_event").click().run()
        assert not at.exception
        step = at.slider(key="rop_step").value
        assert any(e.kind in kinds for r in runs for e in r.at(step).events), (kind, step)
        # nothing of that kind was skipped on the way
        assert not any(e.kind in kinds for r in runs for s in range(seen[-1] + 1, step) for e in r.at(s).events)
        seen.append(step)
        assert f"at step {step}" in figure(at, "rop_heat_paged")["layout"]["title"]["text"]
    assert seen == sorted(set(seen))
    strip = figure(at, "rop_events")
    rows = {y for t in strip["data"] for y in t["y"]}
    assert {"admission", "finish", "preemption"} <= rows


def test_event_index_grows_with_a_live_run():
    from ui.runs.model import Run
    run = Run("paged", EngineConfig())
    engine = Engine(EngineConfig(), ScriptedSource(), recording=run.recording)
    build_workload("burst", seed=0).submit(engine)
    for _ in range(5):
        engine.step(snapshot=False)
    first = list(run_events.index(run).steps["admission"])
    for _ in range(40):
        engine.step(snapshot=False)
    grown = run_events.index(run).steps["admission"]
    assert grown[: len(first)] == first and len(grown) > len(first)
    assert grown == [s for s in range(run.num_steps) if any(e.kind == "admit" for e in run.at(s).events)]


# ---------------------------------------------------------------------------- presenter mode
@pytest.mark.parametrize("page, key", [("pages/reserve_or_page.py", "rop"), ("pages/ops.py", "ops"),
                                       ("pages/block_size.py", "bsize")])
def test_presenter_mode_renders_one_figure_and_the_narration(page, key):
    at = open_page(page, present="on")
    assert not at.exception, at.exception
    assert at.session_state[f"{key}_present"] and at.session_state[f"{key}_guide"]
    assert at.info and at.info[0].value  # the narration
    assert len(at.get("plotly_chart")) <= 1  # one figure (the calculator's slides are numbers)
    assert any("stSidebar" in m.value for m in at.markdown)  # the style sheet that hides the sidebar
    nxt, prev = at.button(key=f"{key}_guide_next"), at.button(key=f"{key}_guide_prev")
    assert nxt.proto.shortcut and prev.proto.shortcut  # the arrow keys
    for _ in range(3):
        nxt.click().run()
        assert not at.exception, at.exception
        assert len(at.get("plotly_chart")) <= 1
    at.toggle(key=f"{key}_present").set_value(False).run()
    assert not at.exception and len(at.get("plotly_chart")) > 1  # the full guide again


def test_rop_presenter_slide_is_both_pools_in_one_figure():
    at = open_page("pages/reserve_or_page.py", present="on")
    spec = figure(at, "rop_slide")
    axes = {t.get("xaxis", "x") for t in spec["data"] if t["type"] == "heatmap"}
    assert axes == {"x", "x2"}  # a pool on each side of one figure
    assert spec["layout"]["font"]["size"] >= 16


# ---------------------------------------------------------------------------- export
class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.scripts_src, self.problems = [], [], []

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.scripts_src += [v for k, v in attrs if k == "src"]
        if tag not in ("meta", "br", "link"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(tag)
        else:
            self.stack.pop()


def test_html_export_is_one_valid_offline_file_with_the_frames():
    runs = explainer_pair()
    text = export.animation_html(runs, "Reserve or page")
    assert text.startswith("<!DOCTYPE html>")
    tags = _Tags()
    tags.feed(text)
    assert not tags.problems and not tags.stack, (tags.problems, tags.stack)
    assert tags.scripts_src == []  # plotly.js is inline: it plays offline
    assert len(text) < 8_000_000
    start = text.index("Plotly.addFrames('pagedkv-animation', ") + len("Plotly.addFrames('pagedkv-animation', ")
    frames = json.JSONDecoder().raw_decode(text[start:])[0]
    n = max(r.num_steps for r in runs)
    steps = [int(f["name"]) for f in frames]
    assert len(frames) == export.MAX_FRAMES < n  # explainer40's contiguous side has 1,756 steps: sampled
    assert steps[0] == 0 and steps[-1] == n - 1 and steps == sorted(set(steps))
    for f in (frames[0], frames[57], frames[-1]):  # each frame holds both pools, as the pages colour them
        step = int(f["name"])
        for trace, run in zip(f["data"], runs):
            snap = run.at(step)
            z = plotly_array(trace["z"]).reshape(-1)
            want = cell_codes(pool_cells(snap.slot_state, snap.slot_owner, snap.block_size))
            assert np.array_equal(z[: len(want)], want)
    assert re.search(r'"label":\s*"(\\u25b6|▶) Play"', text) and '"sliders"' in text


def test_html_export_of_a_large_pool_stays_bounded():
    cfg = EngineConfig(pool_slots=1 << 18, block_size=16)
    run = play_scripted(cfg, build_workload("burst", seed=0), "paged")
    fig, info = export.animation_figure([run], "big")
    grid = plotly_array(fig.data[0].z)
    cells = grid.size
    assert export.frame_cells(run.at(0)).num_cells <= export.MAX_CELLS < run.at(0).num_slots
    assert cells < export.MAX_CELLS + grid.shape[1] and info["slots_per_cell"][0] > 1  # whole rows
    assert len(fig.frames) * cells <= export.MAX_VALUES


def test_pages_offer_the_export_and_png_toolbars():
    at = open_page("pages/reserve_or_page.py")
    assert any(b.proto.label.startswith("Download the run as an animated HTML file") for b in at.get("download_button"))
    for chart in at.get("plotly_chart"):
        config = json.loads(chart.proto.config)
        assert config["toImageButtonOptions"]["format"] == "png", chart.proto.id


# ---------------------------------------------------------------------------- honest costs
def _busy_loop():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_swap_versus_recompute_verdict_does_not_flip_under_load():
    """The page's cost measurement (rates measured alternately, medians) on the spike's real work
    (SmolLM2's bytes per block and parameter count), once on a quiet machine and once with a busy
    loop on the other core: the same verdict."""
    from ui.lessons import under_pressure

    tok = CharTokenizer()
    cfg = {m: EngineConfig(block_size=16, pool_slots=256, preemption=m, watermark=0.1) for m in ("swap", "recompute")}
    recs = under_pressure.pressure_pair(make_scripted, tok, cfg["swap"], cfg["recompute"])
    blocks = sum(p["blocks"] for p in recs["swap"].preemptions())
    work = (2 * blocks * SMOLLM2.bytes_per_block(16, "float32"), recs["recompute"].recomputed_tokens())
    assert work[0] > 0 and work[1] > 0
    fpt = costs.flops_per_token(SMOLLM2_PARAMS)
    quiet = costs.CostModel(*work, fpt, costs.measure_rates())
    busy = _busy_loop()
    try:
        time.sleep(0.3)
        loaded = costs.CostModel(*work, fpt, costs.measure_rates())
    finally:
        busy.kill()
        busy.wait()
    assert quiet.winner == loaded.winner
    assert quiet.factor > 3 and loaded.factor > 3  # far from a tie: load cannot tip it


def test_interleaved_runs_match_runs_alone():
    from ui.lessons import under_pressure

    tok = CharTokenizer()
    cfg = {m: EngineConfig(block_size=16, pool_slots=384, preemption=m, watermark=0.1) for m in ("swap", "recompute")}
    pair = under_pressure.pressure_pair(make_scripted, tok, cfg["swap"], cfg["recompute"])
    for m in ("swap", "recompute"):
        alone = under_pressure.pressure_run(make_scripted, tok, cfg[m])
        assert pair[m].num_steps == alone.num_steps == len(pair[m].wall_s)
        assert all(pair[m].output_ids(r) == alone.output_ids(r) for r in alone.requests)
        assert [p["victim"] for p in pair[m].preemptions()] == [p["victim"] for p in alone.preemptions()]
