"""Seed-level statistics for comparing looped-model variants.

The seed is the experimental unit: every CI resamples seeds, and DataFrame helpers first
average any repeated rows within a seed. All functions are pure; nothing runs at import.

Unpaired (the paper's analysis): Cliff's delta, Mann-Whitney p, bootstrap CIs per group
(`summarize_modes`). Paired (the design: a seed's `norm` and `none` models, or its looped and
stacked models, share initial weights and data): Wilcoxon signed-rank p on per-seed differences,
a bootstrap CI of their mean, and Holm-adjusted p-values per side of the trained budget T
(`paired_summary`, which also reports the unpaired statistics on the same seeds).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from engine import paper

__all__ = [
    "CI",
    "bootstrap_ci_delta",
    "bootstrap_ci_mean",
    "cliffs_delta",
    "delta_magnitude",
    "holm",
    "mann_whitney_p",
    "mean_ci",
    "paired_mean_ci",
    "paired_summary",
    "seed_means",
    "summarize_modes",
    "wilcoxon_p",
    "with_range",
]

# Romano et al. (2006) thresholds (engine.paper); each upper bound is exclusive (|d| == 0.147 -> "small").
_MAGNITUDE_BOUNDS: tuple[tuple[float, str], ...] = paper.DELTA_MAGNITUDES


class CI(NamedTuple):
    """A point estimate with its interval and how the interval was obtained."""

    estimate: float
    low: float
    high: float
    method: str  # "BCa", "percentile", "degenerate" (no spread / n < 2) or "n/a" (empty)


def _arr(x: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=float).ravel()


def _all_equal(*samples: np.ndarray) -> bool:
    pooled = np.concatenate(samples)
    return bool(pooled.size) and bool(np.all(pooled == pooled[0]))


def cliffs_delta(x: Sequence[float], y: Sequence[float]) -> float:
    """P(X>Y) - P(X<Y), via U of the first sample: ties count half, so delta = 2U/(n1 n2) - 1."""
    x, y = _arr(x), _arr(y)
    if x.size == 0 or y.size == 0:
        return float("nan")
    u = stats.mannwhitneyu(x, y, method="asymptotic").statistic
    return float(2.0 * u / (x.size * y.size) - 1.0)


def delta_magnitude(delta: float) -> str:
    """Label |delta| as negligible/small/medium/large; thresholds are exclusive upper bounds."""
    if not np.isfinite(delta):
        return "n/a"
    for bound, label in _MAGNITUDE_BOUNDS:
        if abs(delta) < bound:
            return label
    return "large"


def mann_whitney_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided Mann-Whitney p-value; identical pooled values carry no evidence, so p = 1."""
    x, y = _arr(x), _arr(y)
    if x.size == 0 or y.size == 0:
        return float("nan")
    if _all_equal(x, y):
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)


def _delta_vec(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Vectorised Cliff's delta over the last axis (for scipy's batched bootstrap)."""
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    return np.sign(x[..., :, None] - y[..., None, :]).mean(axis=(-2, -1))


def _bootstrap(
    samples: tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    estimate: float,
    n_resamples: int,
    rng_seed: int,
) -> CI:
    """BCa when it is defined; percentile when BCa degenerates (e.g. near-constant data)."""
    if any(s.size < 2 for s in samples) or _all_equal(*samples):
        return CI(estimate, estimate, estimate, "degenerate")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BCa warns and returns NaN when undefined
            res = stats.bootstrap(
                samples,
                statistic,
                n_resamples=n_resamples,
                vectorized=True,
                method=method,
                rng=np.random.default_rng(rng_seed),
            )
        low, high = res.confidence_interval
        if np.isfinite(low) and np.isfinite(high):
            return CI(estimate, float(low), float(high), method)
    return CI(estimate, float("nan"), float("nan"), "n/a")


def bootstrap_ci_mean(x: Sequence[float], n_resamples: int = 2000, rng_seed: int = 0) -> CI:
    """95% CI for the mean over seeds; fixed rng_seed keeps reports reproducible."""
    x = _arr(x)
    if x.size == 0:
        return CI(float("nan"), float("nan"), float("nan"), "n/a")
    return _bootstrap((x,), np.mean, float(x.mean()), n_resamples, rng_seed)


def bootstrap_ci_delta(x: Sequence[float], y: Sequence[float], n_resamples: int = 2000, rng_seed: int = 0) -> CI:
    """95% CI for Cliff's delta(x, y), resampling each independent group separately."""
    x, y = _arr(x), _arr(y)
    if x.size == 0 or y.size == 0:
        return CI(float("nan"), float("nan"), float("nan"), "n/a")
    return _bootstrap((x, y), _delta_vec, cliffs_delta(x, y), n_resamples, rng_seed)


