"""E4: a looped model against a stacked one of equal trained depth, at equal n or at matched overshoot."""

import streamlit as st

from dashboard import charts, data, ui, views

st.title("Looped vs stacked (E4)")
st.markdown(
    "A looped model (L layers, budget T, tied) against a stacked one of equal trained depth (L·T untied layers, "
    "T = 1). Compare at equal inference loop count n, or at matched overshoot: the ratio n / T or the difference "
    "n − T, with T each row's own trained loop count. Paper: at matched overshoot the advantage of looping "
    "vanishes on one task and shrinks on the other."
)
table = views.load("e4", "E4 trains looped and stacked models of equal depth.", "loopscope run e4 --preset cpu")
if table is None:
    st.stop()
st.caption(ui.scale_note(table))

rows, task, difficulty = views.task_and_difficulty(table.rows)
rows = rows.assign(
    overshoot_ratio=rows["eval_loops"] / rows["trained_loops"],
    overshoot_diff=rows["eval_loops"] - rows["trained_loops"],
)
modes_present = [m for m in charts.SERIES_ORDER if m in set(rows["boundary"])]
left, middle, right = st.columns([2, 2, 2])
with left:
    axis = ui.one_of("x axis", list(charts.X_AXES), "x", help="n; overshoot ratio n/T; overshoot difference n−T")
with middle:
    modes = views.modes_picker(rows, default=modes_present[:1])
    metric = ui.select("metric", ["accuracy", "choice_accuracy"], "metric")
with right:
    show_seeds = ui.toggle("per-seed lines", "seeds")
x, x_title = charts.X_AXES[axis]
picked = rows[rows["boundary"].isin(modes)]
if picked.empty:
    st.info("Nothing to draw: select at least one mode.")
    st.stop()

stats, per_seed = views.curves_of(picked, metric, difficulty, x=x)
budgets = views.budgets_of(picked) if axis == "n" else charts.budget_rules(1.0 if axis == "n/T" else 0, "n = T")
chart = charts.curves(
    stats,
    x,
    x_title,
    views.METRIC_TITLES[metric],
    seeds=per_seed if show_seeds else None,
    budgets=budgets,
    chance=charts.CHANCE,
    legend_title="model, mode",
)
name = f"e4-{table.preset}-{task}-{metric}-{axis.replace('/', 'over')}-{difficulty}".replace(" ", "_")
label = views.difficulty_label(rows, task, difficulty)
what = f"{task}, {label}. Stacked models dashed; vertical dashed rule(s): the trained budget n = T. "
caption = charts.caption(views.n_per_series(per_seed), stats["ci_method"], charts.CHANCE, what)
ui.figure(chart, stats, name, caption)

st.subheader("Looped against stacked at matched x")
mode = modes[0]
pair = per_seed[per_seed["boundary"] == mode]
matched = pair.groupby(x)["arch"].nunique()
pair = pair[pair[x].isin(matched[matched == 2].index)]
if pair.empty:
    st.info(f"No {x_title.split(' (')[0]} value has both a looped and a stacked model.")
    st.stop()
summary = data.mode_comparison_by(pair, (x,), "arch", "stacked", "looped")
chart = charts.delta_chart(
    summary, x, x_title, budgets if axis != "n" else None, y_title="Cliff's δ, looped vs stacked"
)
caption = (
    f"Mode `{mode}`. Cliff's δ = P(looped > stacked) − P(looped < stacked) over seeds, where both exist at the "
    "same x; bars: 95% bootstrap CI over seeds (BCa, percentile fallback); shading: |δ| magnitude bands."
)
ui.figure(chart, summary, f"{name}-delta", caption)
