"""loopscope dashboard: `loopscope dashboard` (or `streamlit run dashboard/app.py`)."""

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `streamlit run` from a checkout

from dashboard.data import results_root  # noqa: E402  (after the path fix above)

st.set_page_config(page_title="loopscope", page_icon=":material/autorenew:", layout="wide")
pages = {
    "Results": [
        st.Page("app_pages/overview.py", title="Overview", icon=":material/fact_check:", default=True),
        st.Page("app_pages/accuracy.py", title="Accuracy vs depth", icon=":material/show_chart:"),
        st.Page("app_pages/norms.py", title="Norm trajectories", icon=":material/stacked_line_chart:"),
        st.Page("app_pages/refit.py", title="Readout refit (E3)", icon=":material/tune:"),
        st.Page("app_pages/stacked.py", title="Looped vs stacked (E4)", icon=":material/layers:"),
        st.Page("app_pages/ouro.py", title="Ouro (E1)", icon=":material/public:"),
    ],
    "Provenance": [st.Page("app_pages/runs.py", title="Runs", icon=":material/table:")],
}
page = st.navigation(pages)
st.sidebar.caption(f"Results folder: `{results_root()}` (set `LOOPSCOPE_RESULTS` to change it).")
try:
    page.run()
except Exception as e:  # last resort: a message, never a traceback (Streamlit's rerun/stop are BaseExceptions)
    st.error(
        f"This page could not be drawn ({type(e).__name__}: {e}). The results may be from another version; "
        "`loopscope list` shows what is cached."
    )
