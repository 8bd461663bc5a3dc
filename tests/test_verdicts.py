"""The second study's verdict rules (README) on hand-made per-n tables, and on rows where the answer is known."""

import numpy as np
import pandas as pd
import pytest

from engine.experiments import verdicts as V

T = 3


def table(**changes) -> pd.DataFrame:
    """Per n = 1..6 (T = 3): none minus norm, both analyses' statistics. Separated on both sides, most beyond."""
    s = pd.DataFrame(
        {
            "mean_diff": [0.2, 0.1, 0.0, 0.1, 0.3, 0.4],
            "cliffs_delta": [0.6, 0.3, 0.0, 0.2, 0.7, 0.9],
            "mann_whitney_p": [0.01, 0.2, 1.0, 0.3, 0.01, 0.001],
            "wilcoxon_p": [0.01, 0.1, 1.0, 0.2, 0.01, 0.001],
            "wilcoxon_p_holm": [0.02, 0.1, 1.0, 0.4, 0.02, 0.003],
        },
        index=pd.Index(range(1, 7), name="eval_loops"),
    )
    for column, (n, value) in changes.items():
        s.loc[n, column] = value
    return s


def holds(s: pd.DataFrame) -> dict:
    return {claim: {a: ok for a, (ok, _) in by.items()} for claim, by in V.e2_level(s, T).items()}


def test_every_claim_holds_on_a_table_made_to_satisfy_them():
    assert holds(table()) == {c: {"paper": True, "paired": True} for c in "abc"}


def test_a_worse_none_breaks_a_under_the_analysis_that_sees_it():
    # n = 2: delta -0.5 with p 0.01 (paper), but the per-seed differences are not significant after Holm
    got = holds(table(cliffs_delta=(2, -0.5), mann_whitney_p=(2, 0.01), mean_diff=(2, -0.1), wilcoxon_p_holm=(2, 0.3)))
    assert got["a"] == {"paper": False, "paired": True}
    got = holds(table(mean_diff=(2, -0.1), wilcoxon_p_holm=(2, 0.01)))
    assert got["a"] == {"paper": True, "paired": False}


def test_closest_at_T_allows_ties_within_001_and_the_paired_test_at_T():
    assert holds(table(mean_diff=(3, 0.105)))["b"]["paper"]  # 0.105 <= 0.1 + 0.01
    assert not holds(table(mean_diff=(3, 0.12)))["b"]["paper"]
    assert holds(table(wilcoxon_p=(3, 0.01)))["b"] == {"paper": True, "paired": False}


def test_separation_needs_both_sides_and_the_larger_beyond():
    assert not holds(table(cliffs_delta=(1, 0.3)))["c"]["paper"]  # nothing large below T
    assert not holds(table(cliffs_delta=(1, 0.95)))["c"]["paper"]  # larger below than beyond
    assert not holds(table(wilcoxon_p_holm=(1, 0.2)))["c"]["paired"]  # nothing significant below T


def test_levels_and_the_surgery_on_rows_with_a_known_answer():
    rng = np.random.default_rng(0)
    records = []
    for seed in range(8):
        for boundary, acc in (("norm", 0.9), ("none", 0.95), ("norm->none", 0.3)):
            for d, split in ((1, "heldout"), (2, "heldout"), (3, "beyond")):
                for n in range(1, 7):
                    for metric, value in (
                        ("accuracy", acc + 0.01 * d + rng.normal(0, 0.001)),
                        ("choice_accuracy", 0.5),
                        ("top_token_share", 0.95),
                        ("option_rate", 0.8),
                        ("norm_post", 1.0 + n * n),
                    ):
                        key = dict(task="t", arch="looped", boundary=boundary, seed=seed, trained_loops=T)
                        records.append(key | dict(eval_loops=n, difficulty=d, metric=metric, value=value, split=split))
    rows = pd.DataFrame(records)
    paired = V.paired_modes(rows)
    assert set(paired["level"]) == {V.MEAN, V.HARDEST, "1", "2"}  # beyond-range difficulty 3 is not judged
    mean = paired[(paired.level == V.MEAN) & (paired.eval_loops == T)].iloc[0]
    assert abs(mean["mean_diff"] - 0.05) < 0.002 and mean["n_pairs"] == 8
    assert mean["wilcoxon_p"] == 2 / 2**8  # every seed's difference is positive: the exact two-sided p
    surgery = V.surgery_at_T(rows).set_index("level")
    assert abs(surgery.loc[V.HARDEST, "accuracy"] - 0.32) < 0.002  # difficulty 2: 0.3 + 0.02
    assert surgery.loc[V.MEAN, "non_answer"] == pytest.approx(0.2)  # 1 - option rate 0.8
    assert surgery.loc[V.MEAN, "norm_ratio"] == pytest.approx(5.0)  # state norms 2, 5, 10 over n = 1..T
    d = [c for c in V.e2_claims(paired, V.surgery_at_T(rows)) if c.claim == "d"]
    assert d and all(c.outcome == "does NOT hold" for c in d)  # accuracy 0.31, top share 0.95, but the norm grew 5x


