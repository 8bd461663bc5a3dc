"""Seed-level statistics for comparing looped-model variants.

The seed is the experimental unit: every CI resamples seeds, and DataFrame helpers first
average any repeated rows within a seed. All functions are pure; nothing runs at import.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

__all__ = [
    "CI",
    "bootstrap_ci_delta",
    "bootstrap_ci_mean",
    "cliffs_delta",
    "delta_magnitude",
    "mann_whitney_p",
    "mean_ci",
    "seed_means",
    "summarize_modes",
    "with_range",
]

# Romano et al. (2006) thresholds; each upper bound is exclusive (|d| == 0.147 -> "small").
_MAGNITUDE_BOUNDS: tuple[tuple[float, str], ...] = (
    (0.147, "negligible"),
    (0.33, "small"),
    (0.474, "medium"),
)


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
