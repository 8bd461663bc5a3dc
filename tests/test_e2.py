"""E2 end to end at the smoke preset: stored rows, the surgery rows, summaries, claims, no recompute."""

import pandas as pd
import pytest

from engine.core.store import RESULT_COLUMNS, Store
from engine.experiments import e2
from engine.experiments import runs as experiments


@pytest.fixture(scope="module")
def e2_rows(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("results"))
    rows = e2.run("smoke", [0, 1], store, tasks=("parity",), progress=False)
    return store, rows


def test_e2_table_has_both_modes_and_the_surgery(e2_rows):
    store, rows = e2_rows
    assert list(rows.columns) == [*RESULT_COLUMNS, "split"]
    assert set(rows.boundary) == {"norm", "none", "norm->none"}
    assert set(rows.experiment) == {"e2"}
    table = store.read_table("e2-smoke")
    pd.testing.assert_frame_equal(table, rows)
    # the surgery is the identity at n = 1: same accuracy as the norm rows of the same seeds
    one = rows[(rows.metric == "accuracy") & (rows.eval_loops == 1) & rows.boundary.isin(["norm", "norm->none"])]
    pivot = one.pivot_table(index=["seed", "difficulty"], columns="boundary", values="value")
    assert (pivot["norm"] == pivot["norm->none"]).all()


def test_rerun_computes_nothing(e2_rows, monkeypatch):
    store, rows = e2_rows

    def fail(*a, **k):
        raise AssertionError("recomputed a cached result")

    monkeypatch.setattr(experiments, "train_group", fail)
    monkeypatch.setattr(experiments, "evaluate", fail)
    again = e2.run("smoke", [0, 1], store, tasks=("parity",), progress=False)
    pd.testing.assert_frame_equal(again, rows)


def test_summary_and_claims(e2_rows):
    _, rows = e2_rows
    summary = e2.summarize(rows, "smoke")
    assert set(summary.range) == {"in-range", "beyond"}
    assert summary.eval_loops.max() == 9 and (summary.n_a == 2).all()
    assert {"surgery_acc", "surgery_norm_ratio", "surgery_top_share"} <= set(summary.columns)
    assert (summary.surgery_norm_ratio >= 1).all()
    found = e2.claims(summary, {"parity": 3})
    assert [c["claim"] for c in found] == ["a", "b", "c", "d"]
    assert all(isinstance(c["reproduced"], bool) for c in found)


def test_claims_verdicts_on_hand_made_summaries():
    n = list(range(1, 7))

    def frame(delta, mean_a, mean_b, p, acc, share, ratio):
        return pd.DataFrame(
            dict(task="t", range="in-range", eval_loops=n, delta=delta, mean_a=mean_a, mean_b=mean_b,
                 p_value=p, surgery_acc=acc, surgery_top_share=share, surgery_norm_ratio=ratio)
        )  # fmt: skip

    # the paper's shape: none better on both sides, equal at T = 3, surgery collapses onto one token
    good = frame([0.5, 0.3, 0.0, 0.6, 0.8, 0.9], [0.5, 0.7, 1.0, 0.6, 0.5, 0.5], [0.7, 0.8, 1.0, 0.9, 0.9, 0.9],
                 [0.01] * 6, [0.5, 0.2, 0.0, 0.0, 0.0, 0.0], [0.6, 0.9, 1.0, 1.0, 1.0, 1.0], [1.5] * 6)  # fmt: skip
    assert all(c["reproduced"] for c in e2.claims(good, {"t": 3}))
    # none clearly worse at n = 2, closest elsewhere, no collapse
    bad = frame([0.5, -0.6, 0.1, 0.0, 0.1, 0.1], [0.5, 0.9, 1.0, 0.9, 0.8, 0.8], [0.6, 0.5, 0.98, 0.9, 0.82, 0.8],
                [0.01] * 6, [0.9] * 6, [0.5] * 6, [5.0] * 6)  # fmt: skip
    assert not any(c["reproduced"] for c in e2.claims(bad, {"t": 3}))