@pytest.mark.slow
def test_verify_retrains_a_shipped_group_bit_for_bit_and_says_so(tmp_path, capsys):
    from engine.cli import main

    assert (
        main(["run", "e2", "--preset", "smoke", "--seeds", "2", "--tasks", "parity", "--results", str(tmp_path)]) == 0
    )
    capsys.readouterr()
    args = ["verify", "e2", "--preset", "smoke", "--seeds", "1", "--task", "parity", "--boundary", "norm"]
    assert main([*args, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "seed 0: bit-identical to the shipped run" in out and "verified: bit for bit." in out
    assert main([*args, "--results", str(tmp_path / "empty")]) == 2  # nothing shipped there: one sentence


def test_verify_report_flags_each_n_outside_and_says_when_more_seeds_were_free():
    from engine.core.presets import smoke
    from engine.runtime import verify

    cfg = smoke("parity", "norm")
    per_n = pd.DataFrame(
        {"n": [1, 2], "retrained": [0.5, 0.99], "shipped": [0.5, 0.8], "shipped_min": [0.4, 0.7],
         "shipped_max": [0.6, 0.9], "inside": [True, False], "mann_whitney_p": [0.9, 0.01]}
    )  # fmt: skip
    result = {"identical": {0: False}, "per_n": per_n, "machine": {}, "shipped_seeds": 2, "retrained_groups": [[0, 1]]}
    lines = verify.report(result, cfg).splitlines()
    assert lines[1] == "  seed 0: differs from the shipped run"
    assert lines[-2].endswith("p 0.9  ok") and lines[-1].endswith("p 0.01  OUTSIDE")
    assert any(f"whole group of {cfg.train.group_size}" in line for line in lines)  # 1 seed asked of a group of 2
    assert any("--seeds 0-1," in line for line in lines)  # the retrained groups, spelled as --seeds reads them
    whole = dict(result, identical=dict.fromkeys(range(cfg.train.group_size), False))
    assert not any("whole group" in line for line in verify.report(whole, cfg).splitlines())


def rows_e4(looped_acc, stacked_acc, seeds: int = 8) -> pd.DataFrame:
    """Accuracy rows of looped (T = 2, n = 1..6) and stacked (T = 1) models, one held-out difficulty."""
    records = []
    for seed in range(seeds):
        for n in range(1, 7):
            for arch, T, acc in (("looped", 2, looped_acc(n)), ("stacked", 1, stacked_acc(n))):
                key = dict(task="t", arch=arch, boundary="norm", seed=seed, trained_loops=T, eval_loops=n)
                records.append(key | dict(difficulty=1, metric="accuracy", value=acc + 0.001 * seed, split="heldout"))
    return pd.DataFrame(records)


def test_e4_matched_overshoot_vanishes_where_looped_at_T_times_o_equals_stacked_at_o():
    # looped at n: 1 - 0.1 * |n - 2| / 2; stacked at n: the looped value at 2n, so matched gaps are exactly 0
    looped = lambda n: 1 - 0.05 * abs(n - 2)  # noqa: E731
    rows = rows_e4(looped, lambda n: looped(2 * n))
    table = V.e4_table(rows)
    matched = table[(table.family == "matched") & (table.level == V.MEAN)]
    assert list(matched.x) == [1, 2, 3] and (matched.gap.abs() < 1e-12).all()
    equal = table[(table.family == "equal") & (table.level == V.MEAN)].set_index("x")
    assert equal.loc[4, "gap"] == pytest.approx(looped(4) - looped(8))  # 0.9 - 0.7 at equal n = 4
    claims = {(c.claim, c.analysis): c.outcome for c in V.e4_claims(table) if c.level == V.MEAN}
    assert claims[("matched", "paper")] == "vanishes" and claims[("matched", "paired")] == "vanishes"
    assert claims[("equal n", "paired")] == "holds"  # looped is ahead at every n >= 2


def test_e3_recovery_verdicts_read_the_damaged_seeds_and_say_undecided_below_eight():
    records = []
    for seed in range(10):
        for target, final in (("head", 0.33), ("head+last", 1.0), ("head+first", 0.5)):
            for steps, value in ((0, 0.0), (100, final - 0.01), (200, final), (400, final)):
                recovery = np.nan if seed >= 9 else value  # seed 9: the surgery did not damage it
                key = dict(task="t", arch="looped", boundary="norm->none", seed=seed, trained_loops=2, eval_loops=2)
                for difficulty in (0, 3):  # 0: the in-range mean (e3.IN_RANGE); 3: the hardest held-out
                    records.append(key | dict(difficulty=difficulty, metric="recovery", value=recovery + 0.001 * seed,
                                              refit_target=target, refit_steps=steps, split="heldout"))  # fmt: skip
    found = {(c.claim, c.level): c for c in V.e3_claims(pd.DataFrame(records)) if c.analysis != "paper"}
    assert found[("a", V.MEAN)].outcome == "holds" and "9 damaged seeds" in found[("a", V.MEAN)].measured
    assert found[("b", V.HARDEST)].outcome == "holds"
    assert found[("last layer", V.MEAN)].outcome == "holds"  # 1.0 vs 0.5 on 9 seeds: Wilcoxon p = 2/512
    few = pd.DataFrame(records)
    few = few[few.seed < 5]
    assert all(c.outcome == "undecided" for c in V.e3_claims(few) if c.claim in ("a", "b"))  # 5 < 8 seeds


def test_e3_last_layer_with_both_refits_at_the_ceiling_is_undecided_not_a_failure():
    """Issue 60: the `cpu` chain's head+last and head+first both recover 1.000 at every damaged seed; no difference
    is no evidence either way (Wilcoxon drops every pair), so the claim is undecided, not "does NOT hold"."""
    records = []
    for seed in range(10):
        for target, final in (("head", 0.9), ("head+last", 1.0), ("head+first", 1.0)):
            for steps in (0, 100, 200):
                key = dict(task="t", arch="looped", boundary="norm->none", seed=seed, trained_loops=2, eval_loops=2)
                for difficulty in (0, 3):
                    records.append(key | dict(difficulty=difficulty, metric="recovery", value=final * steps / 200,
                                              refit_target=target, refit_steps=steps, split="heldout"))  # fmt: skip
    rows = pd.DataFrame(records)
    last = [c for c in V.e3_claims(rows) if c.claim == "last layer"]
    assert len(last) == 2 and all(c.outcome == "undecided" and "ceiling" in c.measured for c in last)
    rows.loc[(rows.refit_target == "head+first") & (rows.refit_steps == 200), "value"] = 0.5  # now it can tell
    assert all(c.outcome == "holds" for c in V.e3_claims(rows) if c.claim == "last layer")


def test_the_smallest_p_each_test_reaches_with_few_seeds():
    assert V.least_p(2, True) == 0.5 and V.least_p(5, True) == 0.0625 and V.least_p(6, True) == 0.03125
    assert V.least_p(2, False) > 0.05 and V.least_p(4, False) < 0.05 and V.least_p(0, True) == 1.0
    assert V.too_few(6, True) == "" and "Holm over 3 n" in V.too_few(6, True, 3) and V.too_few(8, True, 3) == ""


def rows_e2(seeds: int) -> pd.DataFrame:
    """Held-out accuracy of `none` and `norm` (T = 2, n = 1..4, one difficulty): `none` ahead by 0.1 at every n but
    T, where the two meet, each seed a little apart."""
    records = []
    for seed in range(seeds):
        for n in range(1, 5):
            for boundary, acc in (("none", 0.8 + (0.0 if n == 2 else 0.1)), ("norm", 0.8)):
                key = dict(task="t", arch="looped", boundary=boundary, seed=seed, trained_loops=2, eval_loops=n)
                records.append(key | dict(difficulty=1, metric="accuracy", value=acc + 0.01 * seed, split="heldout"))
    return pd.DataFrame(records)


def test_a_two_seed_run_reads_undecided_where_its_tests_cannot_reach_p_005():
    """Issue 60: a 2-seed smoke run got "holds" badges from rules that read "no significant gap" (E2 (a), (b) paired,
    E4's "vanishes"), which two seeds give whatever the values: with fewer seeds than the rule's test needs to reach
    p < 0.05 the outcome is undecided, and says why; with enough seeds the same values are judged."""
    surgery = pd.DataFrame(columns=["task", "level"])
    two = {(c.claim, c.analysis): c for c in V.e2_claims(V.paired_modes(rows_e2(2)), surgery) if c.level == V.MEAN}
    assert len(two) == 6 and all(c.outcome == "undecided" for k, c in two.items() if k != ("b", "paper")), two
    assert "2 seeds, too few" in two[("a", "paired")].measured
    many = {(c.claim, c.analysis): c.outcome for c in V.e2_claims(V.paired_modes(rows_e2(16)), surgery)}
    assert "undecided" not in many.values()
    looped = lambda n: 1 - 0.05 * abs(n - 2)  # noqa: E731
    e4 = [c for c in V.e4_claims(V.e4_table(rows_e4(looped, lambda n: looped(2 * n), seeds=2))) if c.level == V.MEAN]
    assert len(e4) == 4 and all(c.outcome == "undecided" for c in e4)
