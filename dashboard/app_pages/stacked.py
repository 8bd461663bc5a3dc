"""E4: a looped model against a stacked one of equal trained depth, at equal n or at matched overshoot.

Every number here is engine.experiments.e4's: curves (each architecture per mode and x) and compare (looped
vs stacked: gap, Cliff's delta, p), with E4's modes and overshoot, cached in dashboard.data."""

import streamlit as st

from dashboard import charts, data, results, ui, views
from engine import paper
from engine.core import stats as stats_
from engine.core.model import BOUNDARIES
from engine.experiments import e4, verdicts

st.title("Looped vs stacked (E4)")
st.markdown(
    "A looped model (L layers, budget T, tied) against a stacked one of equal trained depth (L·T untied layers, "
    "T = 1). Compare at equal inference loop count n, or at matched overshoot: the ratio n / T or the difference "
    "n − T, with T each row's own trained loop count. Paper: at matched overshoot the advantage of looping "
    "vanishes on one task and shrinks on the other. With T = 1 training with and without the norm is the same "
    "computation, so one stacked model serves both modes: trained with `norm`, run as `norm->none` for `none`."
)
table = views.load("e4", "E4 trains looped and stacked models of equal depth.", "loopscope run e4 --preset cpu")
if table is None:
    st.stop()
st.caption(ui.scale_note(table))

# by default the level the claims read: the held-out mean (the verdict rules) where the table has held-out items,
# else all difficulties pooled (the first study's e4.summarize)
default = data.HELD_OUT[0] if results.has_heldout(table.rows) else "all difficulties mean"
rows, task, difficulty = views.task_and_difficulty(table.rows, default=default, key=table.key)
left, middle, right = st.columns([2, 2, 2])
with left:
    axis = ui.one_of("x axis", list(e4.AXES), "axis", help="; ".join(f"{k}: {v}" for k, v in e4.AXES.items()))
with middle:
    mode = ui.one_of("mode", list(BOUNDARIES), "mode", help="none: the stacked model is its norm model run as none.")
    metric = ui.select("metric", ["accuracy", "choice_accuracy"], "metric")
with right:
    show_seeds = ui.toggle("per-seed lines", "seeds")
other = views.comparison("e4", table.preset)
curves, gaps, problem = data.e4_summaries(table.preset, task, difficulty, axis, metric)
if problem:
    st.error(problem)
    st.stop()

x, x_title = charts.X_AXES[axis]
stats = views.e4_series(curves[curves["mode"] == mode], axis)
per_seed = data.e4_seed_values(table.preset, task, difficulty, axis, metric)
per_seed = views.e4_series(per_seed[per_seed["mode"] == mode], axis)
if axis == "ratio":  # the stacked model (T = 1) runs to n / T = 12: only the overshoots the looped one reaches
    reach = stats.loc[stats["arch"] == "looped", x].max()
    stats, per_seed, gaps = stats[stats[x] <= reach], per_seed[per_seed[x] <= reach], gaps[gaps["x"] <= reach]
budgets = views.e4_budgets(rows, axis, mode)
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
name = f"e4-{table.preset}-{task}-{metric}-{axis}-{mode}-{difficulty}".replace(" ", "_")
label = views.difficulty_label(rows, task, difficulty)
split = views.split_note(rows, task, difficulty)
what = f"{task}, {label}, mode {mode} (engine.experiments.e4.curves). Stacked dashed; dashed rule(s): n = T. "
caption = charts.caption(int(stats["n"].min()) if len(stats) else 0, stats["ci_method"], charts.CHANCE, what)
context = f"E4 · study {table.preset} · {task} · {label} · mode {mode}"
ui.figure(chart, stats, name, caption + split, f"Looped vs stacked, {metric.replace('_', ' ')} · {context}")

st.subheader(f"Looped against stacked at matched {e4.AXES[axis]}")
pair = gaps[gaps["mode"] == mode].rename(columns={"x": x})
if pair.empty:
    st.info(f"No value of the {e4.AXES[axis]} has both a looped and a stacked model.")
    st.stop()
