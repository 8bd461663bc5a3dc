"""Page sections used by several pages: choose a table, draw a metric's curves, compare two modes."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from dashboard import caching, charts, data, results, ui
from engine import paper

METRIC_TITLES = {  # axis titles: short, with units; the captions say the rest
    "accuracy": "accuracy (fraction correct)",
    "choice_accuracy": "forced-choice accuracy (fraction)",
    "top_token_share": "top-token share (fraction)",
    "norm_post": "state norm ‖h_t‖ (L2, post-boundary)",
    "norm_pre": "state norm (L2, pre-boundary)",
    "recovery": "recovery (fraction regained)",
}


def _number(label: str, fmt: str = "%.3f"):
    return st.column_config.NumberColumn(label, format=fmt)


E3_COLUMNS = {  # labels of the engine's E3 summary columns (the data keep the engine's names)
    "refit_target": "refit target",
    "refit_steps": _number("steps", "%d"),
    "mean": _number("mean"),
    "ci_low": _number("95% CI low"),
    "ci_high": _number("95% CI high"),
    "n": _number("seeds", "%d"),
    "n_guarded": _number("seeds guarded", "%d"),
    "plateau": "plateau",
    "pooled": _number("pooled"),
    "same_as": "same parameters as",
}
E4_COLUMNS = {  # labels of engine.experiments.e4.compare's columns
    "mean_a": _number("stacked mean"),
    "mean_b": _number("looped mean"),
    "gap": _number("gap (looped − stacked)", "%+.3f"),
    "delta": _number("Cliff's δ", "%+.3f"),
    "delta_ci_low": _number("δ 95% CI low", "%+.3f"),
    "delta_ci_high": _number("δ 95% CI high", "%+.3f"),
    "magnitude": "|δ| magnitude",
    "p_value": _number("Mann–Whitney p", "%.3g"),
    "n_a": _number("stacked seeds", "%d"),
    "n_b": _number("looped seeds", "%d"),
}


def load(experiment: str, what: str, command: str) -> data.Table | None:
    """The experiment's table at the chosen preset, or the not-run-yet state (and None)."""
    preset = ui.pick_preset(experiment)
    if preset is None:
        ui.not_run_yet(f"{what} There is no `{experiment}-<preset>.parquet` under `{data.results_root()}`.", command)
        return None
    if preset not in data.presets(experiment):  # a study with a folder of its own that does not run this experiment
        others = " or ".join(f"`{p}`" for p in data.presets(experiment))
        elsewhere = f" Choose {others} above to see it." if others else ""
        ui.not_run_yet(
            f"The `{preset}` study has no `{experiment}-{preset}.parquet`: {experiment.upper()} is not run at this "
            f"study (docs/gpu-study.md).{elsewhere}",
            None,
        )
        return None
    table = data.table(experiment, preset)
    if table.rows is None:
        ui.not_run_yet(what, command, table.problems)
        return None
    return table


def pick_task(rows: pd.DataFrame, key: tuple | None = None) -> str:
    """The task, parity by default: the CPU studies' chain is a parity-like control (issue 43)."""
    tasks = caching.derived(key and (*key, "tasks"), lambda: sorted(rows["task"].unique()))
    return ui.select("task", tasks, "task", default="parity")


def pick_difficulty(options: Sequence[str], default: str | None = None) -> str:
    return ui.select(
        "difficulty (parity: length m; chain: hops k)",
        options,
        "difficulty",
        default,
        help="in-range: the difficulties the models were trained on; beyond-range: harder ones, never trained.",
    )


def task_and_difficulty(
    rows: pd.DataFrame, default: str | None = None, key: tuple | None = None
) -> tuple[pd.DataFrame, str, str]:
    """Task and difficulty selectors; returns the task's rows, the task and the difficulty choice. key: the
    table's (Table.key), so a repeat view reuses the task's rows and options (caching.derived)."""
    left, right = st.columns(2)
    with left:
        task = pick_task(rows, key)

    def of_task():
        picked = rows[rows["task"] == task]
        return picked, data.difficulty_options(picked)

    rows, options = caching.derived(key and (*key, "task", task), of_task)
    with right:
        difficulty = pick_difficulty(options, default)
    return rows, task, difficulty


KNOBS = {"parity": "m", "chain": "k"}


def _spans(values: Sequence[int]) -> str:
    """1, 2, 3, 5 -> '1–3, 5'."""
    values, out = sorted(set(int(v) for v in values)), []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ", ".join(f"{a}–{b}" if b > a + 1 else f"{a}, {b}" if b > a else f"{a}" for a, b in out)


