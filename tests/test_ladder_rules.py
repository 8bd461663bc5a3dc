"""The GPU study's rules over both devices' ladders (engine/experiments/ladder.py; README, "The GPU study:
predictions and rules", committed before any GPU run): the trend of the surgery's damage against log10(parameters)
with a seed bootstrap, collapse per rung by E2 (d)'s criteria, and the bridge's GPU-against-CPU comparison."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.experiments import ladder

SHIPPED = Path(__file__).resolve().parents[1] / "cached_results"


def e5_table(rungs: dict[int, list[float]], norm_acc: float = 0.9, share: float = 0.6, growth: float = 1.5,
             steps: int = 2000) -> pd.DataFrame:  # fmt: skip
    """An E5-shaped table: per rung (params) and seed, `norm` at norm_acc and `norm->none` at norm_acc - damage at
    every n, two held-out lengths; the surgery's top-token share and a state norm growing to `growth` by T = 4."""
    rows = []
    for params, damages in rungs.items():
        for seed, damage in enumerate(damages):
            for n in range(1, 13):
                for difficulty in (11, 12):
                    base = dict(task="parity", arch="looped", seed=seed, trained_loops=4, eval_loops=n,
                                difficulty=difficulty, split="heldout", train_loops="fixed:4", params=params,
                                train_steps=steps)  # fmt: skip
                    rows.append(base | dict(boundary="norm", metric="accuracy", value=norm_acc))
                    cut = base | dict(boundary="norm->none")
                    rows.append(cut | dict(metric="accuracy", value=norm_acc - damage))
                    rows.append(cut | dict(metric="top_token_share", value=share))
                    rows.append(cut | dict(metric="norm_post", value=1 + (growth - 1) * min(n - 1, 3) / 3))
    return pd.DataFrame(rows)


def outcomes(found: list) -> dict[str, str]:
    return {c.claim: c.outcome for c in found}


@pytest.mark.slow
def test_the_trend_grows_shrinks_or_stays_flat_by_its_bootstrap_ci():
    seeds = np.array([0.0, 0.02, -0.01, 0.01])
    growing = {p: list(0.1 * np.log10(p) + seeds) for p in (16_000, 55_000, 412_288)}
    cpu = e5_table({p: d for p, d in growing.items()})
    gpu = e5_table({1_600_000: list(0.1 * np.log10(1.6e6) + seeds), 19_000_000: list(0.1 * np.log10(1.9e7) + seeds)})
    found = outcomes(ladder.rules(cpu, gpu))
    assert found["ladder trend at n=4"] == found["ladder trend at n=12"] == "grows"
    both = pd.concat([ladder.ladder_rows(cpu, "cpu"), ladder.ladder_rows(gpu, "gpu")])
    t = ladder.trend(ladder.damage_points(ladder.seed_values(ladder.held_out(both)), 4))
    assert t["slope"] == pytest.approx(0.1) and t["rungs"] == 5 and t["low"] == 16_000 and t["high"] == 19_000_000
    shrinking = e5_table({p: list(0.5 - 0.1 * np.log10(p) + seeds) for p in (16_000, 412_288, 19_000_000)})
    assert outcomes(ladder.rules(shrinking, None))["ladder trend at n=4"] == "shrinks"
    noisy = e5_table({16_000: [0.3, 0.0, 0.2, 0.1], 412_288: [0.0, 0.3, 0.1, 0.2], 19_000_000: [0.2, 0.1, 0.0, 0.3]})
    assert outcomes(ladder.rules(noisy, None))["ladder trend at n=4"] == "flat"


def test_each_rung_counts_once_the_bridge_with_the_cpus_seeds():
    cpu = e5_table({16_000: [0.1] * 4, 412_288: [0.1] * 4})
    gpu = e5_table({412_288: [0.9] * 4, 19_000_000: [0.1] * 4})  # the GPU's bridge would make a peak if counted
    acc = ladder.seed_values(
        ladder.held_out(pd.concat([ladder.ladder_rows(cpu, "cpu"), ladder.ladder_rows(gpu, "gpu")]))
    )
    points = ladder.damage_points(acc, 4)
    assert sorted(points["params"].unique()) == [16_000, 412_288, 19_000_000] and len(points) == 12
    assert points.loc[points["params"] == 412_288, "damage"].tolist() == pytest.approx([0.1] * 4)
    bridge = ladder.bridge(acc)
    assert set(bridge["params"]) == {412_288} and set(bridge["boundary"]) == {"norm", "norm->none"}
    cut = bridge[(bridge["boundary"] == "norm->none") & (bridge["eval_loops"] == 4)].iloc[0]
    assert cut["gpu_mean"] == pytest.approx(0.0) and cut["cpu_mean"] == pytest.approx(0.8)
    assert cut["mann_whitney_p"] < 0.05  # 4 against 4, every GPU seed below every CPU seed
    same = bridge[bridge["boundary"] == "norm"]["mann_whitney_p"]
    assert (same == 1.0).all()


