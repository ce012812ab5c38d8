"""pagedkv: the Streamlit entry point. Shared sidebar settings, then the page the user picked."""
import streamlit as st

from pages.settings import sidebar

st.set_page_config(page_title="pagedkv: see the KV cache", page_icon=":material/view_module:", layout="wide")

PAGES = [
    st.Page("pages/home.py", title="Home", icon=":material/home:", default=True),
    st.Page("pages/reserve_or_page.py", title="Reserve or page", icon=":material/view_module:", url_path="reserve-or-page"),
    st.Page("pages/live_engine.py", title="Live engine", icon=":material/play_circle:", url_path="live-engine"),
    st.Page("pages/prefix_sharing.py", title="Prefix sharing and copy-on-write", icon=":material/account_tree:",
            url_path="prefix-sharing"),
    st.Page("pages/under_pressure.py", title="Under pressure: swap or recompute", icon=":material/compress:",
            url_path="under-pressure"),
    st.Page("pages/block_size.py", title="Block size and pool sizing", icon=":material/grid_view:",
            url_path="block-size"),
    st.Page("pages/ops.py", title="Ops dashboard", icon=":material/monitoring:", url_path="ops"),
]

page = st.navigation(PAGES)
sidebar()
page.run()
