"""E4: overshoot is derived from stored columns; looped vs stacked comparisons line up the right rows."""

import pandas as pd
import pytest

from engine.experiments import e4
from engine.experiments.verdicts import MEAN


def rows_for(arch, trained_loops, loops, acc_of, seeds=(0, 1, 2)):
    out = []
    for seed in seeds:
        for n in loops:
            for boundary in ["norm", "norm->none"] if arch == "stacked" else ["norm", "none"]:
                out.append(
                    dict(experiment="e4", run_key=f"{arch}{seed}", task="parity", arch=arch, boundary=boundary,
                         seed=seed, trained_loops=trained_loops, eval_loops=n, difficulty=3, metric="accuracy",
                         value=acc_of(n, seed))
                )  # fmt: skip
    return out


@pytest.fixture
def table():
    looped = rows_for("looped", 4, range(1, 13), lambda n, s: 0.9 if n >= 4 else 0.6)
    stacked = rows_for("stacked", 1, range(1, 13), lambda n, s: 0.9 if n == 1 else 0.7 + 0.01 * s)
    return pd.DataFrame(looped + stacked)


def test_overshoot_is_derived_from_eval_and_trained_loops(table):
    derived = e4.with_overshoot(table)
    row = derived[(derived.arch == "looped") & (derived.eval_loops == 6)].iloc[0]
    assert row.ratio == 1.5 and row.difference == 2
    row = derived[(derived.arch == "stacked") & (derived.eval_loops == 3)].iloc[0]
    assert row.ratio == 3 and row.difference == 2
    # a stacked model run without the norm stands for mode none (its training is the same at T = 1)
    assert set(derived[derived.arch == "stacked"]["mode"]) == {"norm", "none"}


def test_equal_n_and_matched_overshoot_pair_the_right_rows(table):
    equal = e4.compare(table, "n").query("mode == 'norm'").set_index("x")
    assert equal.loc[4, "mean_b"] == pytest.approx(0.9) and equal.loc[4, "mean_a"] == pytest.approx(0.71)
    assert equal.loc[4, "delta"] == 1.0  # every looped seed beats every stacked seed
    matched = e4.compare(table, "ratio").query("mode == 'norm'").set_index("x")
    # ratio 1: looped n = 4 (0.9) against stacked n = 1 (0.9): no gap left
    assert matched.loc[1.0, "gap"] == pytest.approx(0.0) and matched.loc[1.0, "delta"] == 0.0
    # ratio 0.25 exists only for the looped model: not compared
    assert 0.25 not in matched.index
    diff = e4.compare(table, "difference").query("mode == 'norm'").set_index("x")
    assert diff.loc[0, "gap"] == pytest.approx(0.0)  # both at their budget


def test_claims_read_the_comparison(table):
    """E4's one judge (verdicts.e4_claims) on a table without held-out items: its in-range items stand in."""
    seeds = range(8)
    looped = rows_for("looped", 4, range(1, 13), lambda n, s: 0.9 if n >= 4 else 0.6, seeds)
    stacked = rows_for("stacked", 1, range(1, 13), lambda n, s: 0.9 if n == 1 else 0.7 + 0.01 * s, seeds)
    eight = pd.DataFrame(looped + stacked)
    found = {(c.claim, c.analysis, c.level): c for c in e4.claims(eight, "smoke")}
    assert found[("equal n", "paper", MEAN)].outcome == "holds"  # looped 0.9 vs stacked ~0.74 from n = 4 on
    assert found[("matched", "paper", MEAN)].outcome in ("vanishes", "shrinks", "stays")
    assert "looped vs stacked at equal overshoot ratio n/T" in e4.report(table, "smoke")


def test_unknown_axis_is_refused(table):
    with pytest.raises(ValueError, match="axis must be one of"):
        e4.compare(table, "depth")
