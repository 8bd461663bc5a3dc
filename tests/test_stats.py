"""Tests for engine.stats against values counted by hand (the counts are in the comments)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from engine.stats import (
    bootstrap_ci_delta,
    bootstrap_ci_mean,
    cliffs_delta,
    delta_magnitude,
    mann_whitney_p,
    mean_ci,
    summarize_modes,
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
