import streamlit as st
st.title("block_size")
st.info("coming soon")
