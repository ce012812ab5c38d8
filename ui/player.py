"""The step player every pool page shares: Play/Pause, Step, Back, Reset, a speed control, "Next
event", a scrub slider and an event strip, over the steps of one or more runs. Live play is driven
by ``st.fragment(run_every=...)``.

Speed. A redraw of a page with two heatmaps takes a good part of a second in a browser, so
playing at 50 steps per second cannot draw every step. The fragment ticks at most
``1 / MIN_INTERVAL_S`` times a second, and each new frame advances as many steps as the wall time
since the last one is worth at the chosen speed (:func:`steps_per_tick`): the frames that drawing
cannot keep up with are skipped. Above ``1 / MIN_INTERVAL_S`` steps a second, a run computed as it
plays (the real model) ticks at most every :data:`LIVE_TICK_S`: its steps and the browser's frames
share the cores, and fewer frames leave more of them to the model (each frame shows every step
computed since the last). The rate the page really achieves is shown under the step slider
(:func:`achieved_rate`), with a note when the machine, not the control, sets it.

Frames in flight: one. The browser's timer asks for a tick every interval whether or not it has
drawn the last frame, and every request carries the step slider where the browser last drew it.
A tick advances only when that is the frame sent last; otherwise it draws the same frame again
and waits (:func:`tick`), for at most :data:`HOLD_S` (a frame never reported drawn counts as drawn
then: no lost frame can stop the playback). A busy browser or server therefore slows the playback
down instead of falling behind it: what is on the screen is never more than a frame or two behind
the server, so Pause stops at the step on the screen (the slider's value that the press
carries), and no queue of frames builds up in the websocket (one that grew past Streamlit's send
queue cost the session its connection, and a classroom's sessions their state).

Ticks after Pause. The browser's timer goes on asking for ticks until the paused page reaches it,
and those requests carry whatever frame the browser had at the time: the paused step itself, a
frame sent after it, or one before. Their values cannot tell a tick from a student's drag, so each
pause is numbered, and a hidden field drawn after the step slider (:func:`slider`) carries back the
number of the last pause the browser has drawn. A request that carries an earlier number was sent
before the browser had the paused page: it does not move the step (:func:`tick`).

One press, one action, never none. Streamlit sends a click on a button outside the fragment as a
full rerun a moment after the click; a fragment timer that fires first carries the press in a
fragment rerun too. The full rerun then carries the press again, or carries none (the browser
forgets a press once it has sent it): a fragment run only keeps the press, and the full rerun acts
on it once, whichever it carries (:func:`_once_per_press`).

The end of a run. Playing stops at the last step of a finished run; Play pressed there plays the
run again from step 0, as a video player does (it used to turn into Pause and back at once, and
nothing moved: a press that looked lost).
"""
from __future__ import annotations

import time

import streamlit as st

from ui import export, run_events
from ui.live_chart import show_chart

SPEEDS = (1, 50)  # steps per second, the control's range
DEFAULT_SPEED = 10
MIN_INTERVAL_S = 0.2  # at most five redraws a second
MAX_CATCH_UP_S = 1.0  # a late frame (a busy machine, a paused tab) advances at most a second's worth
# Frames a playing player remembers having sent. A request that carries one of them (not the last)
# comes from a browser still drawing: an echo, not the student dragging the slider there.
RECENT_DRAWN = 4
# The longest a playing page waits for the browser to report the frame sent last: past it the
# frame counts as drawn and playing goes on from it. A browser reports a frame well within it
# (measured: up to about 2 s, in a Chromium slowed 3x beside a classroom load test); one that never
# reports it (the frame was lost on its way, or dropped) must not stop the playback.
HOLD_S = 3.0
# The shortest tick while a run is computed as it plays (the real model) at a speed whose frames
# skip steps anyway (above 1 / MIN_INTERVAL_S steps a second; the default is 10): the model's steps and
# the browser's drawing share the cores, so a frame for every step as soon as it is computed costs
# the next steps their time. Measured with `bench live` on the 2-core AVX2 machine (README, *live*):
# a frame a step played 3.1 steps a second; a frame every half second, 4.9-5.4 (2 frames a second).
LIVE_TICK_S = 0.5
RATE_WINDOW_S = 3.0  # the achieved rate is measured over the frames of the last few seconds
MACHINE_BOUND = 0.8  # below this share of the speed asked for, the rate is the machine's


