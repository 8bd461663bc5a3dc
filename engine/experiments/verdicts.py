"""The verdict rules (docs/design.md, "Verdict rules"), each claim under two analyses and three levels, for every study;
Claim, the one shape of a verdict; and the one definition of claim (d)'s norm ratio (norm_ratios).

E2, E3 and E4 each judge their table here through their own `claims(rows, preset)`; a table without held-out items
(the first CPU study's, a smoke run's) is judged on its in-range items (judged_items).

Levels: (i) `held-out mean`, each seed's accuracy averaged over the held-out in-range difficulties; (ii) each
held-out in-range difficulty; (iii) the hardest held-out in-range difficulty. Analyses: the paper's
(Cliff's delta and Mann-Whitney p per n, unpaired, uncorrected) and the paired one (per-seed differences,
Wilcoxon signed-rank, Holm across n within each side of T). Both judge only the n where every paired seed (a seed
with both members of the comparison: E2's two modes, E4's looped model and its stacked twin) has both (complete_n;
e4_table): a seed evaluated further than the others (`loopscope eval`) never tips a rule by where its twin is missing.
Pure functions: rows in, tables and claims out. No torch here: the dashboard's pages import this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache

import numpy as np
import pandas as pd

from engine import paper
from engine.core import stats

MEAN, HARDEST = "held-out mean", "hardest held-out"
IN_RANGE = 0  # E3 stores the recovery of the in-range mean accuracy at this difficulty


@dataclass(frozen=True)
class Claim:
    """One verdict, the one shape every experiment's `claims(rows, preset)` returns and the CLI, the dashboard and
    the report print: what is claimed, the paper's value, the measured value, the criterion that decides it, and
    the outcome (outcome(): holds / does NOT hold / undecided, or a named outcome such as "vanishes" or E5's
    "agreement") under one analysis (`paper`: unpaired, as the paper; `paired`: per-seed differences) at one level
    (MEAN, HARDEST). difficulties: at how many held-out difficulties it holds ("k/N"), where counted."""

    experiment: str
    task: str
    claim: str
    text: str
    paper: str
    measured: str
    criterion: str
    analysis: str
    level: str
    outcome: str
    difficulties: str = ""
    beyond_paper: bool = False

    def line(self) -> str:
        """The claim in one line, for the terminal."""
        where = f" (at {self.difficulties} held-out difficulties)" if self.difficulties else ""
        return (f"[{self.experiment.upper()}] ({self.claim}) {self.task} [{self.analysis}, {self.level}]: "
                f"{self.outcome}{where} -- {self.measured}")  # fmt: skip

    def as_dict(self) -> dict:
        return asdict(self)


# (experiment, claim) -> (what is claimed, the paper's value, the criterion: docs/design.md, "Verdict rules")
WORDS = {
    ("e2", "a"): ("`none` is never worse than `norm` at any n", "never worse at any n",
                  f"paper: no n with Cliff's δ < -{paper.DELTA_MAGNITUDES[0][0]} and Mann-Whitney p < {paper.ALPHA}; "
                  f"paired: no n with mean d < 0 and Holm p < {paper.ALPHA}"),
    ("e2", "b"): ("the two modes are closest at n = T", "closest at n = T",
                  "|d(T)| within 0.01 of the smallest |d(n)| elsewhere; paired: and Wilcoxon p at T >= "
                  f"{paper.ALPHA}"),
    ("e2", "c"): ("they separate on both sides of T, most beyond it",
                  f"Cliff's δ up to {paper.MAX_DELTA_BEYOND} beyond the budget",
                  f"a significant (p < {paper.ALPHA}) separation below and beyond T (paper: large Cliff's δ; paired: "
                  "mean d > 0, Holm), the largest beyond T"),
    ("e2", "d"): ("norm-trained models run without the norm collapse by n = T, the norm bounded, one token",
                  f"accuracy {paper.SURGERY_ACCURACY_AT_T:.3f} at n = T, norm within {paper.SURGERY_NORM_RATIO}×, "
                  "one token",
                  f"at n = T: accuracy <= {paper.SURGERY_COLLAPSE_ACCURACY}, top-token share >= "
                  f"{paper.SURGERY_ONE_TOKEN_SHARE}, norm ratio (norm_ratios, worst seed) <= "
                  f"{paper.SURGERY_NORM_BOUND:g}"),
    ("e3", "a"): ("refitting the head alone recovers about a third, then plateaus", "recovery ≈ 1/3, plateau",
                  f"mean recovery at n = T in {list(paper.HEAD_RECOVERY_RANGE)} and plateaued; undecided with fewer "
                  "than 8 damaged seeds"),
    ("e3", "b"): ("refitting the head with the block's last layer recovers all of it", "recovery ≈ 1",
                  f"mean recovery at n = T >= {paper.FULL_RECOVERY}; undecided with fewer than 8 damaged seeds"),
    ("e3", "last layer"): ("the damage sits in the last layer: head + last recovers more than head + first",
                           "— (beyond the paper)", f"head+last minus head+first > 0, Wilcoxon p < {paper.ALPHA}"),
    ("e4", "equal n"): ("looping is better than stacking at equal n", "an advantage of looping at equal n",
                        "looped ahead, significantly, at most n = 2..3T (paper: Cliff's δ and p; paired: Holm)"),
    ("e4", "matched"): ("at matched overshoot n/T = 1, 2, 3 the advantage vanishes on one task, shrinks on the other",
                        "vanishes on one task, shrinks on the other",
                        "vanishes: no significant gap at any matched o (or |gap| < 0.02, paired); shrinks: a smaller "
                        "mean gap than at equal n = T, 2T, 3T"),
}  # fmt: skip


def _claim(experiment: str, name: str, task: str, analysis: str, level: str, holds, measured: str,
          difficulties: str = "") -> Claim:  # fmt: skip
    """A Claim of the verdict rules (docs/design.md), its words from WORDS."""
    text, figure, criterion = WORDS[(experiment, name)]
    return Claim(experiment=experiment, task=task, claim=name, text=text, paper=figure, measured=measured,
                 criterion=criterion, analysis=analysis, level=level, outcome=outcome(holds),
                 difficulties=difficulties)  # fmt: skip


def judged_items(rows: pd.DataFrame, in_range: dict[str, tuple[int, ...]]) -> pd.DataFrame:
    """The rows the rules judge as held out: the table's held-out items, or, where it has none (the smoke preset,
    the first CPU study's tables of an earlier design), its in-range difficulties (`in_range`, per task; E3's
    in-range mean IN_RANGE with them) standing in, as E5 reads such tables."""
    if "split" in rows and (rows["split"] == "heldout").any():
        return rows
    inside = [d == IN_RANGE or d in in_range.get(t, ()) for t, d in zip(rows["task"], rows["difficulty"], strict=True)]
    return rows.assign(split=np.where(inside, "heldout", "beyond"))


def plateaued(curve: pd.Series) -> bool:
    """E3's plateau rule: a curve over refit steps whose last PLATEAU_WINDOW intervals each move by < PLATEAU_TOL."""
    tail = curve.sort_index().to_numpy(dtype=float)[-(paper.PLATEAU_WINDOW + 1) :]
    return len(tail) == paper.PLATEAU_WINDOW + 1 and bool(np.all(np.abs(np.diff(tail)) < paper.PLATEAU_TOL))


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