def wilcoxon_p(x: Sequence[float], y: Sequence[float], alternative: str = "two-sided") -> float:
    """Wilcoxon signed-rank p-value on the paired differences d = x - y (pairs share an index).

    alternative: "two-sided", "greater" (d tends to be > 0) or "less". Zero differences are
    dropped (zero_method="wilcox"): they say nothing about the direction, and dropping them keeps
    the exact null distribution available ("zsplit" would rank them and rule that out). On the
    remaining m differences scipy's method="auto" is exact: the signed-rank distribution when m
    <= 50 without tied |d|, all 2^m sign flips when there are ties and m <= 13; otherwise the
    normal approximation with tie and continuity corrections. All differences zero -> 1.0; pairs
    with a NaN are dropped; no pairs -> NaN.
    """
    x, y = _arr(x), _arr(y)
    if x.size != y.size:
        raise ValueError(f"paired samples need equal lengths, got {x.size} and {y.size}")
    d = x - y
    d = d[~np.isnan(d)]
    if d.size == 0:
        return float("nan")
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    if d.size <= 13 and np.unique(np.abs(d)).size < d.size:
        return _signflip_p(d, alternative)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.wilcoxon(d, zero_method="wilcox", alternative=alternative, method="auto")
    return float(res.pvalue)


def _signflip_p(d: np.ndarray, alternative: str) -> float:
    """The exact p that scipy's wilcoxon(method="auto") gives for m <= 13 differences with tied |d|.

    scipy hands that case to permutation_test, which takes ~0.5 s per call; this enumerates the
    same 2^m sign flips at once. Statistic: the sum of the (average) ranks of |d| over d > 0;
    p = the share of flips at least as extreme, with permutation_test's relative tolerance
    (100 eps) and two-sided = 2 min(less, greater) clipped to 1 — equal to scipy's p to the bit.
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
    m = d.size
    ranks = stats.rankdata(np.abs(d))
    observed = float(ranks[d > 0].sum())
    flips = (np.arange(2**m)[:, None] >> np.arange(m)) & 1
    null = flips @ ranks
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)
    less = np.count_nonzero(null <= observed + gamma) / 2**m
    greater = np.count_nonzero(null >= observed - gamma) / 2**m
    p = {"less": less, "greater": greater, "two-sided": 2 * min(less, greater)}[alternative]
    return float(min(max(p, 0.0), 1.0))


def tost_p(diffs: Sequence[float], margin: float) -> float:
    """Two one-sided tests (TOST) that the mean paired difference lies inside (-margin, +margin).

    p = max of the one-sided t-tests of H0: mean <= -margin and H0: mean >= +margin (scipy.stats.ttest_1samp);
    p < alpha shows equivalence within the margin. All differences equal (no variance): 0.0 if that value is
    strictly inside the margin, else 1.0. NaNs are dropped; fewer than two differences -> NaN.
    """
    d = _arr(diffs)
    d = d[~np.isnan(d)]
    if margin <= 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    if d.size < 2:
        return float("nan")
    if _all_equal(d):
        return 0.0 if abs(float(d[0])) < margin else 1.0
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(lower, upper))


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    With the m non-NaN p sorted ascending, p_adj(i) = min(1, max_{j <= i} (m - j + 1) p(j));
    NaNs stay NaN and do not count towards m.
    """
    p = _arr(pvalues)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    m = int(ok.sum())
    order = np.argsort(p[ok], kind="stable")
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(np.maximum.accumulate((m - np.arange(m)) * p[ok][order]), 1.0)
    out[ok] = adjusted
    return out


def paired_mean_ci(diffs: Sequence[float], n_resamples: int = 2000, rng_seed: int = 0) -> CI:
    """Mean per-seed difference with a 95% bootstrap CI resampling seeds (pairs), NaNs dropped.

    Same helper as the unpaired CIs: BCa, percentile where BCa is undefined, and "degenerate"
    (estimate, estimate) when all differences agree or there is a single pair.
    """
    d = _arr(diffs)
    return bootstrap_ci_mean(d[~np.isnan(d)], n_resamples, rng_seed)


