"""Tests for engine.core.stats against values counted by hand (the counts are in the comments)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from engine.core.stats import (
    bootstrap_ci_delta,
    bootstrap_ci_mean,
    cliffs_delta,
    delta_magnitude,
    holm,
    mann_whitney_p,
    mean_ci,
    paired_mean_ci,
    paired_summary,
    summarize_modes,
    wilcoxon_p,
)

# Any warning escaping the stats code (e.g. scipy's DegenerateDataWarning) fails the test.
pytestmark = pytest.mark.filterwarnings("error")


# --- Cliff's delta ---------------------------------------------------------------------------


def test_delta_ties_against_constant_sample():
    # X=[1,2,3], Y=[1,1,1]: 9 pairs. x=1 ties all 3; x=2 and x=3 beat all 3 -> 6 ">", 0 "<".
    # delta = 6/9 - 0/9 = 2/3.
    assert cliffs_delta([1, 2, 3], [1, 1, 1]) == pytest.approx(2 / 3)
    assert cliffs_delta([1, 1, 1], [1, 2, 3]) == pytest.approx(-2 / 3)


def test_delta_ties_unequal_sizes():
    # X=[1,2,2], Y=[2,3]: (1,2)< (1,3)< (2,2)= (2,3)< (2,2)= (2,3)<  -> 0 ">", 4 "<", 2 ties.
    # delta = (0 - 4)/6 = -2/3.
    assert cliffs_delta([1, 2, 2], [2, 3]) == pytest.approx(-2 / 3)


def test_delta_unequal_sizes_no_ties():
    # X=[1,5,7,9], Y=[3,6]: (1,3)< (1,6)< (5,3)> (5,6)< (7,3)> (7,6)> (9,3)> (9,6)>
    # -> 5 ">", 3 "<" of 8 pairs; delta = 2/8 = 0.25 and swapping the samples flips the sign.
    assert cliffs_delta([1, 5, 7, 9], [3, 6]) == pytest.approx(0.25)
    assert cliffs_delta([3, 6], [1, 5, 7, 9]) == pytest.approx(-0.25)


def test_delta_complete_separation_is_large():
    # Every x in [4,5,6] exceeds every y in [1,2,3]: 9 ">" of 9 -> delta = 1 (and -1 reversed).
    assert cliffs_delta([4, 5, 6], [1, 2, 3]) == 1.0
    assert cliffs_delta([1, 2, 3], [4, 5, 6]) == -1.0
    assert delta_magnitude(1.0) == delta_magnitude(-1.0) == "large"


def test_delta_all_equal_is_zero():
    # Every pair ties: 0 ">", 0 "<" -> delta = 0.
    assert cliffs_delta([0.5] * 4, [0.5] * 6) == 0.0


def test_delta_empty_sample_is_nan():
    assert math.isnan(cliffs_delta([], [1.0, 2.0]))


# --- magnitude labels: each threshold is an exclusive upper bound ------------------------------


@pytest.mark.parametrize(
    ("delta", "label"),
    [
        (0.0, "negligible"),
        (0.1469, "negligible"),
        (0.147, "small"),  # exactly on the threshold belongs to the band above
        (-0.147, "small"),  # sign is ignored
        (0.3299, "small"),
        (0.33, "medium"),
        (0.4739, "medium"),
        (0.474, "large"),
        (-0.9, "large"),
        (float("nan"), "n/a"),
    ],
)
def test_magnitude_boundaries(delta, label):
    assert delta_magnitude(delta) == label


# --- Mann-Whitney p ---------------------------------------------------------------------------


def test_p_complete_separation_exact():
    # n1=n2=3, no ties -> exact test. C(6,3)=20 equally likely rank splits; [4,5,6] vs [1,2,3]
    # is one of the 2 most extreme (U=9 or U=0) -> two-sided p = 2/20 = 0.1.
    assert mann_whitney_p([4, 5, 6], [1, 2, 3]) == pytest.approx(0.1)


def test_p_unequal_sizes_exact():
    # X=[1,5,7,9], Y=[3,6]: Y holds ranks {2,4}, rank sum 6. Of the C(6,2)=15 rank pairs,
    # those with sum <= 6 are {1,2},{1,3},{1,4},{1,5},{2,3},{2,4}: 6 -> one tail 6/15 = 0.4,
    # two-sided p = 0.8.
    assert mann_whitney_p([1, 5, 7, 9], [3, 6]) == pytest.approx(0.8)


def test_p_all_identical_is_one():
    assert mann_whitney_p([2.0, 2.0, 2.0], [2.0, 2.0]) == 1.0
    assert mann_whitney_p([2.0], [2.0]) == 1.0


# --- bootstrap CIs ----------------------------------------------------------------------------


def test_mean_ci_all_seeds_equal_is_degenerate():
    ci = bootstrap_ci_mean([0.75] * 8)
    assert (ci.estimate, ci.low, ci.high, ci.method) == (0.75, 0.75, 0.75, "degenerate")


def test_mean_ci_single_seed_is_degenerate():
    ci = bootstrap_ci_mean([7.0])
    assert (ci.estimate, ci.low, ci.high, ci.method) == (7.0, 7.0, 7.0, "degenerate")


def test_mean_ci_contains_mean_and_stays_in_data_range():
    # mean of [1..5] = 3; a resampled mean can never leave [min, max] = [1, 5].
    ci = bootstrap_ci_mean([1, 2, 3, 4, 5])
    assert ci.estimate == 3.0
    assert ci.method == "BCa"
    assert 1.0 <= ci.low < 3.0 < ci.high <= 5.0


def test_mean_ci_reproducible_with_same_rng_seed():
    x = [0.1, 0.4, 0.35, 0.8, 0.55, 0.2, 0.9, 0.65]
    assert bootstrap_ci_mean(x, rng_seed=3) == bootstrap_ci_mean(x, rng_seed=3)
    assert bootstrap_ci_mean(x, rng_seed=3) != bootstrap_ci_mean(x, rng_seed=4)


def test_delta_ci_all_equal_is_degenerate_zero():
    ci = bootstrap_ci_delta([1.0] * 5, [1.0] * 3)
    assert (ci.estimate, ci.low, ci.high, ci.method) == (0.0, 0.0, 0.0, "degenerate")


def test_delta_ci_single_element_group_is_degenerate():
    # [1] vs [2,3]: both pairs "<" -> delta = -1; n1 = 1 cannot be resampled meaningfully.
    ci = bootstrap_ci_delta([1.0], [2.0, 3.0])
    assert (ci.estimate, ci.low, ci.high, ci.method) == (-1.0, -1.0, -1.0, "degenerate")


def test_delta_ci_complete_separation_falls_back_to_percentile():
    # Every resample of separated groups is still separated, so every bootstrap delta is 1:
    # BCa is undefined there and the percentile interval is exactly (1, 1).
    ci = bootstrap_ci_delta([4, 5, 6], [1, 2, 3])
    assert (ci.estimate, ci.low, ci.high, ci.method) == (1.0, 1.0, 1.0, "percentile")


def test_delta_ci_with_ties_and_unequal_sizes():
    # X=[1,2,3,4], Y=[2,3,4,5,6], 20 pairs:
    # x=1: 5 "<"; x=2: 1 "=", 4 "<"; x=3: 1 ">", 1 "=", 3 "<"; x=4: 2 ">", 1 "=", 2 "<"
    # -> 3 ">", 14 "<"; delta = (3 - 14)/20 = -0.55.
    ci = bootstrap_ci_delta([1, 2, 3, 4], [2, 3, 4, 5, 6], rng_seed=0)
    assert ci.estimate == pytest.approx(-0.55)
    assert ci.method == "BCa"
    assert -1.0 <= ci.low < -0.55 < ci.high <= 1.0
    assert ci == bootstrap_ci_delta([1, 2, 3, 4], [2, 3, 4, 5, 6], rng_seed=0)


# --- DataFrame helpers ------------------------------------------------------------------------


def _frame() -> pd.DataFrame:
    rows = []
    # Task A: norm seeds -> [1,2,3] (seed 0 has two rows, 0.5 and 1.5, averaging to 1),
    #         none seeds -> [4,5,6]. Per-seed: complete separation, b above a.
    rows += [("A", "norm", s, v) for s, v in [(0, 0.5), (0, 1.5), (1, 2.0), (2, 3.0)]]
    rows += [("A", "none", s, v) for s, v in [(0, 4.0), (1, 5.0), (2, 6.0)]]
    # Task B: everything equals 1.
    rows += [("B", m, s, 1.0) for m in ("norm", "none") for s in range(3)]
    # Task C: none = [1,5,7,9] (4 seeds), norm = [3,6] (2 seeds).
    rows += [("C", "none", s, v) for s, v in enumerate([1.0, 5.0, 7.0, 9.0])]
    rows += [("C", "norm", s, v) for s, v in enumerate([3.0, 6.0])]
    # A third mode that must be ignored by the norm-vs-none comparison.
    rows += [("A", "other", s, 100.0) for s in range(3)]
    return pd.DataFrame(rows, columns=["task", "boundary", "seed", "value"])


def test_summarize_modes_hand_built_frame():
    out = summarize_modes(_frame(), group_cols=["task"]).set_index("task")
    assert list(out.index) == ["A", "B", "C"]

    a = out.loc["A"]
    # seed is the unit: seed 0's two rows collapse to one, so n_a = 3, not 4.
    assert (a.n_a, a.n_b) == (3, 3)
    assert a.mean_a == pytest.approx(2.0) and a.mean_b == pytest.approx(5.0)
    assert a.delta == 1.0 and a.magnitude == "large"  # b (none) entirely above a (norm)
    assert a.p_value == pytest.approx(0.1)  # same split as test_p_complete_separation_exact
    assert (a.delta_ci_low, a.delta_ci_high) == (1.0, 1.0)
    assert "delta:percentile" in a.ci_method
    assert a.ci_a_low < 2.0 < a.ci_a_high and a.ci_b_low < 5.0 < a.ci_b_high

    b = out.loc["B"]
    assert (b.delta, b.p_value, b.magnitude, b.ci_method) == (0.0, 1.0, "negligible", "degenerate")
    assert (b.ci_a_low, b.ci_a_high, b.ci_b_low, b.ci_b_high) == (1.0, 1.0, 1.0, 1.0)

    c = out.loc["C"]
    assert (c.n_a, c.n_b) == (2, 4)
    assert c.mean_a == pytest.approx(4.5) and c.mean_b == pytest.approx(5.5)
    assert c.delta == pytest.approx(0.25) and c.magnitude == "small"  # see unequal-sizes test
    assert c.p_value == pytest.approx(0.8)


def test_summarize_modes_is_reproducible():
    first = summarize_modes(_frame(), group_cols=["task"])
    pd.testing.assert_frame_equal(first, summarize_modes(_frame(), group_cols=["task"]))


def test_mean_ci_per_group():
    out = mean_ci(_frame(), group_cols=["task", "boundary"]).set_index(["task", "boundary"])
    row = out.loc[("A", "norm")]
    assert (row["mean"], row["n"]) == (pytest.approx(2.0), 3)  # per-seed means [1,2,3]
    assert row.ci_low < 2.0 < row.ci_high
    flat = out.loc[("B", "none")]
    assert (flat["mean"], flat.ci_low, flat.ci_high) == (1.0, 1.0, 1.0)
    assert flat.ci_method == "degenerate"
    assert out.loc[("C", "none"), "n"] == 4


def test_mean_ci_without_unit_column_counts_rows():
    df = _frame().drop(columns="seed")
    out = mean_ci(df, group_cols=["task", "boundary"]).set_index(["task", "boundary"])
    # Task A/norm now has 4 rows [0.5,1.5,2,3]: mean = 7/4.
    assert out.loc[("A", "norm"), "n"] == 4
    assert out.loc[("A", "norm"), "mean"] == pytest.approx(1.75)


def test_summarize_modes_speed_100_groups_16_seeds():
    import time

    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        [(g, m, s, rng.normal() + (m == "none")) for g in range(100) for m in ("norm", "none") for s in range(16)],
        columns=["task", "boundary", "seed", "value"],
    )
    t0 = time.perf_counter()
    out = summarize_modes(df, group_cols=["task"])
    assert time.perf_counter() - t0 < 10.0
    assert len(out) == 100 and out["n_a"].eq(16).all() and out["n_b"].eq(16).all()


# --- paired statistics ------------------------------------------------------------------------


def test_holm_hand_example():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06;
    # back in input order [0.01, 0.04, 0.03, 0.005] -> [0.03, 0.06, 0.06, 0.02].
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_nan_safe_capped_and_tied():
    # NaN is skipped and m = 2: 0.01*2 = 0.02, 0.04*1 = 0.04.
    out = holm([0.01, float("nan"), 0.04])
    assert out[[0, 2]] == pytest.approx([0.02, 0.04]) and math.isnan(out[1])
    # 0.6*2 = 1.2 -> capped at 1; 0.7*1 = 0.7 -> running max 1.
    assert list(holm([0.7, 0.6])) == [1.0, 1.0]
    # ties: 0.02*2 = 0.04, then 0.02*1 = 0.02 -> running max 0.04 for both.
    assert holm([0.02, 0.02]) == pytest.approx([0.04, 0.04])
    assert holm([]).size == 0 and np.isnan(holm([float("nan")])).all()


def _enumerated_p(d: list[float], alternative: str) -> float:
    """Exact signed-rank p by listing all 2^m sign assignments (distinct nonzero |d| only)."""
    ranks = {v: r for r, v in enumerate(sorted(abs(v) for v in d), start=1)}
    w_obs = sum(ranks[abs(v)] for v in d if v > 0)
    signs = itertools.product((False, True), repeat=len(d))  # True: rank r carries a "+" sign
    ws = [sum(r for r, plus in enumerate(s, start=1) if plus) for s in signs]
    ge, le = sum(w >= w_obs for w in ws) / len(ws), sum(w <= w_obs for w in ws) / len(ws)
    return {"greater": ge, "less": le, "two-sided": min(1.0, 2 * min(ge, le))}[alternative]


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_wilcoxon_exact_against_enumeration(alternative):
    # d = x - y = [-1, 2, -3, 4, 5, 6]: |d| ranks 1..6, W+ = 2+4+5+6 = 17, W- = 1+3 = 4.
    # Of 2^6 = 64 sign assignments, W+ >= 17 <=> W- <= 4: subsets of {1..6} summing to <= 4 are
    # {}, {1}, {2}, {3}, {4}, {1,2}, {1,3} -> 7. greater: 7/64; two-sided: 2*7/64 = 14/64;
    # less: P(W+ <= 17) = 1 - P(W+ >= 18) = 1 - 5/64 = 59/64 (W- <= 3: {}, {1}, {2}, {3}, {1,2}).
    d = [-1.0, 2.0, -3.0, 4.0, 5.0, 6.0]
    y = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    x = [yi + di for yi, di in zip(y, d, strict=True)]
    expected = {"two-sided": 14 / 64, "greater": 7 / 64, "less": 59 / 64}[alternative]
    assert _enumerated_p(d, alternative) == pytest.approx(expected)
    assert wilcoxon_p(x, y, alternative) == pytest.approx(expected)


def test_wilcoxon_zeros_dropped_ties_and_edge_cases():
    # A zero difference is dropped (zero_method="wilcox"): same p as the 6 nonzero pairs, 14/64.
    assert wilcoxon_p([9, 22, 27, 44, 55, 66, 7], [10, 20, 30, 40, 50, 60, 7]) == pytest.approx(14 / 64)
    # All 6 differences positive: only 1 of 64 assignments has W+ = 21 -> two-sided 2/64.
    assert wilcoxon_p([2, 3, 4, 5, 6, 7], [1, 1, 1, 1, 1, 1.5]) == pytest.approx(2 / 64)
    # Tied |d| = [1, 1] (ranks 1.5, 1.5), both negative: W+ in {0, 1.5, 1.5, 3}; P(W+ <= 0) = 1/4
    # -> two-sided 2/4 = 0.5 (all 2^2 sign flips, exact).
    assert wilcoxon_p([0.0, 1.0], [1.0, 2.0]) == pytest.approx(0.5)
    assert wilcoxon_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0  # all differences zero
    assert wilcoxon_p([1.0, float("nan")], [1.0, 5.0]) == 1.0  # the NaN pair is dropped
    assert math.isnan(wilcoxon_p([], []))
    with pytest.raises(ValueError, match="equal lengths"):
        wilcoxon_p([1.0, 2.0], [1.0])


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
@pytest.mark.slow
def test_wilcoxon_tied_small_samples_equal_scipy_exactly(alternative):
    # m <= 13 nonzero differences with tied |d| take the vectorised sign-flip path; scipy's own
    # wilcoxon(method="auto") runs permutation_test there. Accuracy differences are multiples
    # of 1/items, so ties are the common case in the study; the p must be scipy's to the bit.
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(60):
        m = int(rng.integers(2, 17))
        d = np.round(rng.normal(rng.choice([0.0, 0.02]), 0.03, m), 2)
        nonzero = d[d != 0]
        if nonzero.size == 0 or nonzero.size > 13 or np.unique(np.abs(nonzero)).size == nonzero.size:
            continue
        expected = scipy_stats.wilcoxon(nonzero, zero_method="wilcox", alternative=alternative).pvalue
        assert wilcoxon_p(d, np.zeros(m), alternative) == expected
        checked += 1
    assert checked >= 20


def test_paired_mean_ci():
    ci = paired_mean_ci([0.25] * 5)  # constant differences: no spread, no BCa, no warning
    assert (ci.estimate, ci.low, ci.high, ci.method) == (0.25, 0.25, 0.25, "degenerate")
    assert paired_mean_ci([-1.0]).method == "degenerate"
    assert paired_mean_ci([]).method == "n/a"
    # mean of [1, 3, 5] (NaN dropped) = 3; a resampled mean stays within [1, 5].
    ci = paired_mean_ci([1.0, float("nan"), 3.0, 5.0])
    assert ci.estimate == 3.0 and ci.method == "BCa" and 1.0 <= ci.low < 3.0 < ci.high <= 5.0


def _paired_frame(extra_loop: bool = False) -> pd.DataFrame:
    """Task A, T = 2, seeds 0..2; a = none, b = norm (per-seed differences none - norm):
    n=1: norm [1,2,3], none [4,6,8] -> d = [3,4,5]
    n=2: none = norm = [1,2,3]      -> d = [0,0,0]
    n=3: norm [1 (rows 0 and 2),2,3], none [0,1,-] (seed 2 missing) -> pairs 0,1, d = [-1,-1]
    n=4 (extra_loop): as n=1.  Task B (extra_loop): a copy of A with T = 3.
    """
    rows = []
    for mode, seeds in {"norm": [1, 2, 3], "none": [4, 6, 8]}.items():
        rows += [("A", 1, mode, s, v) for s, v in enumerate(seeds)]
        if extra_loop:
            rows += [("A", 4, mode, s, v) for s, v in enumerate(seeds)]
    rows += [("A", 2, mode, s, float(s + 1)) for mode in ("norm", "none") for s in range(3)]
    rows += [("A", 3, "norm", s, v) for s, v in [(0, 0.0), (0, 2.0), (1, 2.0), (2, 3.0)]]
    rows += [("A", 3, "none", s, v) for s, v in [(0, 0.0), (1, 1.0)]]
    rows += [("A", 3, "other", s, 99.0) for s in range(3)]  # a third mode, ignored
    df = pd.DataFrame(rows, columns=["task", "eval_loops", "boundary", "seed", "value"]).assign(trained_loops=2)
    if extra_loop:
        df = pd.concat([df, df.assign(task="B", trained_loops=3)], ignore_index=True)
    return df


def test_paired_summary_hand_frame():
    full = paired_summary(_paired_frame(), ["task", "eval_loops"], "boundary", "none", "norm")
    out = full.set_index("eval_loops")
    assert list(out.side) == ["below", "at", "beyond"]
    assert list(out.n_pairs) == [3, 3, 2]  # seed 2 has no norm-less model at n = 3
    assert list(out.trained_loops) == [2, 2, 2]
    assert out.mean_diff.tolist() == pytest.approx([4.0, 0.0, -1.0])
    assert (out.loc[1, "mean_a"], out.loc[1, "mean_b"]) == (pytest.approx(6.0), pytest.approx(2.0))
    # n=1: d = [3,4,5], all positive: W+ = 6 only for 1 of 2^3 assignments -> two-sided 2/8.
    # n=3: d = [-1,-1] -> 0.5 (see the tied case above); n=2: all zero -> 1.
    assert out.wilcoxon_p.tolist() == pytest.approx([0.25, 1.0, 0.5])
    # Each side holds one n here, so every family has one member: Holm leaves p unchanged
    # (pooling the three would give 0.25*3 = 0.75 at n=1).
    assert out.wilcoxon_p_holm.tolist() == pytest.approx([0.25, 1.0, 0.5])
    # n=1 unpaired: every none value beats every norm value -> delta 1, exact MW p 2/20 = 0.1.
    assert (out.loc[1, "cliffs_delta"], out.loc[1, "mann_whitney_p"]) == (1.0, pytest.approx(0.1))
    assert out.loc[2, "ci_method"] == "degenerate" and (out.loc[2, "ci_low"], out.loc[2, "ci_high"]) == (0, 0)
    assert out.loc[3, "ci_method"] == "degenerate"  # constant d = [-1, -1]
    assert out.loc[1, "ci_low"] <= 4.0 <= out.loc[1, "ci_high"]
    # T given as an int, or as a column name, gives the same frame.
    pd.testing.assert_frame_equal(
        full, paired_summary(_paired_frame(), ["task", "eval_loops"], "boundary", "none", "norm", trained_loops=2)
    )
    pd.testing.assert_frame_equal(
        full,
        paired_summary(
            _paired_frame(), ["task", "eval_loops"], "boundary", "none", "norm", trained_loops="trained_loops"
        ),
    )


def test_paired_summary_holm_separately_below_and_beyond_T():
    out = paired_summary(_paired_frame(extra_loop=True), ["task", "eval_loops"], "boundary", "none", "norm")
    out = out.set_index(["task", "eval_loops"])
    # Task A (T = 2): below {n=1: 0.25} alone -> 0.25 (pooled with beyond it would be 0.25*3);
    # at {n=2: 1}; beyond {n=3: 0.5, n=4: 0.25}: 0.25*2 = 0.5, 0.5*1 = 0.5 -> [0.5, 0.5].
    a = out.loc["A"]
    assert list(a.side) == ["below", "at", "beyond", "beyond"]
    assert a.wilcoxon_p.tolist() == pytest.approx([0.25, 1.0, 0.5, 0.25])
    assert a.wilcoxon_p_holm.tolist() == pytest.approx([0.25, 1.0, 0.5, 0.5])
    # Task B (T = 3, its own families): below {n=1: 0.25, n=2: 1}: 0.25*2 = 0.5, 1*1 = 1 -> [0.5, 1];
    # at {n=3: 0.5} unadjusted; beyond {n=4: 0.25} alone.
    b = out.loc["B"]
    assert list(b.side) == ["below", "below", "at", "beyond"] and list(b.trained_loops) == [3, 3, 3, 3]
    assert b.wilcoxon_p_holm.tolist() == pytest.approx([0.5, 1.0, 0.5, 0.25])


def test_paired_summary_needs_loops_and_T():
    df = _paired_frame()
    with pytest.raises(ValueError, match="eval_loops"):
        paired_summary(df, ["task"], "boundary", "none", "norm")
    with pytest.raises(ValueError, match="trained budget"):
        paired_summary(df.drop(columns="trained_loops"), ["task", "eval_loops"], "boundary", "none", "norm")


def test_pairing_matters():
    # 8 seeds spread 10 apart; within each seed "none" sits a small, varying amount above "norm":
    # norm_k = 10k, none_k = 10k + 0.1(k+1), k = 0..7.
    # Paired: all 8 differences positive and distinct -> exact two-sided p = 2/2^8 = 0.0078125.
    # Unpaired: none_i > norm_j iff i >= j -> 36 of 64 pairs ">", 28 "<": delta = 8/64 = 0.125,
    # the two samples interleave and Mann-Whitney sees almost nothing.
    norm = [10.0 * k for k in range(8)]
    none = [10.0 * k + 0.1 * (k + 1) for k in range(8)]
    assert wilcoxon_p(none, norm) == pytest.approx(2 / 256)
    assert cliffs_delta(none, norm) == pytest.approx(0.125)
    assert mann_whitney_p(none, norm) > 0.5
    rows = pd.DataFrame(
        [("A", 2, m, k, v) for m, vs in (("norm", norm), ("none", none)) for k, v in enumerate(vs)],
        columns=["task", "eval_loops", "boundary", "seed", "value"],
    )
    row = paired_summary(rows, ["task", "eval_loops"], "boundary", "none", "norm", trained_loops=2).iloc[0]
    assert row.n_pairs == 8 and row.side == "at"
    assert row.mean_diff == pytest.approx(0.45)  # mean of 0.1..0.8
    assert row.wilcoxon_p == pytest.approx(2 / 256) and row.mann_whitney_p > 0.5
    assert 0.1 <= row.ci_low < 0.45 < row.ci_high <= 0.8  # CI over seeds excludes 0


def test_tost_shows_equivalence_only_inside_the_margin():
    from scipy import stats as sps

    from engine.core.stats import tost_p

    inside = [0.01, -0.005, 0.0, 0.004, 0.002, -0.001]  # mean 0.00167, well inside ±0.02
    lower = sps.ttest_1samp(inside, -0.02, alternative="greater").pvalue
    upper = sps.ttest_1samp(inside, 0.02, alternative="less").pvalue
    assert tost_p(inside, 0.02) == max(lower, upper) < 0.05
    assert tost_p([0.14, 0.12, 0.16, 0.10, 0.15], 0.02) > 0.95  # a gap of +0.13 is not equivalent to zero
    assert tost_p([0.01] * 5, 0.02) == 0.0 and tost_p([0.03] * 5, 0.02) == 1.0  # no variance: inside or not
    assert np.isnan(tost_p([0.01], 0.02))
