"""pagedkv: the Streamlit entry point. Shared sidebar settings, then the page the user picked.

Before the page runs: the session is registered with the janitor that gives a closed session's
memory back, and its live real-model seat is settled (:mod:`ui.sessions`): the Live engine page
needs one, a pool page on the SmolLM2 source takes one in the sidebar, any other run gives it back.
"""
from pathlib import Path

import streamlit as st

from ui import layout, sessions, workshop
from ui.pages_registry import navigation_pages
from ui.settings import current, sidebar

LIVE_MODEL_PAGE = "live-engine"  # the page that always steps a session's own engine on the real model
# The tab's icon, served by this server: a ":material/...:" page icon is fetched by the browser from
# fonts.gstatic.com, and a classroom may be offline (issue 21). A pool's blocks, coloured by owner.
FAVICON = Path(__file__).parent / "ui" / "favicon.png"

workshop.apply_defaults()
st.set_page_config(page_title="pagedkv: see the KV cache", page_icon=FAVICON, layout="wide")
layout.compact()  # figures above the fold at 1280 x 720; no grey veil or skeletons while a page loads

page = st.navigation(navigation_pages())
sessions.track()
sidebar()
if page.url_path == LIVE_MODEL_PAGE:
    if not sessions.claim_model_seat():
        st.title(page.title)
        st.stop()
elif current("source") != "model":
    sessions.release_model_seat()
page.run()