def _per_unit(df: pd.DataFrame, keys: list[str], col: str, unit_col: str | None) -> pd.DataFrame:
    """Collapse repeated rows to one value per unit, so n counts seeds, not examples."""
    if unit_col is None or unit_col not in df.columns:
        return df
    units = df.groupby([*keys, unit_col], dropna=False, observed=True)[col].mean()
    return units.reset_index()


def mean_ci(
    df: pd.DataFrame,
    group_cols: Sequence[str],
    value_col: str = "value",
    unit_col: str | None = "seed",
    n_resamples: int = 2000,
    rng_seed: int = 0,
) -> pd.DataFrame:
    """Per group: mean, ci_low, ci_high, n (units), ci_method. Rows are units if unit_col absent."""
    keys, rows = list(group_cols), []
    for key, g in _per_unit(df, keys, value_col, unit_col).groupby(keys, dropna=False, sort=True):
        ci = bootstrap_ci_mean(g[value_col].to_numpy(), n_resamples, rng_seed)
        rows.append((*key, ci.estimate, ci.low, ci.high, len(g), ci.method))
    return pd.DataFrame(rows, columns=[*keys, "mean", "ci_low", "ci_high", "n", "ci_method"])


SUMMARY_COLUMNS: tuple[str, ...] = (
    "n_a", "n_b", "mean_a", "ci_a_low", "ci_a_high", "mean_b", "ci_b_low", "ci_b_high",
    "delta", "delta_ci_low", "delta_ci_high", "magnitude", "p_value", "ci_method",
)  # fmt: skip


def summarize_modes(
    df: pd.DataFrame,
    group_cols: Sequence[str] = ("task", "difficulty", "eval_loops"),
    value_col: str = "value",
    mode_col: str = "boundary",
    a: str = "norm",
    b: str = "none",
    unit_col: str | None = "seed",
    n_resamples: int = 2000,
    rng_seed: int = 0,
) -> pd.DataFrame:
    """Per group, compare mode b against mode a: seed-level means with CIs, Cliff's delta
    (positive when b is larger) with its CI and magnitude, and the Mann-Whitney p-value.

    ci_method is one name when all three CIs agree, else "a:...,b:...,delta:...".
    """
    keys, rows = list(group_cols), []
    units = _per_unit(df[df[mode_col].isin([a, b])], [*keys, mode_col], value_col, unit_col)
    for key, g in units.groupby(keys, dropna=False, sort=True):
        xa = g.loc[g[mode_col] == a, value_col].to_numpy(dtype=float)
        xb = g.loc[g[mode_col] == b, value_col].to_numpy(dtype=float)
        ca = bootstrap_ci_mean(xa, n_resamples, rng_seed)
        cb = bootstrap_ci_mean(xb, n_resamples, rng_seed)
        cd = bootstrap_ci_delta(xb, xa, n_resamples, rng_seed)
        methods = {"a": ca.method, "b": cb.method, "delta": cd.method}
        method = ",".join(f"{k}:{v}" for k, v in methods.items())
        if len(set(methods.values())) == 1:
            method = ca.method
        rows.append(
            (*key, xa.size, xb.size, *ca[:3], *cb[:3], *cd[:3], delta_magnitude(cd.estimate))
            + (mann_whitney_p(xb, xa), method)
        )
    return pd.DataFrame(rows, columns=[*keys, *SUMMARY_COLUMNS])


def with_range(rows: pd.DataFrame, train_difficulties: dict[str, tuple[int, ...]]) -> pd.DataFrame:
    """Mark each row's difficulty as inside or beyond its task's training range."""
    inside = [d in train_difficulties[t] for t, d in zip(rows["task"], rows["difficulty"], strict=True)]
    return rows.assign(range=pd.Series(inside, index=rows.index).map({True: "in-range", False: "beyond"}))


def seed_means(rows: pd.DataFrame, metric: str, by: list[str]) -> pd.DataFrame:
    """One value per seed and group: the metric averaged over the difficulties of the group."""
    picked = rows[rows["metric"] == metric]
    return picked.groupby([*by, "seed"], as_index=False)["value"].mean()


