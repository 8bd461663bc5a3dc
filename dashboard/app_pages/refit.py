"""E3: refit the readout of norm-trained models run without the norm; recovery over refit steps."""

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui, views

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

rows, task, difficulty = views.task_and_difficulty(table.rows)
metrics = [m for m in ("recovery", "accuracy") if m in set(rows["metric"])]
left, middle, right = st.columns(3)
with left:
    metric = ui.select("metric", metrics, "metric")
loops = sorted(int(n) for n in rows["eval_loops"].unique())
T = int(rows["trained_loops"].max())
with middle:
    n = ui.select("inference loop count n", loops, "n", default=T, help=f"The trained budget is T = {T}.")
with right:
    show_seeds = ui.toggle("per-seed lines", "seeds")

picked = rows[rows["eval_loops"] == n]
per_seed = data.seed_values(picked, metric, difficulty, ["refit_target", "refit_steps"])
original = per_seed[per_seed["refit_target"] == "original"]  # the model in norm mode: a level, not a curve
per_seed = per_seed[per_seed["refit_target"] != "original"]
stats = data.curve_stats(per_seed, ("refit_target", "refit_steps")).rename(columns={"refit_target": "series"})
per_seed = per_seed.rename(columns={"refit_target": "series"})
references = None
if metric == "accuracy" and not original.empty:
    level = float(original["value"].mean())
    references = pd.DataFrame({"x": [None], "y": [level], "label": [f"original, norm mode: {level:.3f}"]})
if metric == "recovery":
    references = pd.DataFrame(
        {
            "x": [None, None, None],
            "y": [1.0, 1 / 3, 0.0],
            "label": ["paper: head + last layer, full recovery", "paper: head alone ≈ 1/3", "no recovery"],
        }
    )
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
label = views.difficulty_label(rows, task, difficulty)
what = f"{task}, n = {n}, {label}. Black rules: the paper's reported levels (references, not measurements). "
caption = charts.caption(
    views.n_per_series(per_seed), stats["ci_method"], charts.CHANCE if metric == "accuracy" else None, what
)
ui.figure(chart, stats, f"e3-{table.preset}-{task}-{metric}-n{n}".replace(" ", "_"), caption)

st.subheader("Where each target ends")
last = stats.sort_values("refit_steps").groupby("series").tail(3)  # the last two doublings of refit steps
ends = last.groupby("series", sort=False).agg(
    steps=("refit_steps", "max"),
    mean=("mean", "last"),
    ci_low=("ci_low", "last"),
    ci_high=("ci_high", "last"),
    last_moves=("mean", lambda m: float(m.diff().abs().max())),
)
ends["plateau"] = ends["last_moves"] < 0.02
st.dataframe(ends.reset_index().rename(columns={"series": "refit target"}), hide_index=True)
st.caption(
    f"{views.METRIC_TITLES[metric]} at the last refit step ({task}, n = {n}, {label}); `last_moves`: the largest "
    "change of the seed mean over the last two doublings of steps; plateau: every such change < 0.02."
)