def split_note(rows: pd.DataFrame, task: str, difficulty: str) -> str:
    """Where the plotted items come from (the rows' `split`): held out from training, seen in training, or
    beyond the training range, per difficulty; the sentence every accuracy figure's caption ends with."""
    picked = rows[data.level_mask(rows, difficulty)] if len(rows) else rows
    if "split" not in rows:
        return " Items: this table records no `split` (the first CPU study's in-range items were mostly seen)."
    knob = KNOBS.get(task, "difficulty")
    parts = []
    for split, words in data.SPLITS.items():
        at = picked.loc[picked["split"] == split, "difficulty"]
        if len(at):
            where = "the in-range mean, as E3 stores it" if set(at) == {0} else f"{knob} = {_spans(at)}"
            parts.append(f"{words} ({where})")
    return " Items (`split`): " + ("; ".join(parts) if parts else "none") + "."


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


def budgets_of(rows: pd.DataFrame, mode: str = "norm") -> pd.DataFrame:
    """A budget rule per architecture at its trained loop count T (one rule when all share T), in the colour
    of the architecture's `mode` series."""
    by_arch = rows.groupby("arch")["trained_loops"].max()
    if by_arch.nunique() <= 1:
        return charts.budget_rules(int(by_arch.max()))
    archs = list(by_arch.index)
    return pd.DataFrame(
        {
            "x": by_arch.to_numpy(),
            "label": [f"T = {t} ({a})" for a, t in by_arch.items()],
            "series": [charts.series_label(a, mode, archs) for a in archs],
        }
    )


def e3_series(summary: pd.DataFrame) -> pd.DataFrame:
    """An E3 summary (one task and n) as chart series: one per refit target."""
    return summary.rename(columns={"refit_target": "series"})


def e4_series(summary: pd.DataFrame, axis: str) -> pd.DataFrame:
    """E4 curves or per-seed values (one task and mode) as chart series `looped, <mode>` / `stacked, <mode>`,
    x under the axis' column name (charts.X_AXES)."""
    labels = [f"{a}, {m}" for a, m in zip(summary["arch"], summary["mode"], strict=True)]
    return summary.rename(columns={"x": charts.X_AXES[axis][0]}).assign(series=labels)


def e4_budgets(rows: pd.DataFrame, axis: str, mode: str) -> pd.DataFrame:
    """Where each model is at its budget: n = T per architecture, or the one point of matched overshoot."""
    if axis == "n":
        return budgets_of(rows, mode)
    return charts.budget_rules(1.0 if axis == "ratio" else 0, "n = T")


def delta_section(
    per_seed: pd.DataFrame,
    x: str,
    x_title: str,
    budgets: pd.DataFrame | None,
    name: str,
    note: str = "",
    title: str | None = None,
    key: tuple | None = None,
) -> None:
    """Cliff's delta none vs norm per x, over seeds, with the magnitude bands and a caption. key: what per_seed
    is (caching.derived), so a repeat view reuses the summary."""

    def computed() -> pd.DataFrame | None:
        if not {"norm", "none"} <= set(per_seed["boundary"].unique()):
            return None
        return data.mode_comparison(per_seed[per_seed["boundary"].isin(["norm", "none"])], (x,))

    summary = caching.derived(key and (*key, "delta", x), computed)
    if summary is None:
        st.info("Cliff's δ compares `none` with `norm`: select both modes to see it.")
        return
    chart = charts.delta_chart(summary, x, x_title, budgets)
    n_a, n_b = int(summary["n_a"].max()), int(summary["n_b"].max())
    caption = (
        f"Positive: `none` better. Cliff's δ = P(none > norm) − P(none < norm) over seeds ({n_b} none vs "
        f"{n_a} norm), from engine.core.stats.summarize_modes; bars: 95% bootstrap CI resampling seeds within "
        "each mode (BCa, percentile fallback). Shading: "
        + ", ".join(f"|δ| < {cut} {name}" for cut, name in paper.DELTA_MAGNITUDES)
        + ", else large. p: two-sided Mann–Whitney U (in the CSV and tooltips)."
        + note
    )
    ui.figure(chart, summary, name, caption, title)


