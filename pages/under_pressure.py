import streamlit as st
st.title("under_pressure")
st.info("coming soon")
