"""The second study's verdict rules (README, "Verdict rules"), each claim under two analyses and three levels.

Levels: (i) `held-out mean`, each seed's accuracy averaged over the held-out in-range difficulties; (ii) each
held-out in-range difficulty; (iii) the hardest held-out in-range difficulty. Analyses: the paper's
(Cliff's delta and Mann-Whitney p per n, unpaired, uncorrected) and the paired one (per-seed differences,
Wilcoxon signed-rank, Holm across n within each side of T). Pure functions: rows in, tables and claims out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from engine import paper
from engine.core import stats

MEAN, HARDEST = "held-out mean", "hardest held-out"
NEGLIGIBLE, _, LARGE = (cut for cut, _ in paper.DELTA_MAGNITUDES)
CLOSEST_TOL = 0.01  # E2 (b): |d(T)| may exceed the smallest |d(n)| by this much (ties at the ceiling)


def levels(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of the held-out in-range items at the three levels, in a column `level` (difficulty as text for
    (ii), MEAN for (i), HARDEST for (iii)); each seed has one value per (level, eval_loops, boundary, metric)."""
    held = rows[rows["split"] == "heldout"]
    keys = ["task", "arch", "boundary", "seed", "trained_loops", "eval_loops", "metric"]
    each = held.assign(level=held["difficulty"].astype(str))
    mean = held.groupby(keys, as_index=False)["value"].mean().assign(level=MEAN)
    hardest = held[held["difficulty"] == held.groupby("task")["difficulty"].transform("max")]
    return pd.concat([mean, each, hardest.assign(level=HARDEST)], ignore_index=True)[[*keys, "level", "value"]]


def paired_modes(rows: pd.DataFrame, a: str = "none", b: str = "norm") -> pd.DataFrame:
    """Per task, level and n: both analyses of mode a against mode b (stats.paired_summary on accuracy)."""
    acc = levels(rows)
    acc = acc[(acc["metric"] == "accuracy") & (acc["arch"] == "looped")]
    return stats.paired_summary(acc, ["task", "level", "eval_loops"], "boundary", a, b)


def e2_claims(table: pd.DataFrame, surgery: pd.DataFrame) -> list[dict]:
    """E2 (a)-(d) per task at levels (i) and (iii), under both analyses; `table` from paired_modes, `surgery`
    from surgery_at_T. Each claim also says at how many held-out difficulties (level ii) it holds."""
    out = []
    for task, t in table.groupby("task"):
        T = int(t["trained_loops"].iloc[0])
        per_level = {lvl: e2_level(s.set_index("eval_loops").sort_index(), T) for lvl, s in t.groupby("level")}
        each = [lvl for lvl in per_level if lvl not in (MEAN, HARDEST)]
        for claim in ("a", "b", "c"):
            for analysis in ("paper", "paired"):
                held = sum(per_level[lvl][claim][analysis][0] for lvl in each)
                for lvl in (MEAN, HARDEST):
                    ok, measured = per_level[lvl][claim][analysis]
                    out.append(dict(task=task, claim=claim, analysis=analysis, level=lvl, holds=ok,
                                    measured=measured, difficulties=f"{held}/{len(each)}"))  # fmt: skip
        for lvl in (MEAN, HARDEST):
            r = surgery[(surgery["task"] == task) & (surgery["level"] == lvl)]
            if r.empty:
                continue
            r = r.iloc[0]
            ok = bool(
                r["accuracy"] <= paper.SURGERY_COLLAPSE_ACCURACY
                and r["top_token_share"] >= paper.SURGERY_ONE_TOKEN_SHARE
                and r["norm_ratio"] <= paper.SURGERY_NORM_BOUND
            )
            measured = (
                f"accuracy {r['accuracy']:.3f} (forced choice {r['choice_accuracy']:.3f}, non-answer tokens "
                f"{r['non_answer']:.3f}), norm ratio {r['norm_ratio']:.2f}x, "
                f"top-token share {r['top_token_share']:.3f}; "
                f"damage {r['damage']:+.3f} [{r['damage_ci_low']:+.3f}, {r['damage_ci_high']:+.3f}], "
                f"Wilcoxon p {r['damage_p']:.3g}"
            )
            for analysis in ("paper", "paired"):
                out.append(dict(task=task, claim="d", analysis=analysis, level=lvl, holds=ok, measured=measured,
                                difficulties=""))  # fmt: skip
    return out