def test_collapse_per_rung_takes_the_median_seed_on_each_criterion():
    collapsed = e5_table({19_000_000: [0.5, 0.45, 0.4, 0.1]}, share=0.95, growth=1.5)  # accuracy 0.4-0.8 after
    found = ladder.collapse(ladder.held_out(ladder.ladder_rows(collapsed, "gpu"))).iloc[0]
    assert found["accuracy"] == pytest.approx(0.475) and found["worst_accuracy"] == pytest.approx(0.8)
    assert found["norm_ratio"] == pytest.approx(1.5) and bool(found["collapsed"])
    for knobs in (dict(share=0.5), dict(growth=4.0), dict(norm_acc=1.0)):  # each criterion alone breaks it
        t = e5_table({19_000_000: [0.5, 0.45, 0.4, 0.1]}, **{"share": 0.95, "growth": 1.5} | knobs)
        assert not ladder.collapse(ladder.held_out(ladder.ladder_rows(t, "gpu"))).iloc[0]["collapsed"], knobs


def test_the_learned_seeds_trend_leaves_out_seeds_that_never_learned_and_is_reported_only():
    """A seed at chance run as trained has no damage to lose: the reported companion drops it, the rule keeps it."""
    learned = e5_table({16_000: [0.1] * 4, 412_288: [0.2] * 4, 19_000_000: [0.3, 0.3, 0.3, 0.3]})
    chance = e5_table({19_000_000: [0.0, 0.0]}, norm_acc=0.5)  # two 19M seeds (ids 0-1) that never learned
    rows = pd.concat([learned[~((learned["params"] == 19_000_000) & learned["seed"].isin([0, 1]))], chance])
    acc = ladder.seed_values(ladder.held_out(ladder.ladder_rows(rows, "cpu")))
    every, kept = ladder.damage_points(acc, 4), ladder.damage_points(acc, 4, learned_at=4)
    assert len(every) == 12 and len(kept) == 10
    assert set(kept.loc[kept["params"] == 19_000_000, "seed"]) == {2, 3}
    found = {c.claim: c for c in ladder.rules(rows, None)}
    assert found["trend over learned seeds at n=4"].outcome == "reported"
    assert "10 of 12 (rung, seed) points" in found["trend over learned seeds at n=4"].measured
    assert ladder.trend(kept)["slope"] > ladder.trend(every)["slope"]  # the zeros pulled the rule's slope down
    none_learned = {c.claim: c for c in ladder.rules(e5_table({16_000: [0.0] * 4, 412_288: [0.0] * 4}, 0.5), None)}
    assert "0 of 8 (rung, seed) points" in none_learned["trend over learned seeds at n=4"].measured


def test_only_the_common_training_length_and_seeds_0_to_3_enter():
    base = e5_table({16_000: [0.1] * 6, 412_288: [0.1] * 4})
    longer = e5_table({55_000: [0.9] * 4}, steps=4000)  # E5's one longer-trained rung
    rows = ladder.ladder_rows(pd.concat([base, longer]), "cpu")
    assert set(rows["params"]) == {16_000, 412_288} and set(rows["seed"]) == {0, 1, 2, 3}


@pytest.mark.skipif(not (SHIPPED / "e5-cpu.parquet").exists(), reason="no shipped E5 table")
def test_the_shipped_cpu_ladder_alone():
    """Before any GPU run: the CPU's five rungs (16k-412k) under the rule, as the README reports them."""
    found = ladder.rules(pd.read_parquet(SHIPPED / "e5-cpu.parquet"), None)
    trend = [c for c in found if c.claim.startswith("ladder trend")]
    assert [c.claim for c in trend] == ["ladder trend at n=4", "ladder trend at n=12"]
    assert all("over 5 rungs (15,904-412,288 parameters), 4 seeds" in c.measured for c in trend)
    assert len([c for c in found if c.claim.startswith("collapse")]) == 5
    assert not [c for c in found if c.claim.startswith("bridge")]  # one device: no bridge yet


def test_the_rescale_rule_per_rung_needs_3_of_4_damaged_seeds():
    """E5 part 4's rule on each rung of a ladder-only table (the GPU study): undecided below 3 damaged seeds of 4,
    not below E5's 8 of 16 (which no rung of 4 seeds could reach)."""
    from engine.experiments import e5

    def table(damages):
        t = e5_table({412_288: damages})
        cut = t[(t["boundary"] == "norm->none") & (t["metric"] == "accuracy")]
        return pd.concat([t, cut.assign(boundary="norm->rescale", value=0.9)], ignore_index=True)  # full recovery

    rescale = lambda t: {c.claim: c.outcome for c in e5.judge(e5.summarize(t))}["rescale 412,288 params"]  # noqa: E731
    assert rescale(table([0.3, 0.3, 0.3, 0.0])) == "agreement"
    assert rescale(table([0.3, 0.3, 0.0, 0.0])) == "undecided"
    three = table([0.3, 0.3, 0.3, 0.3])
    assert rescale(three[three["seed"] != 3]) == "undecided"  # 3 of 3 damaged, but the rung's fourth seed not in yet