def seed_differences(per_seed: pd.DataFrame, x: str, col: str, a: str, b: str) -> pd.DataFrame:
    """Per seed and x: value(a) - value(b) of the same seed (seed, x, diff), where the seed has both."""
    wide = per_seed[per_seed[col].isin([a, b])].pivot_table(index=["seed", x], columns=col, values="value")
    if not {a, b} <= set(wide.columns):
        return pd.DataFrame(columns=["seed", x, "diff"])
    return (wide[a] - wide[b]).dropna().rename("diff").reset_index()


PAIRED_COLUMNS = {
    "side": "side of T",
    "n_pairs": _number("seeds (pairs)", "%d"),
    "mean_diff": _number("mean difference", "%+.3f"),
    "ci_low": _number("95% CI low", "%+.3f"),
    "ci_high": _number("95% CI high", "%+.3f"),
    "wilcoxon_p": _number("Wilcoxon p", "%.3g"),
    "wilcoxon_p_holm": _number("Holm p", "%.3g"),
    "cliffs_delta": _number("Cliff's δ (unpaired)", "%+.3f"),
    "mann_whitney_p": _number("Mann–Whitney p", "%.3g"),
    "tost_p": _number("TOST p (post hoc)", "%.3g"),
}


def paired_section(
    per_seed: pd.DataFrame,
    x: str,
    x_title: str,
    col: str,
    pair: tuple[str, str],
    family_T: int,
    budgets: pd.DataFrame | None,
    name: str,
    what: str,
    title: str | None = None,
    key: tuple | None = None,
) -> pd.DataFrame | None:
    """The paired view: a - b of the same seed per x, one thin line per seed, the mean with its 95% CI, zero
    and T marked (charts.paired_chart), from engine.core.stats.paired_summary (Wilcoxon signed-rank, Holm
    within each side of family_T). Returns the summary (None where the pairs are missing). key: what per_seed
    is (caching.derived), so a repeat view reuses the differences and the summary."""
    a, b = pair

    def computed() -> tuple[pd.DataFrame, pd.DataFrame | None]:
        diffs = seed_differences(per_seed, x, col, a, b)
        if diffs.empty:
            return diffs, None
        both = per_seed[per_seed[x].isin(set(diffs[x]))]
        return diffs, data.paired_summary(both, x, col, a, b, family_T)

    diffs, summary = caching.derived(key and (*key, "paired", x, col, a, b, family_T), computed)
    if summary is None:
        st.info(f"The paired view needs `{a}` and `{b}` of the same seeds.")
        return None
    y_title = f"{a} − {b}, same seed"
    chart = charts.paired_chart(summary, diffs, x, x_title, y_title, budgets)
    caption = (
        f"{what}Thin lines: each seed's {a} − {b}; "
        f"black: their mean with a 95% bootstrap CI over seeds (engine.core.stats.paired_summary). Wilcoxon "
        "signed-rank p, Holm-corrected within docs/design.md's families, in the table and the tooltips."
    )
    ui.figure(chart, summary, name, caption, title)
    return summary


def paired_table(summary: pd.DataFrame, x: str, x_label: str, families: str = "the row's side of T") -> None:
    """Both analyses per x, as the verdict rules read them: the paired test beside the paper's unpaired one."""
    columns = [c for c in PAIRED_COLUMNS if c in summary]
    st.dataframe(
        summary[[x, *columns]],
        hide_index=True,
        width="stretch",
        height="content",
        column_config={x: x_label} | PAIRED_COLUMNS,
    )  # fmt: skip  (every n shown: no scrolling inside)
    st.caption(
        "Paired: mean per-seed difference, its 95% bootstrap CI, the two-sided Wilcoxon signed-rank p and its "
        f"Holm correction within {families}. Unpaired, as the paper reports: Cliff's δ and the two-sided "
        f"Mann–Whitney p, uncorrected. α = {paper.ALPHA}."
    )


# ---------------------------------------------------------------- two result sets


def comparison(experiment: str, preset_name: str) -> tuple[data.Table, str, str] | None:
    """The `compare with` controls: another preset's table of this experiment, in this results folder or in
    another (`vs_root`; a read-only copy offers only the folders in LOOPSCOPE_COMPARE). Returns (table, its
    label, this table's label), or None when nothing is chosen or found."""
    left, right = st.columns([2, 3])
    with right:
        folder = data.compare_folder(ui.compare_root_widget())
    others = [p for p in data.presets(experiment, folder) if folder is not None or p != preset_name]
    with left:
        chosen = ui.select(
            "compare with", ["nothing", *others], "vs", help="Overlay another result set: a preset (study) here, "
            "or in the other results folder."
        )  # fmt: skip
    if chosen == "nothing":
        return None
    other = data.table(experiment, chosen, folder)
    if other.rows is None:
        for problem in other.problems:
            st.error(problem)
        return None
    # another folder's (a workbench's) says so; its name as text, in a heading as in a legend
    label = chosen if folder is None else f"{chosen} @ {results.plain_name(folder.name)}"
    return other, label, preset_name


