import streamlit as st

from dashboard.data import results_root, runs

st.title("Cached runs")
table, problems = runs()
for problem in problems:
    st.warning(f"Skipped a damaged run: {problem}. `loopscope train` with its config redoes it.")
if table.empty:
    st.info(
        f"No runs under `{results_root()}` yet. Train a few with "
        "`loopscope train --preset smoke --seeds 2`, then reload this page."
    )
else:
    st.caption(f"{len(table)} runs under `{results_root()}`")
    st.dataframe(table, hide_index=True, width="stretch")
