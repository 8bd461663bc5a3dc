"""E4: looped versus stacked depth, at equal inference loop count and at matched overshoot.

The stacked twin of a looped model (L layers, budget T, tied) has L*T distinct layers run once
(budget 1). Running either with n loops overshoots its budget by o = n / T (ratio) or n - T
(difference). Comparing the two at equal n compares a looped model at overshoot n/T with a stacked
one at overshoot n; matching o removes that confound.

With a budget of 1, training with and without the boundary norm is the same computation (the two
modes are bit-identical at n = 1), so one stacked model per seed serves both modes: it is trained
with `norm` and evaluated in `norm` and in `none` (stored as `norm->none`).
"""

from __future__ import annotations

import pandas as pd

from engine.core import stats
from engine.core.model import BOUNDARIES
from engine.core.presets import RunConfig, preset, train_ranges
from engine.core.store import Store
from engine.core.tasks import TASK_NAMES
from engine.experiments import verdicts
from engine.experiments.verdicts import Claim

TITLE = "looped vs stacked"
TASKS = TASK_NAMES
AXES = {"n": "inference loop count n", "ratio": "overshoot ratio n/T", "difference": "overshoot n − T"}


def trainings(preset_name: str, tasks=TASKS) -> list[tuple[RunConfig, str]]:
    """Per task: E2's looped models (reused, or trained as E2's if E2 has not run) and the stacked twin."""
    out = []
    for task in tasks:
        out += [(preset(preset_name, task, boundary), "e2") for boundary in BOUNDARIES]
        out.append((preset(preset_name, task, "norm", arch="stacked"), "e4"))
    return out


def run(
    preset_name: str, seeds: list[int], store: Store, device: str = "cpu", tasks=TASKS, progress: bool = True
) -> pd.DataFrame:
    """Stacked models (new) beside E2's looped ones (reused from the cache); writes the e4 table."""
    from engine.experiments.runs import run_trainings  # training code: only when running

    surgery = lambda cfg: cfg.model.arch == "stacked"  # noqa: E731  (evaluated in both modes: module docstring)
    return run_trainings("e4", preset_name, trainings(preset_name, tasks), seeds, store, device, progress, surgery)


def with_overshoot(rows: pd.DataFrame) -> pd.DataFrame:
    """Derive overshoot from the stored columns, and the mode each row stands for."""
    mode = rows["boundary"].where(~((rows["arch"] == "stacked") & (rows["boundary"] == "norm->none")), "none")
    return rows.assign(
        mode=mode,
        ratio=rows["eval_loops"] / rows["trained_loops"],
        difference=rows["eval_loops"] - rows["trained_loops"],
    )


def seed_values(rows: pd.DataFrame, axis: str = "n", metric: str = "accuracy") -> pd.DataFrame:
    """One value per seed, task, mode (with_overshoot's: a stacked `norm->none` stands for `none`), arch and
    x (the axis: n, ratio n/T or difference n - T): the metric averaged over the rows' difficulties."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {', '.join(AXES)}, got {axis!r}.")
    rows = with_overshoot(rows[rows["metric"] == metric])
    rows = rows[rows["mode"].isin(BOUNDARIES)].assign(x=rows["eval_loops"] if axis == "n" else rows[axis])
    return stats.seed_means(rows, metric, ["task", "mode", "x", "arch"])


def curves(rows: pd.DataFrame, axis: str = "n", metric: str = "accuracy") -> pd.DataFrame:
    """Per task, mode, arch and x: the mean of seed_values() with its 95% bootstrap CI over seeds (every x
    an architecture reaches, also where the other has no model)."""
    summary = stats.mean_ci(seed_values(rows, axis, metric), ["task", "mode", "arch", "x"])
    return summary.assign(axis=axis)


def compare(rows: pd.DataFrame, axis: str = "n", metric: str = "accuracy") -> pd.DataFrame:
    """Looped vs stacked per task, mode and x (n, ratio or difference), over seeds, the rows' difficulties
    pooled (in-range and beyond for the whole table): Cliff's delta is looped vs stacked (positive: looping
    is better), gap = looped mean - stacked mean; only the x where both architectures have a model."""
    per_seed = seed_values(rows, axis, metric)
    both = per_seed.groupby(["task", "mode", "x"])["arch"].transform("nunique") == 2  # x where both exist
    summary = stats.summarize_modes(
        per_seed[both], group_cols=("task", "mode", "x"), mode_col="arch", a="stacked", b="looped"
    )
    return summary.assign(axis=axis, gap=summary["mean_b"] - summary["mean_a"])


def summarize(rows: pd.DataFrame, preset_name: str | None = None) -> pd.DataFrame:
    """compare() on every axis, stacked: one row per (axis, task, mode, x)."""
    return pd.concat([compare(rows, axis) for axis in AXES], ignore_index=True)


def claims(rows: pd.DataFrame, preset_name: str) -> list[Claim]:
    """E4 by docs/design.md's verdict rules (engine.experiments.verdicts.e4_table, e4_claims): looping's advantage at
    equal n and what is left of it at matched overshoot, under both analyses, at the held-out mean and the hardest
    held-out difficulty; a table without held-out items is judged on its in-range ones."""
    judged = verdicts.judged_items(rows, train_ranges(preset_name, rows["task"].unique()))
    table = verdicts.e4_table(judged)
    return verdicts.e4_claims(table) if len(table) else []


def format_summary(summary: pd.DataFrame) -> str:
    lines = []
    for axis in ("n", "ratio"):
        s = summary[summary["axis"] == axis]
        for (task, mode), part in s.groupby(["task", "mode"]):
            lines.append(
                f"\n{task}, {mode}: looped vs stacked at equal {AXES[axis]} (n = {int(part['n_a'].max())} seeds)"
            )
            lines.append("      x   stacked   looped    gap      delta     p")
            for _, r in part.sort_values("x").iterrows():
                lines.append(
                    f"{r.x:7.2f}   {r.mean_a:.3f}     {r.mean_b:.3f}    {r.gap:+.3f}   {r.delta:+.3f}   {r.p_value:.3g}"
                )
    return "\n".join(lines)


def report(rows: pd.DataFrame, preset_name: str) -> str:
    """What `loopscope run e4` prints: looped vs stacked per x, then the verdicts."""
    return "\n".join([format_summary(summarize(rows, preset_name)), *verdicts.lines(claims(rows, preset_name))])