def complete_n(values: pd.DataFrame, by: list[str], col: str, a: str, b: str, x: str = "eval_loops") -> pd.DataFrame:
    """The values of a and b (column col; one per seed, group of `by` and x), kept at the x where every paired seed
    of their group (one with values of both a and b) has both: an x where one of them lacks either is dropped whole,
    so a paired rule reads the same seeds at every x it judges."""
    pick = values[values[col].isin([a, b])]
    arms = pick.groupby([*by, "seed"])[col].nunique()
    paired = arms[arms == 2].reset_index()[[*by, "seed"]]
    per_x = pick.groupby([*by, x, "seed"])[col].nunique()
    have = per_x[per_x == 2].reset_index().merge(paired, on=[*by, "seed"]).groupby([*by, x])["seed"].nunique()
    need = paired.groupby(by)["seed"].nunique().reindex(have.index.droplevel(x))
    full = have[have.to_numpy() == need.to_numpy()]
    return pick.merge(full.index.to_frame(index=False), on=[*by, x])


def paired_modes(rows: pd.DataFrame, a: str = "none", b: str = "norm") -> pd.DataFrame:
    """Per task, level and n: both analyses of mode a against mode b (stats.paired_summary on accuracy), at the n
    where every paired seed has both modes (complete_n)."""
    acc = levels(rows)
    acc = acc[(acc["metric"] == "accuracy") & (acc["arch"] == "looped")]
    acc = complete_n(acc, ["task", "level"], "boundary", a, b)
    return stats.paired_summary(acc, ["task", "level", "eval_loops"], "boundary", a, b)


