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

from engine import paper
from engine.core import stats
from engine.core.model import BOUNDARIES
from engine.core.presets import RunConfig, preset
from engine.core.store import Store
from engine.core.tasks import TASK_NAMES

TITLE = "looped vs stacked"
NEGLIGIBLE = paper.DELTA_MAGNITUDES[0][0]
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


def claims(summary: pd.DataFrame, trained_loops: dict | None = None) -> list[dict]:
    """Looping's advantage at equal n, and what is left of it at matched overshoot ratio (norm mode),
    from summarize()'s table (each row's own T is in the rows already)."""
    out = []
    norm = summary[summary["mode"] == "norm"]
    equal, matched = norm[norm["axis"] == "n"], norm[norm["axis"] == "ratio"]
    for task in sorted(equal["task"].unique()):
        e, m = equal[equal["task"] == task], matched[matched["task"] == task]
        e = e[e["x"] > 1]  # at n = 1 neither has overshot... the stacked one is at its budget
        vanished = bool(((m["delta"].abs() < NEGLIGIBLE) | (m["p_value"] >= paper.ALPHA)).all())
        out.append(
            {
                "task": task,
                "claim": "equal n",
                "text": "looping is better than stacking at equal inference loop count",
                "paper": "an advantage of looping at equal n",
                "measured": f"mean gap {e['gap'].mean():+.3f}, mean delta {e['delta'].mean():+.3f} over n = 2..",
                "reproduced": bool(e["gap"].mean() > 0 and (e["delta"] > NEGLIGIBLE).mean() >= 0.5),
            }
        )
        out.append(
            {
                "task": task,
                "claim": "matched n/T",
                "text": "at matched overshoot the advantage vanishes or shrinks",
                "paper": "vanishes on one task, shrinks on the other",
                "measured": f"{'vanishes' if vanished else 'remains'}: mean gap {m['gap'].mean():+.3f} "
                f"(equal n: {e['gap'].mean():+.3f}), max |delta| {m['delta'].abs().max():.3f}",
                "reproduced": bool(vanished or abs(m["gap"].mean()) < abs(e["gap"].mean())),
            }
        )
    return out


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
    from engine.experiments.e2 import claim_lines

    summary = summarize(rows, preset_name)
    return "\n".join([format_summary(summary), "", *claim_lines(claims(summary))])
