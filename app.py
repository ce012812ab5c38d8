"""pagedkv: the Streamlit entry point. Shared sidebar settings, then the page the user picked."""
import streamlit as st

from pages.common import sidebar_settings

st.set_page_config(page_title="pagedkv: see the KV cache", page_icon="🧱", layout="wide")

PAGES = [
    st.Page("pages/home.py", title="Home", icon="🏠", default=True),
]

page = st.navigation(PAGES)
sidebar_settings()
page.run()