def compare_budgets(sets: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The budget rule of two result sets ({label: rows}): one where they share T, else one per set, labelled."""
    trained = {label: int(rows["trained_loops"].max()) for label, rows in sets.items()}
    if len(set(trained.values())) == 1:
        return charts.budget_rules(next(iter(trained.values())))
    return pd.concat([charts.budget_rules(T, f"T = {T} ({label})") for label, T in trained.items()], ignore_index=True)


def compare_section(
    sets: dict[str, tuple[pd.DataFrame, pd.DataFrame]],
    x: str,
    x_title: str,
    y_title: str,
    name: str,
    what: str,
    budgets: pd.DataFrame | None = None,
    title: str | None = None,
    **curve_kw,
) -> None:
    """Two result sets overlaid (each set's series dashed differently), then the difference of their means
    per x (first − second) with Cliff's δ and the Mann–Whitney p per x (engine.core.stats.summarize_modes;
    the sets' seeds are different models, so nothing is paired). sets: {label: (curve stats, per-seed values)}."""
    (first, (stats_a, seeds_a)), (second, (stats_b, seeds_b)) = sets.items()
    # one colour a series (its mode), one dash a set: each legend names one thing, its swatches all different (the
    # series' legend listed `norm · a` and `norm · b` with identical swatches, the dash legend was cut off)
    both = pd.concat([stats_a.assign(set=first), stats_b.assign(set=second)], ignore_index=True)
    chart = charts.curves(
        both,
        x,
        x_title,
        y_title,
        budgets=budgets,
        dash="set",
        legend_title="series",
        dash_title="result set",
        **curve_kw,
    )  # fmt: skip  (a dash legend tells the sets apart)
    caption = (
        f"{what}Solid: {first}; dashed: {second}; each the mean over its own seeds with its 95% bootstrap CI "
        "over seeds."
    )
    ui.figure(chart, both, f"{name}-compare", caption, f"{title} · {first} vs {second}" if title else None)
    keys = ["series", x]
    diffs = stats_a[[*keys, "mean"]].merge(stats_b[[*keys, "mean"]], on=keys, suffixes=("_a", "_b"))
    diffs = diffs.assign(diff=diffs["mean_a"] - diffs["mean_b"])
    per_seed = pd.concat([seeds_a.assign(set=first), seeds_b.assign(set=second)], ignore_index=True)
    tests = data.mode_comparison_by(per_seed, tuple(keys), "set", second, first)
    diffs = diffs.merge(tests[[*keys, "delta", "delta_ci_low", "delta_ci_high", "p_value"]], on=keys, how="left")
    chart = charts.difference_chart(diffs, x, x_title, f"{first} − {second}", budgets)
    caption = (
        f"Difference of the means per x, {first} − {second}. Cliff's δ ({first} vs {second}, over seeds) with its "
        "95% bootstrap CI and the two-sided Mann–Whitney p per x are in the CSV."
    )
    ui.figure(chart, diffs, f"{name}-difference", caption, f"{title} · {first} − {second}" if title else None)


def n_per_series(per_seed: pd.DataFrame) -> int:
    return int(per_seed.groupby("series")["seed"].nunique().min()) if len(per_seed) else 0


def norm_growth_table(rows: pd.DataFrame, modes: Sequence[str]) -> pd.DataFrame:
    """Claim (d)'s state-norm growth for each mode at the chosen difficulties, by the verdicts' one definition
    (engine.experiments.verdicts.norm_ratios: per seed, the norm per step averaged over the chosen difficulties,
    max/min over steps 1..n; ratio_summary over seeds): at n = T and at the largest n."""
    from engine.experiments import verdicts

    looped = rows[rows["arch"] == "looped"] if "arch" in rows else rows
    if looped.empty or not (looped["metric"] == "norm_post").any():
        return pd.DataFrame()
    T, last = int(looped["trained_loops"].max()), int(looped["eval_loops"].max())
    out = []
    for mode in modes:
        part = looped[looped["boundary"] == mode]
        for upto in dict.fromkeys((T, last)):
            s = verdicts.ratio_summary(verdicts.norm_ratios(part, upto))
            if s["seeds"]:
                out.append({"mode": mode, "steps": f"1..{upto}" + (" (T)" if upto == T else ""),
                            "worst seed max/min": s["worst"], "worst seed": s["worst_seed"],
                            "median max/min": s["median"], "mean max/min": s["mean"],
                            f"within {paper.SURGERY_NORM_BOUND:g}×": f"{s['within']} of {s['seeds']}"})  # fmt: skip
    return pd.DataFrame(out)


def modes_picker(rows: pd.DataFrame, default: Sequence[str] | None = None) -> list[str]:
    found = set(rows["boundary"].unique())  # not set(column): iterating an Arrow string column is slow
    present = [m for m in charts.SERIES_ORDER if m in found]
    return ui.some_of("modes", present, "modes", default, help="norm->none: trained with the norm, run without it.")


def norms_section(
    rows: pd.DataFrame,
    task: str,
    difficulty: str,
    modes: Sequence[str],
    name_prefix: str,
    tokens: pd.DataFrame | None = None,
    items: str | None = None,
    context: str | None = None,
    key: tuple | None = None,
) -> tuple[str, pd.DataFrame, pd.DataFrame] | None:
    """State norm per step beside the top-token share per step, for the chosen task, difficulty and modes.
    tokens: the decoded top token per mode and step, where the rows' token ids are not engine.core.tasks'.
    items: the captions' sentence on where the items come from, where the rows' `split` does not say (E1).
    context: the exports' title after the figure's name (study, task, level). key: what the rows are (the table's
    key and the task), so a repeat view reuses what was computed from them (caching.derived). Returns the state-norm
    metric shown with its curves and per-seed values (None when nothing is drawn)."""
    judged = items is None  # E2's table, judged by claim (d); E1's probe (items given) has no held-out mean
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

    def computed() -> dict | None:
        picked = rows[rows["boundary"].isin(modes) & (rows["arch"] == "looped")]
        if picked.empty:
            return None
        return {
            "budgets": budgets_of(picked),
            "items": split_note(picked, task, difficulty) if items is None else items,
            "norms": curves_of(picked, metric, difficulty),
            "growth": norm_growth_table(picked[data.level_mask(picked, difficulty)], modes),
            "shares": curves_of(picked, "top_token_share", difficulty),
            "tokens": top_tokens(picked, difficulty) if tokens is None else None,
        }

    found = caching.derived(key and (*key, "norms", difficulty, tuple(modes), metric, items, tokens is None), computed)
    if found is None:
        st.info("Nothing to draw: select at least one mode.")
        return None
    budgets, items = found["budgets"], found["items"]
    name = f"{name_prefix}-{task}-{difficulty}".replace(" ", "_")
    norm_col, share_col = st.columns(2)
    with norm_col:
        st.subheader("State norm per step")
        stats, per_seed = found["norms"]
        shown = metric, stats, per_seed
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
        caption = charts.caption(n_per_series(per_seed), stats["ci_method"], None, what)
        title = f"State norm per step ({metric}) · {context}" if context else None
        ui.figure(chart, stats, f"{name}-{metric}", caption + items, title)
        growth = found["growth"]
        if len(growth):
            config = _ratio_format(growth)
            st.dataframe(growth, hide_index=True, width="stretch", height="content", column_config=config)
            st.caption(
                "State-norm growth, one definition (engine.experiments.verdicts.norm_ratios): per seed, `norm_post` "
                "at each step averaged over the chosen difficulties, then max/min over steps 1..n; over seeds the "
                "worst seed (`worst`, its number `seed`: the one claim (d)'s verdict reads, the norm must stay "
                f"bounded for every seed), the median and the mean; `≤ {paper.SURGERY_NORM_BOUND:g}×`: the seeds "
                "within claim (d)'s bound. "
                + ("Claim (d)'s card shows the `norm->none` row at n = T at the held-out mean. " if judged else "")
                + f"Paper (Ouro, norm removed): within {paper.SURGERY_NORM_RATIO}×."
            )
    with share_col:
        st.subheader("Most frequent answer token per step")
        stats, per_seed = found["shares"]
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
        title = f"Top-token share per step · {context}" if context else None
        ui.figure(chart, stats, f"{name}-top_token_share", caption + items, title)
        tokens = found["tokens"] if tokens is None else tokens[tokens["mode"].isin(modes)]
        if len(tokens):
            tokens = tokens_by_step(tokens)  # a column per mode, a row per n: every column fits the half page
            st.dataframe(
                tokens, hide_index=True, width="stretch", height="content", column_config=_token_format(tokens)
            )
            st.caption(
                "The most frequent predicted token per step n (the commonest over seeds and difficulties), per mode."
            )
    return shown


def top_tokens(rows: pd.DataFrame, difficulty: str) -> pd.DataFrame:
    """The token most often predicted as the most frequent one, per mode and step (over seeds)."""
    picked = rows[(rows["metric"] == "top_token") & data.level_mask(rows, difficulty)]
    if picked.empty:
        return pd.DataFrame()
    modal = picked.groupby(["boundary", "eval_loops"])["value"].agg(lambda v: int(v.mode().iloc[0]))
    table = modal.unstack("eval_loops").map(data.token_name)
    table.columns = [f"n={n}" for n in table.columns]
    return table.reset_index().rename(columns={"boundary": "mode"})


# The room of a table in a half-page column (st.columns(2)) of a 1400 px window, sidebar open (layout "wide"): the
# main block is about 940 px, each half about 460 px less the table's border. A table there sets its columns' widths
# (px) to add up to at most this, so every column shows without a horizontal scroll.
HALF_PAGE_PX = 450
# norm_growth_table's columns in the state-norm half: (short label, width px, help); the caption under the table says
# what they are. `within <bound>×` is added by _ratio_format (the bound is paper.SURGERY_NORM_BOUND).
GROWTH_COLUMNS = {
    "mode": ("mode", 90, "The boundary mode (norm->none: trained with the norm, run without it)."),
    "steps": ("steps", 70, "The steps the max/min is taken over, 1..n; (T): the trained budget."),
    "worst seed max/min": ("worst", 60, "The worst seed's max/min state norm over the steps (claim (d) reads it)."),
    "worst seed": ("seed", 44, "Which seed is the worst."),
    "median max/min": ("median", 62, "The median over seeds of max/min."),
    "mean max/min": ("mean", 56, "The mean over seeds of max/min."),
}
WITHIN_WIDTH = 66  # `16 of 16`


def tokens_by_step(tokens: pd.DataFrame) -> pd.DataFrame:
    """top_tokens' table (a row per mode, a column `n=<n>` per step) turned: a row per step n, a column per mode."""
    turned = tokens.set_index("mode").T
    steps = [str(c).removeprefix("n=") for c in turned.index]
    turned.index = [int(n) for n in steps] if all(n.isdigit() for n in steps) else steps  # sorts as numbers
    turned = turned.rename_axis("n").reset_index()
    turned.columns.name = None
    return turned


TOKEN_N_WIDTH = 60  # the token table's n column; the modes share the rest of HALF_PAGE_PX, at most TOKEN_MODE_WIDTH
TOKEN_MODE_WIDTH = 130


def _token_format(tokens: pd.DataFrame) -> dict:
    """tokens_by_step's column_config: widths in px that fit HALF_PAGE_PX, whatever the number of modes."""
    modes = [c for c in tokens.columns if c != "n"]
    width = min(TOKEN_MODE_WIDTH, (HALF_PAGE_PX - TOKEN_N_WIDTH) // max(len(modes), 1))
    help_n = "The inference loop count n (loop steps)."
    column = (
        st.column_config.NumberColumn if pd.api.types.is_numeric_dtype(tokens["n"]) else st.column_config.TextColumn
    )
    return {"n": column("n", width=TOKEN_N_WIDTH, help=help_n)} | {
        m: st.column_config.TextColumn(m, width=width) for m in modes
    }


def _ratio_format(ratios: pd.DataFrame) -> dict:
    """norm_growth_table's column_config: short labels (help on hover) and widths in px that fit HALF_PAGE_PX."""
    config = {}
    for c in ratios.columns:
        if c.startswith("within "):
            bound = c.removeprefix("within ")
            text = f"Seeds whose max/min is {c} (claim (d)'s bound)."
            config[c] = st.column_config.TextColumn(f"≤ {bound}", width=WITHIN_WIDTH, help=text)
            continue
        label, width, text = GROWTH_COLUMNS.get(c, (c, None, None))
        if "max/min" in c:
            config[c] = st.column_config.NumberColumn(label, width=width, help=text, format="%.2f×")
        elif c == "worst seed":
            config[c] = st.column_config.NumberColumn(label, width=width, help=text, format="%d")
        else:
            config[c] = st.column_config.TextColumn(label, width=width, help=text)
    return config
