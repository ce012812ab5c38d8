"""The app's browser sessions: who holds one of the live real-model seats, and giving a closed
session's memory back.

Seats. A session that runs the real model live (a pool page on the SmolLM2 source, or the Live
engine page) holds a seat (:func:`claim_model_seat`); at most
:func:`ui.workshop.max_model_sessions` sessions hold one at once. A session gives its seat back
when a full run of it shows neither (app.py calls :func:`release_model_seat`) or when its browser
disconnects. (The seats bound how many sessions step the model; how many torch threads each
step may use is :class:`ui.models.CoreShare`'s: the cores split among the engines stepping.)

Memory. Streamlit keeps a disconnected session (its ``st.session_state`` with our live engines,
recordings and uploads) for ``server.disconnectedSessionTTL`` seconds so that a reconnect after
a network blip resumes it, then stops returning it; but it removes the expired session only on
a later write to its store, and then never shuts it down (its uploaded files stay in the
uploaded-file manager). Streamlit 1.67 has no hook for a session's end. :class:`SessionJanitor`,
a daemon thread, watches the sessions app.py registers (:func:`track`): a session that is not
connected gives its seat back at once; one that has stayed disconnected past the TTL has its
state cleared, its uploaded files and media dropped, the expired sessions reaped from
Streamlit's store and shut down, and then ``gc.collect()`` and glibc's ``malloc_trim(0)`` hand
the freed pages back to the system (with ``runner.postScriptGC`` off, nothing else would collect
the cycles a run leaves). The server allocates through glibc's malloc (:mod:`ui.serve`), so every
free page can go back, not only Python's wholly empty blocks.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_LOG = logging.getLogger(__name__)
SWEEP_EVERY_S = 5.0  # how often the janitor looks at the sessions
MARGIN_S = 5.0  # past the TTL before a session's state is cleared (a script still stopping finishes)


class Seats:
    """At most ``cap`` holders at once (None: no cap); thread-safe, ids are session ids."""

    def __init__(self):
        self._holders: set[str] = set()
        self._lock = threading.Lock()

    def claim(self, holder: str, cap: int | None) -> bool:
        """Take a seat (or keep the one held). False when all ``cap`` seats are held by others."""
        with self._lock:
            if holder in self._holders:
                return True
            if cap is not None and len(self._holders) >= cap:
                return False
            self._holders.add(holder)
            return True

    def release(self, holder: str) -> bool:
        """Give a seat back; True when one was held."""
        with self._lock:
            if holder in self._holders:
                self._holders.discard(holder)
                return True
            return False

    def holds(self, holder: str) -> bool:
        with self._lock:
            return holder in self._holders

    def __len__(self) -> int:
        with self._lock:
            return len(self._holders)


@dataclass
class _Tracked:
    state: object  # the session's SafeSessionState (what st.session_state reads and writes)
    away_since: float | None = None  # when the janitor first saw it disconnected


class SessionJanitor:
    """Gives the seats and the memory of closed sessions back (see the module's docstring).

    ``is_active(session_id)``: whether a browser is connected to the session now;
    ``ttl_s()``: how long a disconnected session may still be resumed; ``seats``: the seats to
    release; ``reap(session_ids)``: let the server drop what it keeps of those gone sessions;
    ``clock``: seconds.
    """

    def __init__(self, is_active: Callable[[str], bool], ttl_s: Callable[[], float], seats: Seats,
                 reap: Callable[[list[str]], None] = lambda ids: None, clock: Callable[[], float] = time.monotonic):
        self._is_active = is_active
        self._ttl_s = ttl_s
        self._seats = seats
        self._reap = reap
        self._clock = clock
        self._sessions: dict[str, _Tracked] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def track(self, session_id: str, state) -> None:
        """Register (or refresh) a session and the state object to clear once it has gone."""
        with self._lock:
            tracked = self._sessions.get(session_id)
            if tracked is None:
                self._sessions[session_id] = _Tracked(state)
            else:
                tracked.state, tracked.away_since = state, None

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def sweep(self) -> int:
        """One look at every tracked session; returns how many were cleared and forgotten."""
        now = self._clock()
        gone: dict[str, _Tracked] = {}
        with self._lock:
            for sid, tracked in list(self._sessions.items()):
                if self._is_active(sid):
                    tracked.away_since = None
                    continue
                self._seats.release(sid)  # a disconnected browser steps no engine
                if tracked.away_since is None:
                    tracked.away_since = now
                elif now - tracked.away_since > self._ttl_s() + MARGIN_S:
                    gone[sid] = self._sessions.pop(sid)
        for tracked in gone.values():
            clear_state(tracked.state)
        if gone:
            self._reap(list(gone))
            give_memory_back()
            _LOG.info("gave back %d closed session(s); %d still tracked", len(gone), len(self._sessions))
        return len(gone)

    def start(self, every_s: float = SWEEP_EVERY_S) -> None:
        """Sweep every ``every_s`` seconds in a daemon thread (once; later calls do nothing)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, args=(every_s,), name="pagedkv-session-janitor",
                                            daemon=True)
        self._thread.start()

    def _loop(self, every_s: float) -> None:
        while True:
            time.sleep(every_s)
            try:
                self.sweep()
            except Exception:  # a janitor that dies would leak every later session: keep sweeping
                _LOG.exception("session sweep failed")


