"""loopscope dashboard: `loopscope dashboard` (or `streamlit run dashboard/app.py`)."""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `streamlit run` from a checkout

st.set_page_config(page_title="loopscope", layout="wide")
pages = [st.Page("app_pages/runs.py", title="Runs", icon=":material/table:", default=True)]
st.navigation(pages).run()
