import streamlit as st
st.title("live_engine")
st.info("coming soon")