def _state(key: str) -> dict:
    return st.session_state.setdefault(f"_player_{key}", {"playing": False})


def _seen_key(key: str) -> str:
    """The hidden field that carries back the number of the last pause the browser drew."""
    return f"_player_{key}_seen"


def _pending_key(key: str) -> str:
    """A press of player ``key`` that a fragment run carried, waiting for the full rerun."""
    return f"_player_{key}_pending"


def _carried_key(key: str) -> str:
    """Set by the fragment run that carried (and kept) a press of player ``key``, until its tick."""
    return f"_player_{key}_carried"


def _once_per_press(key: str):
    """A decorator for the callbacks of player ``key``'s buttons (drawn outside the page's
    fragment): each press acts once, in the full rerun that follows it, and is never lost.

    Streamlit sends a click as a full rerun a moment after it (a zero-delay timer). A fragment's
    ``run_every`` timer that fires first sends every widget state, the click included, as a
    fragment rerun. Then either the full rerun carries the click too (it reaches the callbacks
    twice: acted on both times, Pause then Play again at once, the press undone), or it carries
    none, because the browser cleared the click once sent (acted on in full reruns only, the press
    was lost: once in a while a Pause that did not pause). So a fragment run only keeps the press
    (the last one it carried); the full rerun's callback acts on its own press, and on a kept one
    that is a different press first; a kept press the full rerun did not carry acts in
    :func:`controls` (:func:`_act_on_kept_press`), before the buttons are drawn."""
    def decorate(callback):
        def guarded(*args, **kwargs):
            from streamlit.runtime.scriptrunner import get_script_run_ctx

            press = (f"{callback.__name__} {args!r} {sorted(kwargs.items())!r}", callback, args, kwargs)
            ctx = get_script_run_ctx()
            if ctx is not None and ctx.fragment_ids_this_run:
                st.session_state[_pending_key(key)] = press
                st.session_state[_carried_key(key)] = True
                return
            kept = st.session_state.pop(_pending_key(key), None)
            if kept is not None and kept[0] != press[0]:
                kept[1](*kept[2], **kept[3])
            callback(*args, **kwargs)
        return guarded
    return decorate


def _act_on_kept_press(key: str) -> bool:
    """A press that only a fragment run carried: the full rerun after it carried none. It acts
    now. Returns whether there was one."""
    kept = st.session_state.pop(_pending_key(key), None)
    if kept is not None:
        kept[1](*kept[2], **kept[3])
    return kept is not None


def _act_on_stranded_press(key: str) -> None:
    """At the top of a fragment run (:func:`tick`): a press an earlier fragment run kept, that
    this run did not carry, and that no full rerun has acted on since. The browser sends its
    full rerun for a click by the time it stops carrying the click in its ticks, and the server
    handles a full rerun before any tick sent after it (a full rerun preempts a fragment run, and
    a fragment request waits behind a full one); so a tick that no longer carries the press,
    finding it still kept, shows that this full rerun never came. That is the one way left in
    which a press could wait forever, and a Pause once stayed "Pause" for two minutes in the
    slow-browser test beside the classroom test (a clean clone's suite, 2026-12-06). The press
    acts now, and the whole page runs again so that its buttons show what it did."""
    carried = st.session_state.pop(_carried_key(key), False)
    if not carried and _act_on_kept_press(key):
        st.rerun(scope="app")