PAIRED_COLUMNS: tuple[str, ...] = (
    "n_pairs", "mean_a", "mean_b", "mean_diff", "ci_low", "ci_high", "ci_method",
    "wilcoxon_p", "wilcoxon_p_holm", "cliffs_delta", "mann_whitney_p", "trained_loops", "side",
)  # fmt: skip


def paired_summary(
    rows: pd.DataFrame,
    by: Sequence[str],
    pair_col: str,
    a: str,
    b: str,
    unit_col: str = "seed",
    value_col: str = "value",
    trained_loops: int | str | None = None,
    *,
    loops_col: str = "eval_loops",
    alternative: str = "two-sided",
    n_resamples: int = 2000,
    rng_seed: int = 0,
) -> pd.DataFrame:
    """Per group of `by`, compare mode a against mode b of `pair_col` seed by seed.

    Repeated rows of a unit are averaged first; a unit counts as a pair when both modes have a
    value (n_pairs). Columns: mean_a, mean_b and mean_diff = mean(a - b) over the pairs, with
    ci_low/ci_high/ci_method from paired_mean_ci; wilcoxon_p on a - b (see wilcoxon_p for
    `alternative`); and, on the same paired units but ignoring the pairing, the paper's unpaired
    cliffs_delta(a, b) (positive when a is larger) and two-sided mann_whitney_p.

    T (column trained_loops) is `trained_loops` when an int; the per-group value of that column
    when a name; the column "trained_loops" when None and rows has it (each group must carry one
    T). side is "below", "at" or "beyond" as the group's `loops_col` (which must be in `by`) is
    <, == or > T. Holm family: the rows sharing every `by` key except `loops_col`, and the side;
    so wilcoxon_p_holm adjusts across the eval-loop counts below T and, separately, across those
    beyond T, while the n = T row is a family of one (unadjusted).
    """
    keys = list(by)
    if loops_col not in keys:
        raise ValueError(f"`by` must contain the loop-count column {loops_col!r}")
    t_col = trained_loops if isinstance(trained_loops, str) else None
    if trained_loops is None and "trained_loops" in rows.columns:
        t_col = "trained_loops"
    if trained_loops is None and t_col is None:
        raise ValueError("no trained budget T: pass trained_loops (an int or a column of rows)")
    out = []
    for key, g in rows[rows[pair_col].isin([a, b])].groupby(keys, dropna=False, sort=True):
        ts = g[t_col].unique() if t_col is not None else [trained_loops]
        if len(ts) != 1:
            raise ValueError(f"group {key} has several trained budgets in {t_col!r}: {list(ts)}")
        group = dict(zip(keys, key, strict=True))
        t, n = int(ts[0]), group[loops_col]
        units = g.groupby([unit_col, pair_col], sort=True)[value_col].mean().unstack(pair_col)
        pairs = units.reindex(columns=[a, b]).dropna()
        xa, xb = pairs[a].to_numpy(dtype=float), pairs[b].to_numpy(dtype=float)
        ci = paired_mean_ci(xa - xb, n_resamples, rng_seed)
        stat = {
            "n_pairs": len(pairs),
            "mean_a": xa.mean() if len(pairs) else np.nan,
            "mean_b": xb.mean() if len(pairs) else np.nan,
            "mean_diff": ci.estimate,
            "ci_low": ci.low,
            "ci_high": ci.high,
            "ci_method": ci.method,
            "wilcoxon_p": wilcoxon_p(xa, xb, alternative),
            "cliffs_delta": cliffs_delta(xa, xb),
            "mann_whitney_p": mann_whitney_p(xa, xb),
            "trained_loops": t,
            "side": "below" if n < t else "at" if n == t else "beyond",
        }
        out.append(group | stat | {"wilcoxon_p_holm": stat["wilcoxon_p"]})
    res = pd.DataFrame(out, columns=[*keys, *(c for c in PAIRED_COLUMNS if c not in keys)])
    family = [k for k in keys if k != loops_col] + ["side"]
    if len(res):
        adjust = lambda p: pd.Series(holm(p.to_numpy()), index=p.index)  # noqa: E731
        res["wilcoxon_p_holm"] = res.groupby(family, dropna=False, sort=False)["wilcoxon_p"].transform(adjust)
    return res