def e2_claims(table: pd.DataFrame, surgery: pd.DataFrame) -> list[Claim]:
    """E2 (a)-(d) per task at levels (i) and (iii), under both analyses; `table` from paired_modes, `surgery`
    from surgery_at_T. Each claim also says at how many held-out difficulties (level ii) it holds."""
    out = []
    for task, t in table.groupby("task"):
        T = int(t["trained_loops"].iloc[0])
        per_level = {lvl: e2_level(s.set_index("eval_loops").sort_index(), T) for lvl, s in t.groupby("level")}
        each = [lvl for lvl in per_level if lvl not in (MEAN, HARDEST)]
        few = {lvl: e2_too_few(s, T) for lvl, s in t.groupby("level")}
        for claim in ("a", "b", "c"):
            for analysis in ("paper", "paired"):
                held = sum(per_level[lvl][claim][analysis][0] for lvl in each)
                for lvl in (MEAN, HARDEST):
                    ok, measured = undecided_if(few[lvl][claim][analysis], *per_level[lvl][claim][analysis])
                    out.append(_claim("e2", claim, task, analysis, lvl, ok, measured, f"{held}/{len(each)}"))
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
            ratio = dict(worst=r["norm_ratio"], worst_seed=int(r["norm_ratio_seed"]), median=r["norm_ratio_median"],
                         mean=r["norm_ratio_mean"], within=int(r["norm_ratio_within"]),
                         seeds=int(r["norm_ratio_seeds"]))  # fmt: skip
            other = f"{r['non_answer']:.3f}" if np.isfinite(r["non_answer"]) else "not stored"  # the first study
            measured = (
                f"accuracy {r['accuracy']:.3f} (forced choice {r['choice_accuracy']:.3f}, non-answer tokens "
                f"{other}), {ratio_text(ratio)}, top-token share {r['top_token_share']:.3f}; "
                f"damage {r['damage']:+.3f} [{r['damage_ci_low']:+.3f}, {r['damage_ci_high']:+.3f}], "
                f"Wilcoxon p {r['damage_p']:.3g}"
            )
            out += [_claim("e2", "d", task, analysis, lvl, ok, measured) for analysis in ("paper", "paired")]
    return out


def e2_too_few(s: pd.DataFrame, T: int) -> dict:
    """Per claim (a)-(c) and analysis at one level (paired_modes' rows), too_few's reason where its test cannot decide
    with the level's paired seeds: per n unadjusted (paper; paired (b) at T), Holm over the n below or beyond T
    (paired (a): either side may refute it; (c): both sides must show it). (b) under the paper's analysis reads no
    test."""
    seeds = int(s["n_pairs"].min()) if len(s) else 0
    sides = [int((s["eval_loops"] < T).sum()), int((s["eval_loops"] > T).sum())]
    unpaired = too_few(seeds, False)
    return {
        "a": {"paper": unpaired, "paired": too_few(seeds, True, min(sides))},
        "b": {"paper": "", "paired": too_few(seeds, True)},
        "c": {"paper": unpaired, "paired": too_few(seeds, True, max(sides))},
    }


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

        ratio = ratio_summary(norm_ratios(cut, T))
        acc = lambda f: f[(f["metric"] == "accuracy") & (f["eval_loops"] == T)].set_index("seed")["value"]  # noqa: E731
        damage = (acc(own) - acc(cut)).dropna()
        ci = stats.paired_mean_ci(damage.to_numpy()) if len(damage) else stats.CI(np.nan, np.nan, np.nan, "")
        out.append(dict(
            task=task, level=level, accuracy=mean("accuracy"), choice_accuracy=mean("choice_accuracy"),
            non_answer=1 - mean("option_rate") if (at_t["metric"] == "option_rate").any() else np.nan,
            top_token_share=mean("top_token_share"), norm_ratio=ratio["worst"], norm_ratio_seed=ratio["worst_seed"],
            norm_ratio_median=ratio["median"], norm_ratio_mean=ratio["mean"], norm_ratio_within=ratio["within"],
            norm_ratio_seeds=ratio["seeds"],
            damage=ci.estimate, damage_ci_low=ci.low, damage_ci_high=ci.high,
            damage_p=stats.wilcoxon_p(acc(own)[damage.index], acc(cut)[damage.index]) if len(damage) else np.nan,
        ))  # fmt: skip
    return pd.DataFrame(out)