def clear_state(state) -> None:
    """Delete every key of a session's state (its runs, engines and uploads go with them)."""
    try:
        keys = list(state.filtered_state)
    except Exception:
        return
    for key in keys:
        try:
            del state[key]
        except Exception:
            continue


def malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: return the free pages of every malloc arena to the system
    (``ui.serve`` caps the arenas at two). False where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def give_memory_back() -> None:
    gc.collect()
    malloc_trim()


# ---------------------------------------------------------------------------- the app's side
_SEATS = Seats()
_JANITOR: SessionJanitor | None = None
_JANITOR_LOCK = threading.Lock()


def seats() -> Seats:
    return _SEATS


def _session():
    """(session id, its SafeSessionState) of the running script, or None outside a server."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    if ctx is None or not Runtime.exists():
        return None
    return ctx.session_id, ctx.session_state


def session_id() -> str:
    """This session's id (AppTest's, too: it has no runtime, but a script context)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    return ctx.session_id if ctx is not None else "bare"


def janitor() -> SessionJanitor:
    """The process's janitor over the Streamlit runtime's sessions, started on first use."""
    global _JANITOR
    with _JANITOR_LOCK:
        if _JANITOR is None:
            import streamlit as st
            from streamlit.runtime import Runtime

            _JANITOR = SessionJanitor(
                is_active=lambda sid: Runtime.exists() and Runtime.instance().is_active_session(sid),
                ttl_s=lambda: float(st.get_option("server.disconnectedSessionTTL")),
                seats=_SEATS, reap=_reap)
            _JANITOR.start()
        return _JANITOR


def _reap(session_ids: list[str]) -> None:
    """What the server keeps of gone sessions: their uploaded files and media (also when
    Streamlit's store evicted a session early, at its 128-session limit, without shutting it
    down), then the expired sessions themselves (:func:`ui.streamlit_compat.reap_expired_sessions`)."""
    from streamlit.runtime import Runtime

    from ui.streamlit_compat import reap_expired_sessions

    if not Runtime.exists():
        return
    runtime = Runtime.instance()
    for sid in session_ids:
        runtime.uploaded_file_mgr.remove_session_files(sid)
        runtime.media_file_mgr.clear_session_refs(sid)
    runtime.media_file_mgr.remove_orphaned_files()
    reap_expired_sessions()


def track() -> None:
    """Register this session with the janitor (app.py, every run). Nothing under AppTest, which
    has no server runtime and whose sessions end with the test."""
    current = _session()
    if current is not None:
        janitor().track(*current)


def claim_model_seat() -> bool:
    """Take a live real-model seat for this session. When every seat is taken, st.info says so
    and False comes back (the caller falls back to the scripted source)."""
    import streamlit as st

    from ui.workshop import max_model_sessions

    cap = max_model_sessions()
    if not _SEATS.claim(session_id(), cap):
        st.info(f"All {cap} live-model seats are taken; the scripted source works. Try the real model again "
                "when someone leaves.", icon=":material/event_seat:")
        return False
    return True


def release_model_seat() -> None:
    _SEATS.release(session_id())
