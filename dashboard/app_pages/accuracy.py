"""Accuracy against inference depth n per boundary mode (E2; E4 tables too); Cliff's delta and the paired view
per n; another result set overlaid."""

import streamlit as st

from dashboard import caching, charts, data, ui, views
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

rows, task, difficulty = views.task_and_difficulty(table.rows, key=table.key)
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
other = views.comparison(experiment, table.preset)

archs = archs_present if arch == "both" else [arch]
key = (*table.key, task, difficulty, tuple(modes), tuple(archs), metric)  # what every frame below is computed from


def computed() -> dict | None:
    picked = rows[rows["boundary"].isin(modes) & rows["arch"].isin(archs)]
    if picked.empty:
        return None
    stats, per_seed = views.curves_of(picked, metric, difficulty)
    first = picked[picked["arch"] == archs[0]]
    return {
        "picked": picked, "stats": stats, "per_seed": per_seed, "budgets": views.budgets_of(picked),
        "label": views.difficulty_label(rows, task, difficulty), "split": views.split_note(rows, task, difficulty),
        "first": first, "seeds_first": per_seed[per_seed["arch"] == archs[0]], "budgets_first": views.budgets_of(first),
    }  # fmt: skip


found = caching.derived(key, computed)  # a repeat view (a rerun, another visitor) reuses it
if found is None:
    st.info("Nothing to draw: select at least one mode.")
    st.stop()
picked, stats, per_seed, budgets = found["picked"], found["stats"], found["per_seed"], found["budgets"]
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
label, split = found["label"], found["split"]
st.subheader(f"{task}: {metric.replace('_', ' ')} per n ({label})")
what = "Lines: mean over seeds of the metric averaged over the chosen difficulties. "
caption = charts.caption(views.n_per_series(per_seed), stats["ci_method"], charts.CHANCE, what) + split
context = f"{experiment.upper()} · study {table.preset} · {task} · {label}"
ui.figure(chart, stats, name, caption, f"{metric.replace('_', ' ')} per n · {context}")

first, seeds_first = found["first"], found["seeds_first"]
T = int(first["trained_loops"].max())
delta_col, paired_col = st.columns(2)
with delta_col:
    st.subheader(f"Cliff's δ per n, none vs norm ({archs[0]})")
    views.delta_section(seeds_first, "eval_loops", charts.N_TITLE, found["budgets_first"], f"{name}-delta", split,
                        f"Cliff's δ none vs norm per n · {context}", key=key)  # fmt: skip
with paired_col:
    st.subheader(f"Paired per seed: none − norm ({archs[0]})")
    summary = views.paired_section(
        seeds_first, "eval_loops", charts.N_TITLE, "boundary", ("none", "norm"), T, found["budgets_first"],
        f"{name}-paired", f"{task}, {label}, {metric.replace('_', ' ')}: a seed's two models share its initial "
        f"weights and training data.{split} ", f"Paired none − norm per n · {context}", key=key,
    )  # fmt: skip
if summary is not None:
    st.subheader("Both analyses per n")
    views.paired_table(summary, "eval_loops", "n")

if other is not None:
    other_table, other_label, this_label = other
    st.header(f"Compared with {other_label}")
    other_rows = other_table.rows[other_table.rows["task"] == task]
    level = data.equivalent_level(other_rows, difficulty)
    other_picked = other_rows[other_rows["boundary"].isin(modes) & other_rows["arch"].isin(archs)]
    if level is None or other_picked.empty:
        st.info(f"{other_label} has no {task} rows at {label} in the chosen modes.")
        st.stop()
    other_stats, other_seeds = views.curves_of(other_picked, metric, level)
    note = f"{this_label}: {label}.{split} {other_label}: {views.difficulty_label(other_rows, task, level)}."
    note += views.split_note(other_rows, task, level) + " "
    views.compare_section(
        {this_label: (stats, per_seed), other_label: (other_stats, other_seeds)},
        "eval_loops", charts.N_TITLE, views.METRIC_TITLES[metric], name, note,
        budgets=views.compare_budgets({this_label: first, other_label: other_picked}), chance=charts.CHANCE,
        title=f"{metric.replace('_', ' ')} per n · {context}",
    )  # fmt: skip