def norm_ratios(rows: pd.DataFrame, upto: int) -> pd.Series:
    """Claim (d)'s state-norm growth, one definition for the card, the norms page, the report and docs/results.md: per
    seed, the state norm `norm_post` at each step averaged over the level's difficulties, then max/min over steps
    1..upto. rows: one task and one boundary mode at one level (verdicts.levels' rows, or the raw rows of the
    chosen difficulties: the mean over difficulties is the same). Returns the ratio per seed."""
    norms = rows[(rows["metric"] == "norm_post") & (rows["eval_loops"] <= upto)]
    per_step = norms.groupby(["seed", "eval_loops"])["value"].mean().groupby("seed")
    return (per_step.max() / per_step.min()).rename("norm_ratio")


def ratio_summary(ratios: pd.Series) -> dict:
    """The named statistics of norm_ratios over seeds: the worst seed (the one the verdict reads: "the norm
    bounded" must hold for every seed), the median and the mean, and how many seeds are within
    paper.SURGERY_NORM_BOUND."""
    r = ratios.dropna()
    if r.empty:
        return dict(worst=np.nan, worst_seed=-1, median=np.nan, mean=np.nan, within=0, seeds=0)
    return dict(worst=float(r.max()), worst_seed=int(r.idxmax()), median=float(r.median()), mean=float(r.mean()),
                within=int((r <= paper.SURGERY_NORM_BOUND).sum()), seeds=len(r))  # fmt: skip


def ratio_text(s: dict) -> str:
    """A norm-ratio summary in words, as the card and the page say it."""
    return (
        f"norm ratio {s['worst']:.2f}x at the worst seed (seed {s['worst_seed']}); median {s['median']:.2f}x, "
        f"mean {s['mean']:.2f}x over {s['seeds']} seeds, {s['within']} of {s['seeds']} within "
        f"{paper.SURGERY_NORM_BOUND:g}x"
    )


def yes_no(flag) -> str:
    """A flag as a word for a reader (never Python's True/False)."""
    return "yes" if bool(flag) else "no"


def outcome(holds) -> str:
    """A verdict as words: holds / does NOT hold / undecided, or an outcome such as "vanishes"."""
    return holds if isinstance(holds, str) else "undecided" if holds is None else "holds" if holds else "does NOT hold"


@cache
def least_p(seeds: int, paired: bool) -> float:
    """The smallest p an analysis's test reaches with `seeds` seeds (pairs; or seeds in each arm, unpaired): the test
    itself on its most extreme data, every difference of one sign (stats.wilcoxon_p: 2 / 2^seeds) or the two arms
    apart (stats.mann_whitney_p), each with and without ties."""
    if seeds < 1:
        return 1.0
    apart, tied, zero = np.arange(1.0, seeds + 1), np.ones(seeds), np.zeros(seeds)
    if paired:
        return min(stats.wilcoxon_p(apart, zero), stats.wilcoxon_p(tied, zero))
    return min(stats.mann_whitney_p(apart + seeds, apart), stats.mann_whitney_p(tied, zero))


