"""State norm per loop step per mode, its max/min ratio, and how strongly the head commits to one token."""

import streamlit as st

from dashboard import charts, data, ui, views
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
rows, task, difficulty = views.task_and_difficulty(table.rows, key=table.key)
left, right = st.columns([3, 4])
with left:
    modes = views.modes_picker(rows)
with right:
    other = views.comparison("e2", table.preset)
context = f"E2 · study {table.preset} · {task} · {views.difficulty_label(rows, task, difficulty)}"
shown = views.norms_section(
    rows, task, difficulty, modes, f"e2-{table.preset}", context=context, key=(*table.key, task)
)

if other is not None and shown is not None:
    (other_table, other_label, this_label), (metric, stats, per_seed) = other, shown
    st.header(f"Compared with {other_label}")
    other_rows = other_table.rows[other_table.rows["task"] == task]
    level = data.equivalent_level(other_rows, difficulty)
    picked = other_rows[other_rows["boundary"].isin(modes) & (other_rows["arch"] == "looped")]
    if level is None or picked.empty:
        st.info(f"{other_label} has no {task} rows at {difficulty} in the chosen modes.")
        st.stop()
    other_stats, other_seeds = views.curves_of(picked, metric, level)
    note = f"{this_label}: {views.difficulty_label(rows, task, difficulty)}; {other_label}: "
    note += f"{views.difficulty_label(other_rows, task, level)}. Mean state norm at the answer position. "
    views.compare_section(
        {this_label: (stats, per_seed), other_label: (other_stats, other_seeds)},
        "eval_loops", charts.N_TITLE, views.METRIC_TITLES[metric], f"e2-{table.preset}-{task}-{metric}", note,
        budgets=views.compare_budgets({this_label: rows, other_label: picked}), y_domain=None,
        title=f"State norm per step ({metric}) · {context}",
    )  # fmt: skip
