"""Page sections used by several pages: choose a table, draw a metric's curves, compare two modes."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from dashboard import charts, data, ui

METRIC_TITLES = {  # axis titles: short, with units; the captions say the rest
    "accuracy": "accuracy (fraction correct)",
    "choice_accuracy": "forced-choice accuracy (fraction)",
    "top_token_share": "top-token share (fraction)",
    "norm_post": "state norm ‖h_t‖ (L2, post-boundary)",
    "norm_pre": "state norm (L2, pre-boundary)",
    "recovery": "recovery (fraction regained)",
}


def load(experiment: str, what: str, command: str) -> data.Table | None:
    """The experiment's table at the chosen preset, or the not-run-yet state (and None)."""
    preset = ui.pick_preset(experiment)
    if preset is None:
        ui.not_run_yet(f"{what} There is no `{experiment}-<preset>.parquet` under `{data.results_root()}`.", command)
        return None
    table = data.table(experiment, preset)
    if table.rows is None:
        ui.not_run_yet(what, command, table.problems)
        return None
    return table


def task_and_difficulty(rows: pd.DataFrame) -> tuple[pd.DataFrame, str, str]:
    """Task and difficulty selectors; returns the task's rows, the task and the difficulty choice."""
    left, right = st.columns(2)
    with left:
        task = ui.select("task", sorted(rows["task"].unique()), "task")
    rows = rows[rows["task"] == task]
    with right:
        difficulty = ui.select(
            "difficulty (parity: length m; chain: hops k)",
            data.difficulty_options(rows),
            "difficulty",
            help="in-range: the difficulties the models were trained on; beyond-range: harder ones, never trained.",
        )
    return rows, task, difficulty


def difficulty_label(rows: pd.DataFrame, task: str, difficulty: str) -> str:
    """'in-range mean' as is; a single difficulty named by its knob and placed against the training range."""
    if not difficulty.isdigit():
        return difficulty
    knob = {"parity": "length m", "chain": "hops k"}.get(task, "difficulty")
    where = set(rows.loc[rows["difficulty"] == int(difficulty), "range"])
    return f"{knob} = {difficulty}" + (f", {where.pop()}" if len(where) == 1 and "n/a" not in where else "")


def with_series(frame: pd.DataFrame, archs: Sequence[str]) -> pd.DataFrame:
    labels = [charts.series_label(a, b, archs) for a, b in zip(frame["arch"], frame["boundary"], strict=True)]
    return frame.assign(series=labels)


def curves_of(rows: pd.DataFrame, metric: str, difficulty: str, x: str = "eval_loops") -> tuple[pd.DataFrame, ...]:
    """Per series (arch, boundary) and x: mean with CI over seeds, and the per-seed values."""
    per_seed = data.seed_values(rows, metric, difficulty, ["arch", "boundary", x])
    stats = data.curve_stats(per_seed, ("arch", "boundary", x))
    archs = sorted(rows["arch"].unique())
    return with_series(stats, archs), with_series(per_seed, archs)


def budgets_of(rows: pd.DataFrame) -> pd.DataFrame:
    """A budget rule per architecture at its trained loop count T (one rule when all share T)."""
    by_arch = rows.groupby("arch")["trained_loops"].max()
    if by_arch.nunique() <= 1:
        return charts.budget_rules(int(by_arch.max()))
    archs = list(by_arch.index)
    return pd.DataFrame(
        {
            "x": by_arch.to_numpy(),
            "label": [f"T = {t} ({a})" for a, t in by_arch.items()],
            "series": [charts.series_label(a, "norm", archs) for a in archs],
        }
    )


def delta_section(per_seed: pd.DataFrame, x: str, x_title: str, budgets: pd.DataFrame | None, name: str) -> None:
    """Cliff's delta none vs norm per x, over seeds, with the magnitude bands and a caption."""
    if not {"norm", "none"} <= set(per_seed["boundary"]):
        st.info("Cliff's δ compares `none` with `norm`: select both modes to see it.")
        return
    summary = data.mode_comparison(per_seed[per_seed["boundary"].isin(["norm", "none"])], (x,))
    chart = charts.delta_chart(summary, x, x_title, budgets)
    n_a, n_b = int(summary["n_a"].max()), int(summary["n_b"].max())
    caption = (
        f"Positive: `none` better. Cliff's δ = P(none > norm) − P(none < norm) over seeds ({n_b} none vs "
        f"{n_a} norm), from engine.stats.summarize_modes; bars: 95% bootstrap CI resampling seeds within "
        "each mode (BCa, percentile fallback). Shading: |δ| < 0.147 negligible, < 0.33 small, < 0.474 medium, "
        "else large. p: two-sided Mann–Whitney U (in the CSV and tooltips)."
    )
    ui.figure(chart, summary, name, caption)