def too_few(seeds: int, paired: bool, family: int = 1) -> str:
    """Why a rule that reads a test's p < ALPHA cannot be decided with `seeds` seeds (its test, Holm over `family`
    n, cannot reach p < ALPHA whatever the values: "no significant gap" would hold, and "a significant gap" fail, by
    the seed count alone), or "" where it can."""
    best = min(1.0, max(family, 1) * least_p(seeds, paired))
    if best < paper.ALPHA:
        return ""
    test = "Wilcoxon signed-rank" if paired else "Mann-Whitney"
    over = f" with Holm over {family} n" if family > 1 else ""
    return f"undecided: {seeds} seeds, too few for {test}{over} to reach p < {paper.ALPHA} (at best {best:.3g})"


def undecided_if(few: str, holds, measured: str) -> tuple:
    """(holds, measured), or (None, measured with why) where `few` (too_few) says the rule cannot be decided."""
    return (None, f"{measured}; {few}") if few else (holds, measured)


def lines(found: list[Claim]) -> list[str]:
    """The claims for the terminal, one line each, after a heading; none without claims."""
    return ["", 'Verdicts (docs/design.md, "Verdict rules"):', *(c.line() for c in found)] if found else []


# ---------------------------------------------------------------- E3 and E4


def e3_claims(rows: pd.DataFrame) -> list[Claim]:
    """E3 at n = T after the last refit step, levels (i) and (iii): per target the mean recovery over the seeds
    the surgery damaged (>= paper.MIN_REFIT_GAP) with its bootstrap CI over seeds, and the verdicts; with
    fewer than MIN_DAMAGED seeds a verdict is undecided. Beyond the paper: head + last against head + first,
    paired by seed (Wilcoxon)."""
    out = []
    rec = rows[(rows["metric"] == "recovery") & (rows["split"] == "heldout")]
    for task, t in rec.groupby("task"):
        T = int(t["trained_loops"].iloc[0])
        t = t[t["eval_loops"] == T]
        hardest = t.loc[t["difficulty"] != IN_RANGE, "difficulty"].max()
        for level, part in ((MEAN, t[t["difficulty"] == IN_RANGE]), (HARDEST, t[t["difficulty"] == hardest])):
            last = part["refit_steps"].max()
            final = part[part["refit_steps"] == last]
            per_seed = {g: s.set_index("seed")["value"] for g, s in final.groupby("refit_target")}
            for claim, target in (("a", "head"), ("b", "head+last")):
                if target not in per_seed:
                    continue
                values = per_seed[target].dropna()
                ci = stats.bootstrap_ci_mean(values.to_numpy())
                curve = part[part["refit_target"] == target].groupby("refit_steps")["value"].mean()
                if len(values) < MIN_DAMAGED:
                    holds, verdict = None, f"undecided: only {len(values)} seeds lost >= {paper.MIN_REFIT_GAP}"
                elif claim == "a":
                    lo, hi = paper.HEAD_RECOVERY_RANGE
                    flat = plateaued(curve)
                    holds, verdict = bool(lo <= ci.estimate <= hi and flat), f"plateau: {yes_no(flat)}"
                else:
                    holds, verdict = bool(ci.estimate >= paper.FULL_RECOVERY), ""
                measured = (f"recovery {ci.estimate:.3f} [{ci.low:.3f}, {ci.high:.3f}] after {last} steps, "
                            f"{len(values)} damaged seeds" + (f"; {verdict}" if verdict else ""))  # fmt: skip
                out += [_claim("e3", claim, task, analysis, level, holds, measured) for analysis in ("paper", "paired")]
            if {"head+last", "head+first"} <= set(per_seed):
                both = pd.concat([per_seed["head+last"], per_seed["head+first"]], axis=1).dropna()
                p = stats.wilcoxon_p(both.iloc[:, 0].to_numpy(), both.iloc[:, 1].to_numpy())
                gap = float((both.iloc[:, 0] - both.iloc[:, 1]).mean()) if len(both) else np.nan
                ends = "; ".join(_plateau_note(part, target) for target in ("head+last", "head+first"))
                measured = (f"head+last minus head+first {gap:+.3f} over {len(both)} seeds, Wilcoxon p {p:.3g} "
                            f"after {last} steps. Post hoc, not the rule: {ends}")  # fmt: skip
                holds, measured = last_layer_verdict(both.iloc[:, 0], both.iloc[:, 1], gap, p, measured)
                out.append(_claim("e3", "last layer", task, "paired", level, holds, measured))
    return out


