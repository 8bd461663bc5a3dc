"""E3: refit the readout of norm-trained models run without the norm; recovery over refit steps.

Every number here is engine.experiments.e3's: summarize (the in-range recovery the claims read) or curves
(other metrics and difficulties), cached in dashboard.data; the page wires widgets to them and draws."""

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui, views
from engine import paper
from engine.experiments import e3

st.title("Readout refit (E3)")
st.markdown(
    "Take `norm`-trained models, run them without the norm (accuracy drops), freeze the loop and refit "
    "(a) the head alone or (b) the head with the block's last layer. Recovery = (acc_refit − acc_removed) / "
    "(acc_original − acc_removed), per seed. Paper: (a) recovers about a third and plateaus, (b) recovers all of it. "
    "Beyond the paper: the head with the first or the middle layer, and with one half of the last layer "
    "(`.attn`: the attention sublayer and its two norms; `.mlp`: the MLP and its two), to locate the damage. "
    "Targets that name the same parameters (a 1-layer block: first = middle = last) are computed once."
)
table = views.load("e3", "E3 refits the readout of the E2 norm-trained models.", "loopscope run e3 --preset cpu")
if table is None:
    st.stop()
missing = {"refit_target", "refit_steps"} - set(table.rows.columns)
if missing:
    st.error(f"`e3-{table.preset}.parquet` lacks the columns {', '.join(sorted(missing))}; rerun E3 to rewrite it.")
    st.stop()
st.caption(ui.scale_note(table))

left, right = st.columns(2)
with left:
    task = views.pick_task(table.rows)
    metric = ui.select(
        "metric", [m for m in ("recovery", "accuracy") if m in set(table.rows["metric"].unique())], "metric"
    )
task_rows = table.rows[table.rows["task"] == task]
with right:
    difficulty = views.pick_difficulty(data.e3_levels(task_rows, metric))
summary, problem = data.e3_curves(table.preset, metric, difficulty)
if problem:
    st.error(problem)
    st.stop()
summary = summary[summary["task"] == task]
T = int(task_rows["trained_loops"].max())
label = views.difficulty_label(task_rows, task, difficulty)
with left:
    loops = sorted(int(n) for n in summary["eval_loops"].unique())
    n = ui.select("inference loop count n", loops, "n", default=T, help=f"The trained budget is T = {T}.")
with right:
    show_seeds = ui.toggle("per-seed lines", "seeds")

at_n = summary[summary["eval_loops"] == n]
original = at_n[at_n["refit_target"] == e3.ORIGINAL]  # the model in norm mode: a level, not a curve
stats = views.e3_series(at_n[at_n["refit_target"] != e3.ORIGINAL])
per_seed = data.e3_seed_values(table.preset, metric, difficulty)
per_seed = per_seed[(per_seed["task"] == task) & (per_seed["eval_loops"] == n)]
per_seed = views.e3_series(per_seed[per_seed["refit_target"] != e3.ORIGINAL])
references = None
if metric == "accuracy" and not original.empty:
    level = float(original["mean"].iloc[0])
    references = pd.DataFrame({"x": [None], "y": [level], "label": [f"original, norm mode: {level:.3f}"]})
if metric == "recovery":
    references = pd.DataFrame(
        {
            "x": [None, None, None],
            "y": [paper.HEAD_LAST_REFIT_RECOVERY, paper.HEAD_REFIT_RECOVERY, 0.0],
            "label": ["paper: head + last layer, full recovery", "paper: head alone ≈ 1/3", "no recovery"],
        }
    )
if not stats["mean"].notna().any():  # every seed guarded: say so rather than draw an empty figure
    st.info(
        f"No recovery to show at {task}, n = {n}, {label}: for every "
        f"seed the norm's removal cost less than {paper.MIN_REFIT_GAP} accuracy (nothing to recover). "
        "The in-range mean or another difficulty or n may have some."
    )
    st.stop()
chart = charts.curves(
    stats,
    "refit_steps",
    "readout refit steps (optimizer steps)",
    views.METRIC_TITLES[metric],
    seeds=per_seed if show_seeds else None,
    references=references,
    chance=charts.CHANCE if metric == "accuracy" else None,
    y_domain=None if metric == "recovery" else (0.0, 1.0),
    legend_title="refit target",
)
rules = {  # the black rules, named in the legend under the plot (no text on the plot, where the curves run)
    "recovery": "the paper's reported levels (references, not measurements) and no recovery (0). ",
    "accuracy": "the original model's accuracy in norm mode (the level a refit would restore). ",
}
what = (
    f"{task}, n = {n}, {label}. "
    + (f"Black rules, named in the legend: {rules[metric]}" if references is not None else "")
    + "Recovery is NaN for a seed whose accuracy fell by less than "
    f"{paper.MIN_REFIT_GAP} without the norm (nothing to recover): such seeds are left out (`n_guarded`). "
)
caption = charts.point_caption(stats, charts.CHANCE if metric == "accuracy" else None, what)  # guarded seeds vary
measured = task_rows[task_rows["metric"] == metric]  # the rows behind the figure, for their split
if metric == "recovery":  # the in-range mean's recovery is stored at difficulty e3.IN_RANGE, the others apart
    in_range = measured["difficulty"] == e3.IN_RANGE
    measured = measured[in_range] if difficulty in ("in-range mean", data.HELD_OUT[0]) else measured[~in_range]
caption += views.split_note(measured, task, difficulty)
title = f"E3 {metric} per refit step · study {table.preset} · {task} · {label} · n = {n}"
ui.figure(chart, stats, f"e3-{table.preset}-{task}-{metric}-n{n}-{difficulty}".replace(" ", "_"), caption, title)

st.subheader("Where each target ends")
ends = e3.final(at_n[at_n["refit_target"] != e3.ORIGINAL])
columns = ["refit_target", "refit_steps", "mean", "ci_low", "ci_high", "n", "n_guarded", "plateau"]
# pooled: the recovery of the seed-mean accuracies, NaN where their gap is below MIN_REFIT_GAP: a column of blanks
# says nothing, so it is shown only where some target has one
columns += [c for c in ("pooled", "same_as") if c in ends and (ends[c].notna() & (ends[c].astype(str) != "")).any()]
st.dataframe(ends[columns], hide_index=True, column_config=views.E3_COLUMNS)
source = "e3.summarize (the table the claims read)" if "pooled" in ends else "e3.curves"
st.caption(
    f"{views.METRIC_TITLES[metric]} at the last refit step ({task}, n = {n}, {label}), from engine.experiments."
    f"{source}: mean over seeds with its 95% bootstrap CI; plateau: each of the last {paper.PLATEAU_WINDOW} "
    f"doublings of steps moves the mean by < {paper.PLATEAU_TOL} (verdicts.plateaued)."
    + (" pooled: the recovery of the seed-mean accuracies." if "pooled" in columns else "")
    + (
        f" pooled is not shown: the seed-mean accuracy fell by less than {paper.MIN_REFIT_GAP} here (nothing to pool)."
        if "pooled" in ends and "pooled" not in columns
        else ""
    )
)
