"""The step player every pool page shares: Play/Pause, Step, Back, Reset, a speed control, "Next
event", a scrub slider and an event strip, over the steps of one or more runs. Live play is driven
by ``st.fragment(run_every=...)``.

Speed. A redraw of a page with two heatmaps takes a good part of a second in a browser, so
playing at 50 steps per second cannot draw every step. The fragment ticks at most
``1 / MIN_INTERVAL_S`` times a second, and each tick advances as many steps as the wall time since
the last tick is worth at the chosen speed (:func:`steps_per_tick`): the run moves at the speed
asked for and the frames that drawing cannot keep up with are skipped.
"""
from __future__ import annotations

import time

import streamlit as st

from ui import export, run_events

SPEEDS = (1, 50)  # steps per second, the control's range
DEFAULT_SPEED = 10
MIN_INTERVAL_S = 0.2  # at most five redraws a second
MAX_CATCH_UP_S = 1.0  # a late tick (a busy machine, a paused tab) advances at most a second's worth
# Positions a playing player remembers having drawn. A browser that is slower than the ticks sends
# the next fragment rerun before it has drawn the last one, with the slider at a position drawn
# earlier: that is an echo to play on from, not the student dragging the slider back.
RECENT_DRAWN = 8


def _state(key: str) -> dict:
    return st.session_state.setdefault(f"_player_{key}", {"playing": False})


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


def tick_interval(steps_per_s: float) -> float:
    """Seconds between ticks at ``steps_per_s``: one step per tick while that is slow enough to
    draw, else MIN_INTERVAL_S."""
    return max(MIN_INTERVAL_S, 1.0 / steps_per_s)


def steps_per_tick(steps_per_s: float, elapsed_s: float) -> int:
    """Steps one tick advances: the wall time since the last tick (at least one interval, at most
    MAX_CATCH_UP_S) times the speed, and at least one."""
    elapsed = min(max(elapsed_s, tick_interval(steps_per_s)), MAX_CATCH_UP_S)
    return max(1, round(steps_per_s * elapsed))


def controls(key: str, num_steps: int, *, can_grow: bool = False, runs=None) -> None:
    """Buttons above the figures. ``num_steps``: steps recorded so far; ``can_grow``: a live run
    that produces more steps while playing; ``runs``: the runs shown, for "Next event"."""
    state = _state(key)
    step_key = f"{key}_step"
    st.session_state.setdefault(step_key, 0)
    last = max(0, num_steps - 1)

    def move(delta=None, to=None):
        cur = int(st.session_state.get(step_key, 0))
        target = to if to is not None else cur + delta
        # A live run has grown since these buttons were drawn (``last`` is that run's): Step forward
        # asks for the next step, and the tick clamps it to what the run has recorded by then.
        top = target if can_grow and delta == 1 else last
        st.session_state[step_key] = max(0, min(top, target))
        if delta == 1:
            state["advance"] = True

    def toggle():
        state["playing"] = not state["playing"]
        state["tick_time"] = time.monotonic()

    def jump():
        kind = st.session_state.get(f"{key}_event_kind", next(iter(run_events.SHORT_NAMES.values())))
        cur = int(st.session_state.get(step_key, 0))
        target = run_events.next_event(runs, kind, cur)
        if target is None:
            state["note"] = f"No {kind} after step {cur}."
        else:
            st.session_state[step_key] = target
            state["note"] = None

    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        st.button("Reset", icon=":material/first_page:", key=f"{key}_reset", on_click=move, kwargs={"to": 0})
        st.button("Back", icon=":material/chevron_left:", key=f"{key}_back", on_click=move, kwargs={"delta": -1})
        st.button("Pause" if state["playing"] else "Play",
                  icon=":material/pause:" if state["playing"] else ":material/play_arrow:",
                  key=f"{key}_play", on_click=toggle, type="primary", width=110)
        st.button("Step", icon=":material/chevron_right:", key=f"{key}_fwd", on_click=move, kwargs={"delta": 1})
        st.slider("Speed", SPEEDS[0], SPEEDS[1], _first_speed(), key=f"{key}_speed", format="%d steps/s", width=160,
                  help="How fast Play moves through the run, in steps per second. Above about 5 steps per second the "
                       "page cannot redraw every step, so it skips the ones it has no time to draw and keeps the speed.")
        if runs:  # a group of its own, so that on a narrow screen the two wrap together
            with st.container(horizontal=True, vertical_alignment="bottom", gap="small", width="content"):
                st.selectbox("Jump to the next", list(run_events.SHORT_NAMES.values()), key=f"{key}_event_kind",
                             width=165, help="The kind of event that Next event jumps to.")
                st.button("Next event", icon=":material/skip_next:", key=f"{key}_next_event", on_click=jump,
                          help="Jump to the next step at which the chosen kind of event happens (in any run shown).")
    if runs and state.get("note"):
        st.caption(state["note"])


def is_playing(key: str) -> bool:
    return _state(key)["playing"]


def stop(key: str) -> None:
    _state(key)["playing"] = False


def start(key: str) -> None:
    """Start playing (e.g. right after a page submitted new work to a live run)."""
    state = _state(key)
    state["playing"] = True
    state["tick_time"] = time.monotonic()


def interval(key: str):
    """``run_every`` for the page's fragment: the tick interval while playing, None when paused."""
    return tick_interval(speed(key)) if is_playing(key) else None


def tick(key: str, num_steps: int, *, can_grow: bool = False) -> int:
    """Called at the top of the fragment: while playing, advance :func:`steps_per_tick` steps
    (unless the student moved the slider since the last tick), clamp, and return the step to
    show. Stops playing at the end of a finished run.

    While playing, a slider at one of the last :data:`RECENT_DRAWN` positions drawn is a lagging
    browser's echo: play goes on from the latest position, so that a busy server or browser slows
    the playback down instead of stalling it (taken for drags, the echoes would hold it in place)."""
    step_key = f"{key}_step"
    state = _state(key)
    cur = int(st.session_state.get(step_key, 0))
    drawn = state.setdefault("drawn", [])
    if state["playing"]:
        now = time.monotonic()
        if state.get("ticked_at") == cur or cur in drawn:
            cur = int(state.get("ticked_at", cur)) + steps_per_tick(speed(key), now - state.get("tick_time", now))
        state["tick_time"] = now
    last = max(0, num_steps - 1)
    if cur > last:
        cur = last
        if not can_grow and state["playing"]:
            state["playing"] = False
            st.session_state[step_key] = cur
            st.rerun()  # full rerun: the Play button turns back into Play and the timer stops
    st.session_state[step_key] = cur
    state["ticked_at"] = cur
    if state["playing"]:
        drawn.append(cur)
        del drawn[:-RECENT_DRAWN]
    else:
        drawn.clear()  # paused: any position the slider holds is the student's
    return cur


def slider(key: str, num_steps: int, runs=None) -> int:
    """The scrub slider (inside the fragment, so it follows playback) and, given ``runs``, the
    event strip under it."""
    step_key = f"{key}_step"
    if num_steps <= 1:
        st.caption("Step 0 of 0")
        value = 0
    else:
        value = st.slider("Step", 0, num_steps - 1, key=step_key, help="Drag to any step of the run.")
    if runs:
        fig = run_events.event_strip(runs, num_steps, value)
        st.plotly_chart(fig, width="stretch", key=f"{key}_events", config=export.png_config(f"{key}-events"))
        st.caption("Where each kind of event happens: a tick per step, the dotted line at this step. "
                   "Next event jumps to the next tick of the kind chosen above.")
    return value
