"""E2: training with versus without the loop-boundary norm, from scratch, many seeds per mode.

For each task and mode, train the seeds at budget T, evaluate n = 1..3T over in-range and beyond-range
difficulties, and also run every norm-trained model without the norm (the from-scratch analogue of the
surgery on released weights). Summaries are per n over seeds: mean accuracy with a bootstrap CI per
mode, Cliff's delta (none vs norm) with its CI, and the Mann-Whitney p-value.
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

TITLE = "norm vs none from scratch"
TASKS = TASK_NAMES


def trainings(preset_name: str, tasks=TASKS) -> list[tuple[RunConfig, str]]:
    """The configurations E2 trains, each with the experiment that owns its runs (read by the Ray fan-out)."""
    return [(preset(preset_name, task, boundary), "e2") for task in tasks for boundary in BOUNDARIES]


def run(
    preset_name: str, seeds: list[int], store: Store, device: str = "cpu", tasks=TASKS, progress: bool = True
) -> pd.DataFrame:
    """Train, evaluate and store what is missing; write the e2 table; return its rows."""
    from engine.experiments.runs import run_trainings  # training code: only when running

    # the surgery: norm-trained models also run without the norm
    surgery = lambda cfg: cfg.model.boundary == "norm"  # noqa: E731
    return run_trainings("e2", preset_name, trainings(preset_name, tasks), seeds, store, device, progress, surgery)


def summarize(rows: pd.DataFrame, preset_name: str) -> pd.DataFrame:
    """Per (task, range, n): each mode's mean accuracy with CI, delta (none - norm) with CI, p, and the accuracy of
    the norm-trained models run without the norm (`surgery_acc`): the per-n table `loopscope run e2` prints."""
    rows = stats.with_range(rows, train_ranges(preset_name, rows["task"].unique()))
    by = ["task", "range", "eval_loops"]
    acc = stats.seed_means(rows[rows["boundary"].isin(BOUNDARIES)], "accuracy", [*by, "boundary"])
    summary = stats.summarize_modes(acc, group_cols=tuple(by), a="norm", b="none")
    cut = rows[rows["boundary"] == "norm->none"]
    surgery = stats.seed_means(cut, "accuracy", by).groupby(by)["value"].mean().rename("surgery_acc").reset_index()
    return summary.merge(surgery, on=by, how="left")


def claims(rows: pd.DataFrame, preset_name: str) -> list[Claim]:
    """E2 (a)-(d) by docs/design.md's verdict rules (engine.experiments.verdicts), under both analyses, at the held-out
    mean and the hardest held-out difficulty; a table without held-out items is judged on its in-range ones."""
    judged = verdicts.judged_items(rows, train_ranges(preset_name, rows["task"].unique()))
    return verdicts.e2_claims(verdicts.paired_modes(judged), verdicts.surgery_at_T(judged))


def format_summary(summary: pd.DataFrame) -> str:
    """A per-n table per task and range for the terminal."""
    lines = []
    for (task, rng), s in summary.groupby(["task", "range"], sort=False):
        lines.append(f"\n{task}, {rng} difficulties (n = {int(s['n_a'].max())} seeds per mode; 95% bootstrap CIs)")
        lines.append("   n   norm [CI]             none [CI]             delta [CI]              p       surgery acc")
        for _, r in s.sort_values("eval_loops").iterrows():
            lines.append(
                f"{int(r.eval_loops):4d}   {r.mean_a:.3f} [{r.ci_a_low:.3f}, {r.ci_a_high:.3f}]"
                f"   {r.mean_b:.3f} [{r.ci_b_low:.3f}, {r.ci_b_high:.3f}]"
                f"   {r.delta:+.3f} [{r.delta_ci_low:+.3f}, {r.delta_ci_high:+.3f}]"
                f"   {r.p_value:.3g}   {r.get('surgery_acc', float('nan')):.3f}"
            )
    return "\n".join(lines)


def report(rows: pd.DataFrame, preset_name: str) -> str:
    """What `loopscope run e2` prints: the per-n table, then the verdicts."""
    return "\n".join([format_summary(summarize(rows, preset_name)), *verdicts.lines(claims(rows, preset_name))])