def test_a_part_trained_ladder_decides_neither_the_trend_nor_a_short_rungs_collapse():
    """The `cpu-ladder` page read "flat" over 3 of its 8 rungs while the others trained (2026-12-06)."""
    seeds = np.array([0.0, 0.02, -0.01, 0.01])
    table = e5_table({p: list(0.1 * np.log10(p) + seeds) for p in (16_000, 412_288, 19_000_000)})
    assert outcomes(ladder.rules(table, None))["ladder trend at n=4"] == "grows"  # read as it stands
    every = (16_000, 55_000, 412_288, 19_000_000)
    found = {c.claim: c for c in ladder.rules(table, None, every)}
    assert found["ladder trend at n=4"].outcome == found["ladder trend at n=12"].outcome == "undecided"
    assert "1 of the 4 rungs still short (55,000 parameters)" in found["ladder trend at n=4"].measured
    assert found["collapse 412,288 params (cpu)"].outcome == "no collapse"  # four seeds: decided
    short = table[~((table["params"] == 19_000_000) & (table["seed"] == 3))]
    found = {c.claim: c for c in ladder.rules(short, None, (16_000, 412_288, 19_000_000))}
    assert found["collapse 19,000,000 params (cpu)"].outcome == "undecided"
    assert "(19,000,000 parameters)" in found["ladder trend at n=4"].measured
    complete = {c.claim: c.outcome for c in ladder.rules(table, None, (16_000, 412_288, 19_000_000))}
    assert complete["ladder trend at n=4"] == "grows"
    assert len(ladder.every_rung("cpu-ladder")) == 8 and ladder.every_rung("gpu-smoke") is None
    assert ladder.every_rung("cpu") == ladder.every_rung("gpu") == ladder.every_rung("cpu-ladder")


def claims(trend: str, falls: dict[int, str], rescue: dict[int, str]) -> tuple[list[dict], list[dict]]:
    """rules()'s claims (trend at T and 3T, collapse per rung) and E5's rescale claims per rung at both levels (the
    reading takes the held-out mean's), as mappings."""
    found = [dict(claim=f"ladder trend at n={n}", outcome=trend, measured="b = +0.120 per decade [+0.050, +0.190] over")
             for n in (4, 12)]  # fmt: skip
    found += [dict(claim=f"collapse {p:,} params (cpu)", outcome=o, measured=f"cpu: median accuracy {p}")
              for p, o in falls.items()]  # fmt: skip
    rescue = [dict(claim=f"rescale {p:,} params", outcome=o, measured="", task="parity", level=level)
              for p, o in rescue.items() for level in ("held-out mean", "hardest held-out")]  # fmt: skip
    other = dict(
        claim="rescale 16,000 params", outcome="normalisation", measured="", task="chain", level="held-out mean"
    )
    return found, rescue + [other]  # another task's claim is not read


def test_the_reading_waits_while_a_rule_is_undecided_and_reads_nothing():
    found, rescue = claims("undecided", {16_000: "no collapse", 5_342_592: "undecided"}, {16_000: "agreement"})
    text = ladder.reading(found, rescue)
    assert text.startswith("Not read yet: 3 of the rules' 4 readings")
    assert "wait until every rung has its 4 seeds" in text and "collapse 5,342,592 params (cpu)" in text
    assert "agreement" not in text and "normalisation" not in text


def test_the_reading_follows_each_parts_outcome_to_the_prediction_it_matches():
    rungs = (16_000, 412_288, 19_024_384)
    found, rescue = claims("flat", dict.fromkeys(rungs, "no collapse"), {16_000: "agreement", 412_288: "undecided",
                                                                          19_024_384: "agreement"})  # fmt: skip
    text = ladder.reading(found, rescue)
    assert "All three parts come out as the 'agreement' reading predicts" in text
    assert "the ladder does not head toward the paper's collapse (Ouro's 0.000" in text
    assert "b = +0.120 per decade [+0.050, +0.190]" in text and "at 2 of 3 rungs, mixed or undecided at 1" in text
    assert text.endswith(ladder.LIMITS)  # what the design cannot separate, said with every reading
    found, rescue = claims(
        "grows", {16_000: "no collapse", 19_024_384: "collapses"}, dict.fromkeys(rungs, "normalisation")
    )
    text = ladder.reading(found, rescue)
    assert "All three parts come out as the 'normalisation' reading predicts" in text
    assert "collapses by E2 (d)'s criteria (cpu: median accuracy 19024384)" in text  # the top rung's numbers
    assert "the rungs of 19,024,384 parameters collapse" in text and "appears on this ladder at 19,024,384" in text
    found, rescue = claims("grows", dict.fromkeys(rungs, "no collapse"), dict.fromkeys(rungs, "agreement"))
    text = ladder.reading(found, rescue)
    assert "the trend comes out as 'normalisation' predicts, the collapse comes out as 'agreement' predicts" in text
    assert "heads toward the paper's collapse (Ouro's 0.000 by n = T) without reaching it" in text
    text = ladder.reading(*claims("shrinks", dict.fromkeys(rungs, "no collapse"), {}))
    assert "the trend comes out as neither predicts" in text and "moves away from the paper's collapse" in text
