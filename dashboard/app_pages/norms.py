"""State norm per loop step per mode, its max/min ratio, and how strongly the head commits to one token."""

import streamlit as st

from dashboard import ui, views
from engine import paper

st.title("Norm trajectories")
st.markdown(
    "Without the boundary norm the state is free to grow from step to step. Paper (E1, released Ouro): after "
    f"removing the norm the state norm stays **within {paper.SURGERY_NORM_RATIO}×** over the steps, yet accuracy "
    f"falls to {paper.SURGERY_ACCURACY_AT_T:.3f} and the head commits to a single token: the failure is disagreement, "
    "not explosion."
)
table = views.load("e2", "The norms come from the E2 runs.", "loopscope run e2 --preset cpu")
if table is None:
    st.stop()
st.caption(ui.scale_note(table))
rows, task, difficulty = views.task_and_difficulty(table.rows)
modes = views.modes_picker(rows)
views.norms_section(rows, task, difficulty, modes, f"e2-{table.preset}")