def e2_level(s: pd.DataFrame, T: int) -> dict:
    """Claims (a)-(c) at one level: {claim: {analysis: (holds, measured)}}; s is indexed by n."""
    d, delta, p, holm = s["mean_diff"], s["cliffs_delta"], s["mann_whitney_p"], s["wilcoxon_p_holm"]
    below, beyond = s.index < T, s.index > T
    worse_paper = s[(delta < -NEGLIGIBLE) & (p < paper.ALPHA)]
    worse_paired = s[(d < 0) & (holm < paper.ALPHA)]
    gap, others = d.abs(), d.drop(T).abs()
    closest = bool(gap.loc[T] <= others.min() + CLOSEST_TOL)
    sep_paper = bool(
        ((delta >= LARGE) & (p < paper.ALPHA) & below).any()
        and ((delta >= LARGE) & (p < paper.ALPHA) & beyond).any()
        and delta[beyond].max() >= delta[below].max()
    )
    sep_paired = bool(
        ((d > 0) & (holm < paper.ALPHA) & below).any()
        and ((d > 0) & (holm < paper.ALPHA) & beyond).any()
        and d[beyond].max() >= d[below].max()
    )
    return {
        "a": {
            "paper": (worse_paper.empty, f"min delta {delta.min():+.3f} at n={delta.idxmin()}"),
            "paired": (
                worse_paired.empty,
                f"min mean d {d.min():+.3f} at n={d.idxmin()} (Holm p {holm[d.idxmin()]:.3g})",
            ),
        },
        "b": {
            "paper": (
                closest,
                f"|d| {gap.loc[T]:.3f} at n=T, smallest elsewhere {others.min():.3f} at n={others.idxmin()}",
            ),
            "paired": (
                bool(closest and s.loc[T, "wilcoxon_p"] >= paper.ALPHA),
                f"|d| {gap.loc[T]:.3f} at n=T (Wilcoxon p {s.loc[T, 'wilcoxon_p']:.3g})",
            ),
        },  # fmt: skip
        "c": {
            "paper": (
                sep_paper,
                f"max delta below T {delta[below].max():+.3f}, beyond {delta[beyond].max():+.3f} "
                f"at n={delta[beyond].idxmax()}",
            ),
            "paired": (
                sep_paired,
                f"max mean d below T {d[below].max():+.3f}, beyond {d[beyond].max():+.3f} "
                f"(Holm p {holm[d[beyond].idxmax()]:.3g})",
            ),
        },  # fmt: skip
    }


def surgery_at_T(rows: pd.DataFrame) -> pd.DataFrame:
    """Per task and level, the norm-trained models run without the norm at n = T: accuracy, forced choice,
    non-answer share, top-token share, the worst seed's state-norm max/min over steps 1..T, and the damage
    (norm minus norm->none, per seed) with its paired CI and Wilcoxon p."""
    lv = levels(rows)
    lv = lv[lv["arch"] == "looped"]
    T = lv["trained_loops"].iloc[0]
    out = []
    for (task, level), g in lv.groupby(["task", "level"]):
        cut, own = g[g["boundary"] == "norm->none"], g[g["boundary"] == "norm"]
        at_t = cut[cut["eval_loops"] == T]

        def mean(metric, frame=at_t):
            return float(frame.loc[frame["metric"] == metric, "value"].mean())

        norms = cut[(cut["metric"] == "norm_post") & (cut["eval_loops"] <= T)].groupby("seed")["value"]
        acc = lambda f: f[(f["metric"] == "accuracy") & (f["eval_loops"] == T)].set_index("seed")["value"]  # noqa: E731
        damage = (acc(own) - acc(cut)).dropna()
        ci = stats.paired_mean_ci(damage.to_numpy()) if len(damage) else stats.CI(np.nan, np.nan, np.nan, "")
        out.append(dict(
            task=task, level=level, accuracy=mean("accuracy"), choice_accuracy=mean("choice_accuracy"),
            non_answer=1 - mean("option_rate") if (at_t["metric"] == "option_rate").any() else np.nan,
            top_token_share=mean("top_token_share"), norm_ratio=float((norms.max() / norms.min()).max()),
            damage=ci.estimate, damage_ci_low=ci.low, damage_ci_high=ci.high,
            damage_p=stats.wilcoxon_p(acc(own)[damage.index], acc(cut)[damage.index]) if len(damage) else np.nan,
        ))  # fmt: skip
    return pd.DataFrame(out)


def claim_lines(found: list[dict]) -> list[str]:
    """One line per claim, analysis and level, for the terminal."""
    return [
        f"({c['claim']}) {c['task']} [{c['analysis']}, {c['level']}]: {'holds' if c['holds'] else 'does NOT hold'}"
        + (f" (at {c['difficulties']} held-out difficulties)" if c["difficulties"] else "")
        + f" -- {c['measured']}"
        for c in found
    ]
