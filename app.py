"""pagedkv: the Streamlit entry point. Shared sidebar settings, then the page the user picked."""
import streamlit as st

from ui.pages_registry import navigation_pages
from ui.settings import sidebar

st.set_page_config(page_title="pagedkv: see the KV cache", page_icon=":material/view_module:", layout="wide")

page = st.navigation(navigation_pages())
sidebar()
page.run()
