"""The one place that touches a private Streamlit flag: ``PagesManager.uses_pages_directory``.

The page scripts live in ``pages/`` beside ``app.py``, and Streamlit treats such a folder as a
legacy multipage app until ``st.navigation`` has run once. The first request of a fresh server
(and every ``AppTest`` run, which resets the flag before it starts) would then run a page script
on its own, without app.py's shared sidebar, or show "Page not found" for a deep link. Declaring
up front that the app navigates with ``st.navigation`` makes that first run behave like every
later one. The flag is private, so this module is the single spot to revisit on a Streamlit
upgrade (checked against 1.67).
"""
from __future__ import annotations

_installed = False


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
