"""The step player every pool page shares: Play/Pause, Step, Back, Reset and a scrub slider over
the steps of one or more runs, with live play driven by ``st.fragment(run_every=...)``."""
from __future__ import annotations

import streamlit as st

PLAY_INTERVAL_S = 0.4


def _state(key: str) -> dict:
    return st.session_state.setdefault(f"_player_{key}", {"playing": False})


def controls(key: str, num_steps: int, *, can_grow: bool = False) -> None:
    """Buttons above the figures. ``num_steps``: steps recorded so far; ``can_grow``: a live run
    that produces more steps while playing."""
    state = _state(key)
    step_key = f"{key}_step"
    st.session_state.setdefault(step_key, 0)
    last = max(0, num_steps - 1)

    def move(delta=None, to=None):
        cur = int(st.session_state.get(step_key, 0))
        st.session_state[step_key] = max(0, min(last + (1 if can_grow and delta == 1 else 0), to if to is not None else cur + delta))
        if delta == 1:
            state["advance"] = True

    def toggle():
        state["playing"] = not state["playing"]

    c = st.columns([1, 1, 1.3, 1, 5])
    c[0].button("Reset", icon=":material/first_page:", key=f"{key}_reset", on_click=move, kwargs={"to": 0},
                width="stretch")
    c[1].button("Back", icon=":material/chevron_left:", key=f"{key}_back", on_click=move, kwargs={"delta": -1},
                width="stretch")
    c[2].button("Pause" if state["playing"] else "Play", icon=":material/pause:" if state["playing"] else ":material/play_arrow:",
                key=f"{key}_play", on_click=toggle, type="primary", width="stretch")
    c[3].button("Step", icon=":material/chevron_right:", key=f"{key}_fwd", on_click=move, kwargs={"delta": 1},
                width="stretch")


def is_playing(key: str) -> bool:
    return _state(key)["playing"]


def stop(key: str) -> None:
    _state(key)["playing"] = False


def start(key: str) -> None:
    """Start playing (e.g. right after a page submitted new work to a live run)."""
    _state(key)["playing"] = True


def interval(key: str):
    """``run_every`` for the page's fragment: a period while playing, None when paused."""
    return PLAY_INTERVAL_S if is_playing(key) else None


def tick(key: str, num_steps: int, *, can_grow: bool = False) -> int:
    """Called at the top of the fragment: advance one step while playing, clamp, and return the
    step to show. Stops playing at the end of a finished run."""
    step_key = f"{key}_step"
    state = _state(key)
    cur = int(st.session_state.get(step_key, 0))
    if state["playing"] and state.get("ticked_at") == cur:
        cur += 1
    last = max(0, num_steps - 1)
    if cur > last:
        cur = last
        if not can_grow and state["playing"]:
            state["playing"] = False
            st.session_state[step_key] = cur
            st.rerun()  # full rerun: the Play button turns back into Play and the timer stops
    st.session_state[step_key] = cur
    state["ticked_at"] = cur
    return cur


def slider(key: str, num_steps: int) -> int:
    """The scrub slider (inside the fragment, so it follows playback)."""
    step_key = f"{key}_step"
    if num_steps <= 1:
        st.caption("Step 0 of 0")
        return 0
    return st.slider("Step", 0, num_steps - 1, key=step_key, help="Drag to any step of the run.")