def last_layer_verdict(last: pd.Series, first: pd.Series, gap: float, p: float, measured: str) -> tuple:
    """E3's "the damage sits in the last layer" (head+last recovers more than head+first; Wilcoxon, which drops the
    seeds whose two recoveries are equal): undecided where the seeds that differ are too few for the test to reach
    p < ALPHA (too_few), none at all included, as where both refits recover all of the damage at every seed (1.000,
    the ceiling: no evidence either way)."""
    differ = int((last.to_numpy() != first.to_numpy()).sum())
    if differ == 0 and len(last) and np.allclose(last.to_numpy(), 1.0):
        return None, f"{measured}; undecided: no evidence either way, both refits at the ceiling (1.000) at every seed"
    few = too_few(differ, True).replace(f"{differ} seeds", f"{differ} seeds whose two recoveries differ")
    return undecided_if(few, bool(gap > 0 and p < paper.ALPHA), measured)


def _plateau_note(part: pd.DataFrame, target: str) -> str:
    """Post hoc, beside "the damage sits in the last layer": whether a target's mean recovery curve has reached
    its plateau (plateaued, E3's own rule) and how far it moved over the last doubling of refit steps."""
    curve = part[part["refit_target"] == target].groupby("refit_steps")["value"].mean().sort_index()
    moved = float(curve.iloc[-1] - curve.iloc[-2]) if len(curve) > 1 else np.nan
    state = "plateaued" if plateaued(curve) else "still moving"
    return f"{target} {state} ({moved:+.3f} over the last doubling of steps)"


MIN_DAMAGED = 8  # E3: fewer damaged seeds than this and a recovery verdict is undecided (docs/design.md)
MATCHED = (1, 2, 3)  # E4: overshoot ratios n / T compared
SMALL_GAP = 0.02  # E4 paired "vanishes": |mean gap| below this counts as gone
TOST_MARGIN = SMALL_GAP  # post hoc, not a rule: the equivalence test beside "vanishes", at the rule's own margin


def _compare(looped: pd.Series, stacked: pd.Series) -> dict:
    """One looped/stacked comparison over seeds (both indexed by seed)."""
    both = pd.concat([looped.rename("a"), stacked.rename("b")], axis=1).dropna()
    a, b = both["a"].to_numpy(), both["b"].to_numpy()
    return dict(gap=float((a - b).mean()), delta=stats.cliffs_delta(a, b), p=stats.mann_whitney_p(a, b),
                wilcoxon_p=stats.wilcoxon_p(a, b), n=len(both), tost_p=stats.tost_p(a - b, TOST_MARGIN),
                all_zero=bool(len(both)) and bool(np.all(a == b)))  # fmt: skip


def e4_table(rows: pd.DataFrame, mode: str = "norm") -> pd.DataFrame:
    """Looped minus stacked per task, level and comparison: at equal n = 2..3T (`equal`), and at matched
    overshoot n/T = o (looped at n = T*o, stacked at n = o: `matched`), each only where every paired seed (one with
    a looped model and its stacked twin) has both. Holm within each family."""
    lv = levels(rows)
    acc = lv[lv["metric"] == "accuracy"]
    stacked_mode = "norm" if mode == "norm" else "norm->none"  # the stacked model trains once, with the norm
    out = []
    for (task, level), g in acc.groupby(["task", "level"]):
        looped = g[(g["arch"] == "looped") & (g["boundary"] == mode)]
        stacked = g[(g["arch"] == "stacked") & (g["boundary"] == stacked_mode)]
        if looped.empty or stacked.empty:
            continue
        T = int(looped["trained_loops"].iloc[0])
        at = lambda f, n: f[f["eval_loops"] == n].set_index("seed")["value"].dropna()  # noqa: E731
        paired = set(looped["seed"]) & set(stacked["seed"])
        for family, x, n_looped, n_stacked in [
            *(("equal", n, n, n) for n in range(2, int(looped["eval_loops"].max()) + 1)),
            *(("matched", o, T * o, o) for o in MATCHED),
        ]:
            a, b = at(looped, n_looped), at(stacked, n_stacked)
            if paired <= set(a.index) & set(b.index):  # else a paired seed lacks a member here: not judged
                out.append(dict(task=task, level=level, T=T, family=family, x=x, **_compare(a, b)))
    table = pd.DataFrame(out)
    if table.empty:
        return table
    table["wilcoxon_p_holm"] = table.groupby(["task", "level", "family"])["wilcoxon_p"].transform(
        lambda p: pd.Series(stats.holm(p.to_numpy()), index=p.index)
    )
    return table