def n_per_series(per_seed: pd.DataFrame) -> int:
    return int(per_seed.groupby("series")["seed"].nunique().min()) if len(per_seed) else 0


def norm_ratios(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per series: the state norm's max/min over the steps shown, per seed; mean and worst seed."""
    by_seed = per_seed.groupby(["series", "seed"])["value"].agg(lambda v: v.max() / v.min() if v.min() > 0 else None)
    out = by_seed.groupby("series").agg(["mean", "max", "count"]).reset_index()
    names = {"series": "mode", "mean": "max/min ratio, mean over seeds", "max": "worst seed", "count": "seeds"}
    return out.rename(columns=names)


def modes_picker(rows: pd.DataFrame, default: Sequence[str] | None = None) -> list[str]:
    present = [m for m in charts.SERIES_ORDER if m in set(rows["boundary"])]
    return ui.some_of("modes", present, "modes", default, help="norm->none: trained with the norm, run without it.")


def norms_section(
    rows: pd.DataFrame,
    task: str,
    difficulty: str,
    modes: Sequence[str],
    name_prefix: str,
    tokens: pd.DataFrame | None = None,
) -> None:
    """State norm per step beside the top-token share per step, for the chosen task, difficulty and modes.
    tokens: the decoded top token per mode and step, where the rows' token ids are not engine.tasks'."""
    left, right = st.columns(2)
    with left:
        metric = ui.select(
            "state norm",
            ["norm_post", "norm_pre"],
            "norm",
            help="norm_post: the state handed to the next step; norm_pre: the block's output before the boundary.",
        )
    with right:
        log_y = ui.toggle("log scale", "log")
        show_seeds = ui.toggle("per-seed lines", "seeds")
    rows = rows[rows["boundary"].isin(modes) & (rows["arch"] == "looped")]
    if rows.empty:
        st.info("Nothing to draw: select at least one mode.")
        return
    budgets = budgets_of(rows)
    name = f"{name_prefix}-{task}-{difficulty}".replace(" ", "_")
    norm_col, share_col = st.columns(2)
    with norm_col:
        st.subheader("State norm per step")
        stats, per_seed = curves_of(rows, metric, difficulty)
        chart = charts.curves(
            stats,
            "eval_loops",
            charts.N_TITLE,
            METRIC_TITLES[metric],
            seeds=per_seed if show_seeds else None,
            budgets=budgets,
            y_domain=None,
            y_log=log_y,
        )
        what = "Mean state norm at the answer position, averaged over the chosen difficulties. "
        ui.figure(
            chart, stats, f"{name}-{metric}", charts.caption(n_per_series(per_seed), stats["ci_method"], None, what)
        )
        ratios = norm_ratios(per_seed)
        st.dataframe(ratios, hide_index=True, width="stretch", column_config=_ratio_format(ratios))
        st.caption(
            "Max/min of each seed's norm curve over steps 1..n shown. Paper (Ouro, norm removed): within 2.021×."
        )
    with share_col:
        st.subheader("Most frequent answer token per step")
        stats, per_seed = curves_of(rows, "top_token_share", difficulty)
        chart = charts.curves(
            stats,
            "eval_loops",
            charts.N_TITLE,
            METRIC_TITLES["top_token_share"],
            seeds=per_seed if show_seeds else None,
            budgets=budgets,
            chance=0.5,
            chance_label="balanced answers 0.5",
        )
        what = "1.0: the head gives one token for every example (it has committed). "
        caption = charts.caption(n_per_series(per_seed), stats["ci_method"], None, what)
        caption += " Labels are exactly balanced, so a correct model's share is 0.5 (dotted)."
        ui.figure(chart, stats, f"{name}-top_token_share", caption)
        tokens = top_tokens(rows, difficulty) if tokens is None else tokens[tokens["mode"].isin(modes)]
        if len(tokens):
            st.dataframe(tokens, hide_index=True, width="stretch")
            st.caption("The most frequent predicted token per step (the commonest over seeds and difficulties).")


def top_tokens(rows: pd.DataFrame, difficulty: str) -> pd.DataFrame:
    """The token most often predicted as the most frequent one, per mode and step (over seeds)."""
    picked = rows[(rows["metric"] == "top_token") & data.level_mask(rows, difficulty)]
    if picked.empty:
        return pd.DataFrame()
    modal = picked.groupby(["boundary", "eval_loops"])["value"].agg(lambda v: int(v.mode().iloc[0]))
    table = modal.unstack("eval_loops").map(data.token_name)
    table.columns = [f"n={n}" for n in table.columns]
    return table.reset_index().rename(columns={"boundary": "mode"})


def _ratio_format(ratios: pd.DataFrame) -> dict:
    return {c: st.column_config.NumberColumn(c, format="%.3f×") for c in ratios.columns if "ratio" in c or "worst" in c}