delta_col, paired_col = st.columns(2)
with delta_col:
    chart = charts.delta_chart(
        pair, x, x_title, budgets if axis != "n" else None, y_title="Cliff's δ, looped vs stacked"
    )
    caption = (
        f"Mode `{mode}`, engine.experiments.e4.compare. Cliff's δ = P(looped > stacked) − P(looped < stacked) over "
        "seeds, where both exist at the same x; bars: 95% bootstrap CI over seeds (BCa, percentile fallback); "
        "shading: |δ| magnitude bands ("
        + ", ".join(f"< {cut} {name}" for cut, name in paper.DELTA_MAGNITUDES)
        + ", else large)."
    )
    ui.figure(chart, pair, f"{name}-delta", caption + split, f"Cliff's δ looped vs stacked · {context}")
with paired_col:
    family = {"n": "n = 2..3T (n = 1 alone)", "ratio": "o = 1, 2, 3", "difference": "n − T > 0 (0 alone)"}[axis]
    summary = views.paired_section(
        per_seed, x, x_title, "arch", ("looped", "stacked"), data.E4_FAMILIES[axis],
        budgets if axis != "n" else None, f"{name}-paired",
        f"Mode `{mode}`: a seed's looped model against its stacked twin (paired by seed, as E4's verdict rule "
        f"pairs them). Holm family: {family}.{split} ", f"Paired looped − stacked · {context}",
    )  # fmt: skip
columns = [x, "mean_a", "mean_b", "gap", "delta", "delta_ci_low", "delta_ci_high", "magnitude", "p_value"]
st.dataframe(
    pair[[*columns, "n_a", "n_b"]],
    hide_index=True,
    height="content",
    column_config={x: axis} | views.E4_COLUMNS,
)
st.caption(
    "The gap is the looped mean minus the stacked mean at the same x; positive: looping is better. "
    f"p: two-sided Mann–Whitney U (significance level {paper.ALPHA})."
)
if summary is not None:
    st.subheader("Paired: looped − stacked of the same seed")
    if axis == "ratio":  # post hoc, beside the paired "vanishes": an equivalence test at the rule's own margin
        diffs = views.seed_differences(per_seed, x, "arch", "looped", "stacked")
        tost = diffs.groupby(x)["diff"].apply(lambda d: stats_.tost_p(d.to_numpy(), verdicts.TOST_MARGIN))
        summary = summary.assign(tost_p=summary[x].map(tost))
    views.paired_table(summary.drop(columns="side"), x, axis, f"the Holm family ({family}) of docs/design.md")
    if "tost_p" in summary:
        st.caption(
            f"Post hoc, not a verdict rule: TOST p, two one-sided paired t-tests that the mean gap lies within "
            f"±{verdicts.TOST_MARGIN} (the paired rule's own “vanishes” margin); p < {paper.ALPHA} shows the gap "
            "equivalent to zero. A Holm p ≥ 0.05 alone does not: it only fails to show a gap."
        )

if other is not None:
    other_table, other_label, this_label = other
    st.header(f"Compared with {other_label}")
    level = data.equivalent_level(other_table.rows[other_table.rows["task"] == task], difficulty)
    found = data.e4_summaries(other_table.preset, task, level, axis, metric, other_table.root) if level else None
    if found is None or found[2] or found[0][found[0]["mode"] == mode].empty:
        st.info(f"{other_label} has no {task} rows at {label} in mode {mode}.")
        st.stop()
    other_stats = views.e4_series(found[0][found[0]["mode"] == mode], axis)
    other_seeds = data.e4_seed_values(other_table.preset, task, level, axis, metric, other_table.root)
    other_seeds = views.e4_series(other_seeds[other_seeds["mode"] == mode], axis)
    other_rows = other_table.rows[other_table.rows["task"] == task]
    note = f"{this_label}: {label}.{split} {other_label}: {views.difficulty_label(other_rows, task, level)}."
    note += views.split_note(other_rows, task, level) + f" Mode {mode}. "
    views.compare_section(
        {this_label: (stats, per_seed), other_label: (other_stats, other_seeds)},
        x, x_title, views.METRIC_TITLES[metric], name, note, budgets=budgets, chance=charts.CHANCE,
        title=f"Looped vs stacked, {metric.replace('_', ' ')} · {context}",
    )  # fmt: skip
