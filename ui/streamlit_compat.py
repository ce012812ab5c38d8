"""The one place that touches Streamlit's private parts (checked against 1.67; revisit here on an
upgrade):

- ``PagesManager.uses_pages_directory`` (:func:`use_navigation_only`). The page scripts live in
  ``pages/`` beside ``app.py``, and Streamlit treats such a folder as a legacy multipage app
  until ``st.navigation`` has run once. The first request of a fresh server (and every
  ``AppTest`` run, which resets the flag before it starts) would then run a page script on its
  own, without app.py's shared sidebar, or show "Page not found" for a deep link. Declaring up
  front that the app navigates with ``st.navigation`` makes that first run behave like every
  later one.
- The runtime's store of disconnected sessions (:func:`reap_expired_sessions`). Streamlit keeps
  a disconnected session for ``server.disconnectedSessionTTL`` seconds, in a TTL cache that
  removes an expired entry only on a later write, and then merely drops it: the session is never
  shut down, so its uploaded files stay in the uploaded-file manager. Reaping does what
  ``Runtime.close_session`` does for a stored session (which it can no longer find once
  expired), on the event loop and under the session manager's storage lock, as Streamlit's own
  logout path does.
- Not patched: ``plotly_chart.compute_and_register_element_id``. A keyed chart whose id is its
  key alone is never redrawn by Streamlit 1.67's browser side: it reads a chart's figure only when
  it mounts the element (``useState`` keyed on the element id), so with a stable id every playing
  pool froze at its first frame and every guide slide showed the first slide's figure (tried and
  undone, issue 21). A new figure needs a new id, as Streamlit computes it, and a new id is a new
  element, mounted afresh. The charts that change while playing therefore do not go through
  ``st.plotly_chart``: :func:`ui.live_chart.show_chart` draws them with a Custom Component v2
  (public API, no patch) whose id is its key, updated in place with ``Plotly.react``.
"""
from __future__ import annotations

import threading

_installed = False
REAP_WAIT_S = 10.0


def use_navigation_only() -> None:
    """Make every Streamlit pages manager (the server's and AppTest's) skip the ``pages/`` scan.
    Idempotent: calling it again changes nothing."""
    global _installed
    if _installed:
        return
    from streamlit.runtime.pages_manager import PagesManager

    original_init = PagesManager.__init__

    def init_for_navigation(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    PagesManager.__init__ = init_for_navigation
    PagesManager.uses_pages_directory = False
    _installed = True


def reap_expired_sessions() -> int | None:
    """Remove the disconnected sessions whose TTL has passed from the runtime's store and shut
    each down (its uploaded files, media and caches go). Call it from any thread but the event
    loop's; it waits for the loop to do it. Returns how many were reaped, None where this
    Streamlit has no such store (nothing is done then)."""
    from streamlit.runtime import Runtime

    if not Runtime.exists():
        return None
    runtime = Runtime.instance()
    try:
        manager = runtime._session_mgr
        lock = manager._storage_lock
        cache = manager._session_storage._cache
        loop = runtime._get_async_objs().eventloop
        expire = cache.expire
    except (AttributeError, RuntimeError):
        return None
    done = threading.Event()
    reaped: list[int] = []

    def reap() -> None:
        try:
            with lock:
                removed = expire()
            for _, info in removed:
                info.session.shutdown()
            reaped.append(len(removed))
        finally:
            done.set()

    try:
        loop.call_soon_threadsafe(reap)
    except RuntimeError:  # the loop has closed: the server is stopping
        return None
    done.wait(REAP_WAIT_S)
    return reaped[0] if reaped else None
