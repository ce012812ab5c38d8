"""The player's rules, headless (AppTest: every run is a full run, the step slider's value the one
the browser would send back). The same rules under a real, slow browser: test_player_browser.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.apptest import open_page
from ui import player

POOL_PAGE = "pages/reserve_or_page.py"


def step(at) -> int:
    return at.slider(key="rop_step").value


def playing_page(ticks: int = 3):
    at = open_page(POOL_PAGE)
    at.button(key="rop_play").click().run()
    seen = [step(at)]
    for _ in range(ticks):
        at.run()  # a tick of the fragment's timer, from a browser that drew the last frame
        seen.append(step(at))
    return at, seen


SEEN = "_player_rop_seen"  # the hidden field that carries back the number of the last pause drawn


def test_pause_lands_on_the_step_the_browser_shows_and_ticks_sent_before_it_drew_the_pause_do_not_move_it():
    """A browser a frame behind presses Pause with the slider at the frame it shows: the run stops
    there. Its timer goes on sending ticks until the paused page reaches it; they carry an earlier
    pause's number back, and whatever frame the browser had: the paused step, then the frame that
    was on its way (CI's slow browser saw exactly this: the paused step 77 came back, then 87, and
    the paused page moved to 87), then an earlier one. None moves it. Once a request carries this
    pause's number back, the browser has the paused page: a drag is the student's."""
    at, seen = playing_page()
    before = at.text_input(key=SEEN).value
    at.slider(key="rop_step").set_value(seen[-2])  # the screen is one frame behind
    at.button(key="rop_play").click().run()
    assert not at.exception
    assert step(at) == seen[-2] and at.button(key="rop_play").label == "Play"
    assert at.text_input(key=SEEN).value != before
    for frame in (seen[-2], seen[-1], seen[-3]):
        at.text_input(key=SEEN).set_value(before)
        at.slider(key="rop_step").set_value(frame).run()
        assert step(at) == seen[-2], f"a tick sent before the pause was drawn, carrying {frame}, moved it"
    at.slider(key="rop_step").set_value(seen[0]).run()  # this pause's number (AppTest sends it back)
    assert step(at) == seen[0]


def test_a_step_pressed_before_the_paused_page_arrived_is_the_students():
    at, seen = playing_page()
    before = at.text_input(key=SEEN).value
    at.button(key="rop_play").click().run()
    paused = step(at)
    at.text_input(key=SEEN).set_value(before)
    at.button(key="rop_fwd").click().run()
    assert step(at) == paused + 1


def test_pause_right_after_a_drag_stops_where_the_student_dragged():
    at, seen = playing_page()
    at.slider(key="rop_step").set_value(seen[-1] + 7)  # not a frame the server sent: the student's
    at.button(key="rop_play").click().run()
    assert step(at) == seen[-1] + 7 and at.button(key="rop_play").label == "Play"


def test_a_held_frame_is_the_last_one_sent_and_play_goes_on_once_it_is_drawn():
    at, seen = playing_page()
    for _ in range(2):  # the browser is still drawing: the same frame again, never an earlier one
        at.slider(key="rop_step").set_value(seen[-2]).run()
        assert step(at) == seen[-1]
    at.run()
    assert step(at) > seen[-1]


def test_a_frame_never_reported_drawn_holds_the_playback_for_a_bounded_time(monkeypatch):
    """A browser that keeps reporting an earlier frame is still drawing: the last frame is sent
    again, but only for HOLD_S; then it counts as drawn and playing goes on (a lost or dropped
    frame must not stop the playback for good)."""
    clock = [100.0]
    monkeypatch.setattr(player.time, "monotonic", lambda: clock[0])
    state = {"playing": False}
    monkeypatch.setattr(player, "_state", lambda key: state)
    monkeypatch.setattr(player.st, "session_state", {"k_step": 0, "k_speed": 10})
    player.start("k")
    clock[0] += 0.2
    first = player.tick("k", 1000)  # the browser drew step 0: a frame
    clock[0] += 0.2
    second = player.tick("k", 1000)  # and that frame: the next
    assert 0 < first < second
    for _ in range(int(player.HOLD_S / 0.2) - 1):  # the browser still reports the first frame
        clock[0] += 0.2
        player.st.session_state["k_step"] = first
        assert player.tick("k", 1000) == second
    clock[0] += 0.4
    player.st.session_state["k_step"] = first
    assert player.tick("k", 1000) > second


def test_play_starts_from_the_step_on_the_screen():
    at = open_page(POOL_PAGE)
    at.slider(key="rop_step").set_value(40).run()
    at.button(key="rop_play").click().run()
    assert step(at) > 40
    assert "Playing at" in " ".join(c.value for c in at.caption)


def test_play_at_the_end_of_a_finished_run_plays_it_again_from_the_start():
    """Playing stops at the last step; Play pressed there starts again from step 0. It used to
    turn into Pause and back at once and nothing moved (CI's slow browser, its run played to the
    end at Speed 50, pressed Play at step 1755 of 1755: the press looked lost)."""
    at = open_page(POOL_PAGE)
    last = int(at.slider(key="rop_step").max)
    at.slider(key="rop_step").set_value(last).run()
    assert "The end of the run. Play plays it again from step 0" in " ".join(c.value for c in at.caption)
    at.button(key="rop_play").click().run()
    assert not at.exception
    assert at.button(key="rop_play").label == "Pause"
    assert 0 < step(at) <= player.steps_per_tick(player.DEFAULT_SPEED, player.MAX_CATCH_UP_S)
    at.slider(key="rop_step").set_value(last - 1).run()  # a drag to just before the end: play on to it, and stop
    at.run()
    assert step(at) == last and at.button(key="rop_play").label == "Play"
    assert "The end of the run" in " ".join(c.value for c in at.caption)


def _runs(monkeypatch):
    """A press's callback as the runs that carry it call it: ``fragment(*args)`` and ``full(*args)``
    (a run's callbacks), and ``controls()`` (a full rerun's body, before its buttons)."""
    import streamlit.runtime.scriptrunner as scriptrunner

    calls = []

    def rerun(scope):
        calls.append(f"rerun {scope}")

    monkeypatch.setattr(player, "st", SimpleNamespace(session_state={}, rerun=rerun))
    press = player._once_per_press("p")(lambda delta=None: calls.append(delta))

    def in_run(fragment: bool):
        def call(*args, **kwargs):
            ctx = SimpleNamespace(fragment_ids_this_run=["f"] if fragment else None)
            monkeypatch.setattr(scriptrunner, "get_script_run_ctx", lambda: ctx)
            press(*args, **kwargs)
        return call
    return calls, in_run(True), in_run(False), lambda: player._act_on_kept_press("p")


def test_a_press_that_only_a_fragment_tick_carried_acts_once(monkeypatch):
    """A fragment timer that fires between a click and its full rerun carries the click, and the
    browser may clear it once sent: the full rerun then carries none. The press acts there, once
    (the player used to act in full reruns only, and such a Pause was lost)."""
    calls, fragment, full, controls = _runs(monkeypatch)
    fragment()
    fragment()  # a second tick before the full rerun carries the same click
    assert calls == []
    controls()  # the full rerun: no click of its own
    controls()
    assert calls == [None]


def test_a_press_that_a_fragment_tick_and_the_full_rerun_both_carried_acts_once(monkeypatch):
    """The full rerun carries the click too: one press, one action (not Pause, then Play again)."""
    calls, fragment, full, controls = _runs(monkeypatch)
    fragment()
    full()
    controls()
    assert calls == [None]
    full()  # a later press of the same button, in its own full rerun, acts
    controls()
    assert calls == [None, None]


def test_a_kept_press_that_no_full_rerun_follows_acts_at_the_next_tick_that_does_not_carry_it(monkeypatch):
    """A press kept by a fragment run waits for the full rerun; a later tick that no longer
    carries it shows that none is coming (the browser would have sent it first): the press acts
    there, and the whole page runs again. A tick that carries it again only keeps it."""
    calls, fragment, full, controls = _runs(monkeypatch)
    stranded = lambda: player._act_on_stranded_press("p")  # noqa: E731  (the top of every tick)
    fragment()  # a tick carries the click, keeps it
    stranded()  # ... its own tick: nothing yet
    fragment()  # the next tick carries it again
    stranded()
    assert calls == []
    stranded()  # a tick that does not carry it: no full rerun came for it
    assert calls == [None, "rerun app"]
    controls()  # the full run asked for: nothing left to act on
    stranded()
    assert calls == [None, "rerun app"]


def test_a_kept_press_that_its_full_rerun_acts_on_is_not_acted_on_again_by_a_tick(monkeypatch):
    calls, fragment, full, controls = _runs(monkeypatch)
    fragment()
    stranded = lambda: player._act_on_stranded_press("p")  # noqa: E731
    stranded()
    full()  # the full rerun carries the click: acts once
    controls()
    stranded()  # the ticks after it
    stranded()
    assert calls == [None]


def test_a_kept_press_and_a_different_press_both_act_in_order(monkeypatch):
    calls, fragment, full, controls = _runs(monkeypatch)
    fragment()  # Pause, carried by a tick alone
    full(delta=1)  # then Step, in the full rerun
    controls()
    assert calls == [None, 1]


@pytest.mark.parametrize("rate, label", [(1, "1 step/s"), (10, "10 steps/s"), (2.14, "2.1 steps/s"), (1.0, "1 step/s")])
def test_rate_labels_read_right(rate, label):
    assert player.rate_label(round(rate, 1)) == label


def test_speed_control_reads_right_at_one_step():
    at = open_page(POOL_PAGE, speed="1")
    speed = next(s for s in at.select_slider if s.label == "Speed")
    assert speed.value == 1 and speed.proto.options[0] == "1 step/s" and speed.proto.options[9] == "10 steps/s"


def test_the_rate_shown_is_the_rate_achieved(monkeypatch):
    """Frames 1 s apart that each advance 2 steps: 2 steps/s, below 80% of 10: machine-bound."""
    clock = iter(range(100, 200))
    monkeypatch.setattr(player.time, "monotonic", lambda: float(next(clock)))
    state = {"playing": False}
    monkeypatch.setattr(player, "_state", lambda key: state)
    monkeypatch.setattr(player.st, "session_state", {"k_step": 0, "k_speed": 2})
    player.start("k")
    for _ in range(4):
        player.tick("k", 1000)
    assert player.achieved_rate("k") == pytest.approx(2.0)
    player.st.session_state["k_speed"] = 10
    assert "machine-bound" in player.rate_text("k") and "2 steps/s" in player.rate_text("k")
    assert "this machine draws no faster" in player.rate_text("k")
    # a live run computes its steps as it plays: the machine's computing bounds it too
    assert "this machine computes and draws the steps no faster" in player.rate_text("k", computing=True)


def test_a_run_computed_as_it_plays_ticks_at_most_every_live_tick(monkeypatch):
    """A live run's steps and the browser's frames share the cores: while it computes at a speed
    whose frames skip steps anyway (above 5 steps/s), the page ticks no faster than LIVE_TICK_S,
    and each frame shows every step computed since the last; at 5 steps/s or fewer (a
    projector's 1 step/s) every step keeps its frame."""
    state = {"playing": False}
    monkeypatch.setattr(player, "_state", lambda key: state)
    monkeypatch.setattr(player.st, "session_state", {"k_step": 0, "k_speed": 10})
    assert player.interval("k") is None and player.interval("k", computing=True) is None  # paused
    player.start("k")
    assert player.interval("k") == player.MIN_INTERVAL_S == 0.2
    assert player.interval("k", computing=True) == player.LIVE_TICK_S == 0.5
    player.st.session_state["k_speed"] = 50
    assert player.interval("k") == 0.2 and player.interval("k", computing=True) == 0.5
    player.st.session_state["k_speed"] = 5
    assert player.interval("k") == player.interval("k", computing=True) == 0.2
    player.st.session_state["k_speed"] = 1
    assert player.interval("k") == player.interval("k", computing=True) == 1.0


def test_a_playing_chart_keeps_its_element_and_gets_the_new_figure():
    """Each frame of a playing chart goes to the element drawn before (its id is its key alone), with
    the new figure: the browser updates the chart in place (ui/live_chart.py). st.plotly_chart could
    not: its browser side reads a figure only when it mounts the element, so every frame had to be a
    new element, mounted afresh (blank for a moment) and built from scratch."""
    at, _ = playing_page(ticks=1)
    charts = lambda: {c.proto.id: c.proto.spec for c in at.get("plotly_chart") if "rop_heat_paged" in c.proto.id}
    first = charts()
    at.run()
    second = charts()
    assert len(first) == 1 and len(second) == 1 and first.keys() == second.keys()
    assert list(first.values()) != list(second.values())


def test_next_event_is_one_button_and_one_press_is_one_jump():
    """The Next event button is drawn once, without a tooltip: Streamlit 1.67 draws a button that
    has one (``help=``) twice, the second copy zero-width, and a click aimed at its key could land
    on the copy and do nothing (issue 21's walk: a press once in six). Every player button is
    tooltip-free for the same reason. One press jumps once: to the next step with an event of the
    chosen kind, and a rerun that follows (a tick) does not jump again."""
    from ui import run_events
    from ui.lessons.reserve_or_page import guided_runs  # the page's default runs: explainer40 on both

    at = open_page(POOL_PAGE)
    player_keys = {f"rop_{k}" for k in ("reset", "back", "play", "fwd", "next_event")}
    buttons = [b for b in at.button if b.key in player_keys]
    assert sorted(b.key for b in buttons) == sorted(player_keys)  # each once
    assert not [b.key for b in buttons if b.proto.help], "a player button with a tooltip is drawn twice"
    kind = at.selectbox(key="rop_event_kind").value
    runs = guided_runs()
    target = run_events.next_event(runs, kind, 0)
    assert target is not None and target > 0
    at.button(key="rop_next_event").click().run()
    assert step(at) == target
    at.run()  # a rerun without a press: no second jump
    assert step(at) == target
    at.button(key="rop_next_event").click().run()
    assert step(at) == run_events.next_event(runs, kind, target)