def parse_speed(text: str) -> int:
    """A speed from the URL (``?speed=N``, steps per second): ASCII digits within :data:`SPEEDS`.
    Raises ValueError (one line) otherwise."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or not SPEEDS[0] <= int(text) <= SPEEDS[1]:
        raise ValueError(f"must be a whole number of steps per second from {SPEEDS[0]} to {SPEEDS[1]}, got {text!r}")
    return int(text)


def _first_speed() -> int:
    """The Speed control's value when a page first draws it: what the link asks for (a teacher's
    projector link at one step a second), else :data:`DEFAULT_SPEED`. A bad value has been
    dropped from the URL, with its message, by :func:`ui.settings.check_page_params`."""
    try:
        return parse_speed(st.query_params.get("speed", str(DEFAULT_SPEED)))
    except ValueError:
        return DEFAULT_SPEED


def speed(key: str) -> int:
    return int(st.session_state.get(f"{key}_speed", DEFAULT_SPEED))


def rate_label(steps_per_s: float) -> str:
    """``1 step/s``, ``10 steps/s``, ``2.1 steps/s``."""
    text = f"{steps_per_s:g}" if float(steps_per_s).is_integer() else f"{steps_per_s:.1f}"
    return f"{text} step/s" if text == "1" else f"{text} steps/s"


def tick_interval(steps_per_s: float) -> float:
    """Seconds between ticks at ``steps_per_s``: one step per tick while that is slow enough to
    draw, else MIN_INTERVAL_S."""
    return max(MIN_INTERVAL_S, 1.0 / steps_per_s)


def steps_per_tick(steps_per_s: float, elapsed_s: float) -> int:
    """Steps one frame advances: the wall time since the last frame (at least one interval, at
    most MAX_CATCH_UP_S) times the speed, and at least one."""
    elapsed = min(max(elapsed_s, tick_interval(steps_per_s)), MAX_CATCH_UP_S)
    return max(1, round(steps_per_s * elapsed))


def _begin(state: dict, shown: int) -> None:
    """Start playing from ``shown``, the step on the screen: it counts as the frame last sent."""
    now = time.monotonic()
    state.update(playing=True, tick_time=now, sent_time=now, ticked_at=shown, drawn=[shown], frames=[], paused_at=None)


def controls(key: str, num_steps: int, *, can_grow: bool = False, runs=None) -> None:
    """Buttons above the figures. ``num_steps``: steps recorded so far; ``can_grow``: a live run
    that produces more steps while playing; ``runs``: the runs shown, for "Next event"."""
    state = _state(key)
    step_key = f"{key}_step"
    st.session_state.setdefault(step_key, 0)
    last = max(0, num_steps - 1)
    state["end"] = None if can_grow or last == 0 else last  # where Play starts the run again
    once = _once_per_press(key)

    @once
    def move(delta=None, to=None):
        cur = int(st.session_state.get(step_key, 0))
        target = to if to is not None else cur + delta
        # A live run has grown since these buttons were drawn (``last`` is that run's): Step forward
        # asks for the next step, and the tick clamps it to what the run has recorded by then.
        top = target if can_grow and delta == 1 else last
        st.session_state[step_key] = max(0, min(top, target))
        state["paused_at"] = None  # the step moved to is the student's, wherever the screen was
        if state["playing"]:  # playing goes on from the step moved to
            _begin(state, st.session_state[step_key])
        if delta == 1:
            state["advance"] = True

    @once
    def toggle():
        # The press carries the step slider as the browser drew it: the step on the screen.
        shown = int(st.session_state.get(step_key, 0))
        if state["playing"]:
            state.update(playing=False, paused_at=shown, pauses=state.get("pauses", 0) + 1)
            return
        if state.get("end") is not None and shown >= state["end"]:  # at the end of a finished run: play it again
            shown = st.session_state[step_key] = 0
        _begin(state, shown)

    @once
    def jump():
        kind = st.session_state.get(f"{key}_event_kind", next(iter(run_events.SHORT_NAMES.values())))
        cur = int(st.session_state.get(step_key, 0))
        target = run_events.next_event(runs, kind, cur)
        if target is None:
            state["note"] = f"No {kind} after step {cur}."
        else:
            st.session_state[step_key] = target
            state.update(note=None, paused_at=None)
            if state["playing"]:
                _begin(state, target)

    _act_on_kept_press(key)  # before the buttons: Play/Pause shows what the press did
    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        st.button("Reset", icon=":material/first_page:", key=f"{key}_reset", on_click=move, kwargs={"to": 0})
        st.button("Back", icon=":material/chevron_left:", key=f"{key}_back", on_click=move, kwargs={"delta": -1})
        st.button("Pause" if state["playing"] else "Play",
                  icon=":material/pause:" if state["playing"] else ":material/play_arrow:",
                  key=f"{key}_play", on_click=toggle, type="primary", width=110)
        st.button("Step", icon=":material/chevron_right:", key=f"{key}_fwd", on_click=move, kwargs={"delta": 1})
        st.select_slider("Speed", list(range(SPEEDS[0], SPEEDS[1] + 1)), _first_speed(), key=f"{key}_speed",
                         format_func=rate_label, width=160,
                         help="How fast Play moves through the run, in steps per second. Above about 5 steps per "
                              "second the page cannot redraw every step, so it skips the ones it has no time to "
                              "draw; there, while the real model computes the run as it plays, the page draws at most "
                              f"{1 / LIVE_TICK_S:g} frames a second, each with every step computed since, so that "
                              "drawing leaves the cores to the model. A machine that cannot keep up plays slower "
                              "than asked: the rate achieved is shown under the step slider.")
        if runs:  # a group of its own, so that on a narrow screen the two wrap together
            with st.container(horizontal=True, vertical_alignment="bottom", gap="small", width="content"):
                st.selectbox("Jump to the next", list(run_events.SHORT_NAMES.values()), key=f"{key}_event_kind",
                             width=165, help="The kind of event that Next event jumps to: the next step at which an "
                                             "event of this kind happens, in any run shown.")
                # No tooltip (help=) on this button: Streamlit 1.67 draws a button with one twice, the
                # second copy zero-width, and a click aimed at the key could land on the copy.
                st.button("Next event", icon=":material/skip_next:", key=f"{key}_next_event", on_click=jump)
    if runs and state.get("note"):
        st.caption(state["note"])


def is_playing(key: str) -> bool:
    return _state(key)["playing"]


def stop(key: str) -> None:
    _state(key).update(playing=False, paused_at=None)


def start(key: str) -> None:
    """Start playing (e.g. right after a page submitted new work to a live run)."""
    _begin(_state(key), int(st.session_state.get(f"{key}_step", 0)))


def interval(key: str, computing: bool = False):
    """``run_every`` for the page's fragment: the tick interval while playing, None when paused.
    ``computing``: the page plays a run computed as it plays (a live run still stepping): at a
    speed whose frames skip steps anyway (above ``1 / MIN_INTERVAL_S`` steps a second), at least
    :data:`LIVE_TICK_S`, each frame showing every step computed since the last; at 5 steps a
    second or fewer every step keeps its frame."""
    if not is_playing(key):
        return None
    asked = speed(key)
    every = tick_interval(asked)
    return max(every, LIVE_TICK_S) if computing and asked * MIN_INTERVAL_S > 1 else every


def tick(key: str, num_steps: int, *, can_grow: bool = False) -> int:
    """Called at the top of the fragment: the step to draw. Stops playing at the end of a
    finished run.

    The step slider in session state is where the browser last drew it (or where the student
    dragged it). While playing: at the frame sent last, advance :func:`steps_per_tick` steps; at
    an earlier frame sent (one of the last :data:`RECENT_DRAWN`), the browser is still drawing:
    send the last frame again, for up to :data:`HOLD_S` (then advance from it as if drawn);
    anywhere else, the student dragged it: play on from there. After Pause, a request sent before
    the browser drew the paused page (it carries an earlier pause's number back) does not move it;
    once one carries this pause's number, every value is the student's."""
    _act_on_stranded_press(key)
    step_key = f"{key}_step"
    state = _state(key)
    shown = int(st.session_state.get(step_key, 0))
    drawn = state.setdefault("drawn", [])
    cur = shown
    now = time.monotonic()
    if state["playing"]:
        sent = state.get("ticked_at")
        if sent is None or shown == sent or (shown in drawn and now - state.get("sent_time", now) >= HOLD_S):
            # the browser drew the frame sent last (or never reported it within HOLD_S: as good as drawn)
            cur = (shown if sent is None else int(sent)) + steps_per_tick(speed(key), now - state.get("tick_time", now))
            state["tick_time"] = now
        elif shown in drawn:
            cur = int(sent)
        else:  # a drag while playing: play on from there
            state["tick_time"] = now
    elif state.get("paused_at") is not None:
        seen = st.session_state.get(_seen_key(key))
        if seen is None or seen == str(state.get("pauses", 0)):  # the browser drew the paused page
            state["paused_at"] = None
        else:  # a tick sent before it did, carrying whatever frame it had: the step stays
            cur = int(state["paused_at"])
    last = max(0, num_steps - 1)
    if cur > last:
        cur = last
        if not can_grow and state["playing"]:
            state.update(playing=False, paused_at=None)
            drawn.clear()
            st.session_state[step_key] = cur
            st.rerun()  # full rerun: the Play button turns back into Play and the timer stops
    st.session_state[step_key] = cur
    if state["playing"] and cur != state.get("ticked_at"):
        state["sent_time"] = now
        drawn.append(cur)
        del drawn[:-RECENT_DRAWN]
        frames = state.setdefault("frames", [])
        frames.append((now, cur))
        horizon = frames[-1][0] - RATE_WINDOW_S
        while len(frames) > 2 and frames[1][0] <= horizon:
            frames.pop(0)
    state["ticked_at"] = cur
    return cur


def achieved_rate(key: str) -> float | None:
    """Steps per second that playing has really moved over its last frames (None before two)."""
    frames = _state(key).get("frames") or []
    if len(frames) < 2 or frames[-1][0] <= frames[0][0]:
        return None
    return (frames[-1][1] - frames[0][1]) / (frames[-1][0] - frames[0][0])


def rate_text(key: str, computing: bool = False) -> str:
    """The line under the step slider: the rate achieved while playing (and whether the machine
    sets it), else how Play moves. ``computing``: the steps are computed as they play (a live
    run still stepping), so a machine-bound rate is the machine's computing as well as its drawing."""
    asked = speed(key)
    if not is_playing(key):
        end = _state(key).get("end")
        if end is not None and int(st.session_state.get(f"{key}_step", 0)) >= end:
            return f"The end of the run. Play plays it again from step 0, at up to {rate_label(asked)}."
        return f"Paused. Play moves at up to {rate_label(asked)}; Pause stops at the step on the screen."
    rate = achieved_rate(key)
    if rate is None:
        return f"Playing at up to {rate_label(asked)}."
    text = f"Playing at {rate_label(round(rate, 1))}"
    if rate < MACHINE_BOUND * asked:
        what = "computes and draws the steps" if computing else "draws"
        return text + f" (machine-bound: this machine {what} no faster; Speed asks for {rate_label(asked)})."
    return text + "."


def slider(key: str, num_steps: int, runs=None) -> int:
    """The scrub slider (inside the fragment, so it follows playback), the rate playing achieves,
    and, given ``runs``, the event strip under them."""
    step_key = f"{key}_step"
    if num_steps <= 1:
        st.caption("Step 0 of 0")
        value = 0
    else:
        value = st.slider("Step", 0, num_steps - 1, key=step_key, help="Drag to any step of the run.")
    # After the slider, so that a request carrying this pause's number carries the paused step too.
    st.session_state[_seen_key(key)] = str(_state(key).get("pauses", 0))
    st.text_input("Pause drawn", key=_seen_key(key), label_visibility="collapsed")  # hidden (ui.layout)
    from ui.runs.model import still_stepping

    st.caption(rate_text(key, computing=any(still_stepping(r) for r in runs or ())))
    if runs:
        fig = run_events.event_strip(runs, num_steps, value, run_events.strip_extent(runs, num_steps))
        show_chart(fig, f"{key}_events", config=export.png_config(f"{key}-events"))
        st.caption("Where each kind of event happens: a tick per step, the dotted line at this step. "
                   "Next event jumps to the next tick of the kind chosen above.")
    return value
