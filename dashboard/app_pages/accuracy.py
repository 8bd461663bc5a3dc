"""Accuracy against inference depth n per boundary mode (E2; E4 tables too), and Cliff's delta per n."""

import streamlit as st

from dashboard import charts, data, ui, views
from engine import paper

st.title("Accuracy vs depth")
st.markdown(
    "Models trained at budget **T** run for **n** loop steps. Paper (E2): `none` is never worse than `norm`, "
    f"the two are closest at n = T and separate on both sides, with Cliff's δ up to {paper.MAX_DELTA_BEYOND} "
    "beyond the budget."
)

sources = [e for e in ("e2", "e4") if data.presets(e)]
experiment = ui.select("experiment", sources, "experiment") if len(sources) > 1 else "e2"
table = views.load(experiment, "E2 trains both modes from scratch over many seeds.", "loopscope run e2 --preset cpu")
if table is None:
    st.stop()
st.caption(ui.scale_note(table))

rows, task, difficulty = views.task_and_difficulty(table.rows)
archs_present = sorted(rows["arch"].unique())
left, middle, right = st.columns([3, 2, 2])
with left:
    modes = views.modes_picker(rows)
with middle:
    multi_arch = len(archs_present) > 1
    arch = ui.one_of("architecture", [*archs_present, "both"], "arch") if multi_arch else archs_present[0]
    metric = ui.select("metric", ["accuracy", "choice_accuracy"], "metric")
with right:
    show_seeds = ui.toggle("per-seed lines", "seeds")

archs = archs_present if arch == "both" else [arch]
picked = rows[rows["boundary"].isin(modes) & rows["arch"].isin(archs)]
if picked.empty:
    st.info("Nothing to draw: select at least one mode.")
    st.stop()

stats, per_seed = views.curves_of(picked, metric, difficulty)
budgets = views.budgets_of(picked)
chart = charts.curves(
    stats,
    "eval_loops",
    charts.N_TITLE,
    views.METRIC_TITLES[metric],
    seeds=per_seed if show_seeds else None,
    budgets=budgets,
    chance=charts.CHANCE,
)
name = f"{experiment}-{table.preset}-{task}-{metric}-{difficulty}".replace(" ", "_")
st.subheader(f"{task}: {metric.replace('_', ' ')} per n ({views.difficulty_label(rows, task, difficulty)})")
what = "Lines: mean over seeds of the metric averaged over the chosen difficulties. "
caption = charts.caption(views.n_per_series(per_seed), stats["ci_method"], charts.CHANCE, what)
ui.figure(chart, stats, name, caption)

st.subheader(f"Cliff's δ per n, none vs norm ({archs[0]})")
first = picked[picked["arch"] == archs[0]]
views.delta_section(
    per_seed[per_seed["arch"] == archs[0]], "eval_loops", charts.N_TITLE, views.budgets_of(first), f"{name}-delta"
)