def _equivalent(p: pd.Series) -> str:
    shown = [o for o, q in zip(MATCHED, p, strict=False) if q < paper.ALPHA]
    return f"equivalent at o = {', '.join(map(str, shown))}" if shown else "equivalence shown at no o"


def e4_claims(table: pd.DataFrame) -> list[Claim]:
    """Per task and level: looping helps at equal n (most n), and at matched overshoot the advantage
    vanishes or shrinks, under both analyses (docs/design.md)."""
    out = []
    for (task, level), t in table[table["level"].isin([MEAN, HARDEST])].groupby(["task", "level"]):
        eq, m = t[t["family"] == "equal"], t[t["family"] == "matched"]
        helps = {
            "paper": bool(((eq["gap"] > 0) & (eq["delta"] > NEGLIGIBLE) & (eq["p"] < paper.ALPHA)).mean() > 0.5),
            "paired": bool(((eq["gap"] > 0) & (eq["wilcoxon_p_holm"] < paper.ALPHA)).mean() > 0.5),
        }
        vanish = {
            "paper": bool(((m["delta"].abs() < NEGLIGIBLE) | (m["p"] >= paper.ALPHA)).all()),
            "paired": bool(((m["wilcoxon_p_holm"] >= paper.ALPHA) | (m["gap"].abs() < SMALL_GAP)).all()),
        }
        T = int(t["T"].iloc[0])
        seeds = int(t["n"].min())
        few = {
            ("equal n", "paper"): too_few(seeds, False),
            ("equal n", "paired"): too_few(seeds, True, len(eq)),
            ("matched", "paper"): too_few(seeds, False),
            ("matched", "paired"): too_few(seeds, True, len(m)),
        }
        at_T_multiples = eq.set_index("x")["gap"].reindex([T * o for o in MATCHED]).mean()  # equal n = T, 2T, 3T
        for analysis in ("paper", "paired"):
            shrinks = not vanish[analysis] and abs(m["gap"].mean()) < abs(at_T_multiples)
            outcome = "vanishes" if vanish[analysis] else "shrinks" if shrinks else "stays"
            equal = f"mean gap {eq['gap'].mean():+.3f} over n = 2..{int(eq['x'].max())}"
            matched = (f"matched gaps {', '.join(f'{g:+.3f}' for g in m['gap'])} (o = 1, 2, 3) vs "
                       f"{at_T_multiples:+.3f} at equal n = T, 2T, 3T: {outcome}")  # fmt: skip
            out.append(_claim("e4", "equal n", task, analysis, level,
                              *undecided_if(few["equal n", analysis], helps[analysis], equal)))  # fmt: skip
            if analysis == "paired":  # post hoc: does the per-seed gap sit inside the rule's own margin?
                matched += (f". Post hoc, not the rule: TOST equivalence within ±{TOST_MARGIN} (paired t) p "
                            + ", ".join("— (every seed's gap exactly 0)" if zero else f"{p:.3g}"
                                        for p, zero in zip(m["tost_p"], m["all_zero"], strict=True))
                            + " at o = 1, 2, 3 "
                            f"({_equivalent(m['tost_p'])})")  # fmt: skip
            out.append(_claim("e4", "matched", task, analysis, level, *undecided_if(few["matched", analysis], outcome,
                                                                                   matched)))  # fmt: skip
    return out
