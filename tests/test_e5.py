"""E5 (beyond the paper): the effects decomposition on hand-made numbers, the training loop-count sampler, the
rescale surgery, the unchanged run keys and training of the default config, and `loopscope run e5` end to end."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from engine.core import presets
from engine.core.evaluate import evaluate, state_scales
from engine.core.model import LoopedLM, build
from engine.core.presets import preset
from engine.core.store import RESULT_COLUMNS, Store
from engine.core.train import loop_schedule, train_group
from engine.experiments import e5
from engine.experiments.verdicts import HARDEST, MEAN

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

# ---------------------------------------------------------------- run keys and training of the default config

# Computed before `train.loops` existed (2026-12-03): every stored run must keep its key.
PINNED_KEYS = {
    ("smoke", "parity", "norm"): ("e2c5889f73ba4e09", "e1f72b86e968cf12"),
    ("smoke", "parity", "none"): ("d5cb1dbf8739a3ba", "cfe5150d745332c0"),
    ("smoke", "chain", "norm"): ("0dad5b9a8c729ca6", "c602c4aa959ecd8a"),
    ("smoke", "chain", "none"): ("d7e8e7b89519126d", "11639054e5307fe0"),
    ("cpu", "parity", "norm"): ("54cb465fa855929b", "ac0f78f7e205365d"),
    ("cpu", "parity", "none"): ("682b9cbb513f4e75", "0d61458b37e1f66f"),
    ("cpu", "chain", "norm"): ("0d911260484af682", "123633eb320e3205"),
    ("cpu", "chain", "none"): ("9734984bb9384aa9", "00fdd05a3d13c428"),
}


@pytest.mark.parametrize("which", sorted(PINNED_KEYS))
def test_the_default_loop_count_keeps_every_run_key(which):
    cfg = preset(*which)
    assert (cfg.run_key(0), cfg.run_key(1)) == PINNED_KEYS[which]
    assert "loops" not in cfg.to_dict()["train"] and cfg.train_loops == f"fixed:{cfg.model.trained_loops}"
    spelled = replace(cfg, train=replace(cfg.train, loops=cfg.train_loops))  # fixed:T written out: the same run
    assert spelled == cfg and spelled.run_key(0) == cfg.run_key(0)
    ranged = replace(cfg, train=replace(cfg.train, loops="uniform:1-8"))
    assert ranged.run_key(0) not in PINNED_KEYS[which] and ranged.to_dict()["train"]["loops"] == "uniform:1-8"
    assert presets.RunConfig.from_dict(ranged.to_dict()) == ranged


def tiny(steps=30, **train):
    cfg = preset("smoke", "parity", "norm")
    return replace(cfg, train=replace(cfg.train, steps=steps, **train))


def test_a_distribution_that_always_draws_T_trains_bit_identically_to_the_default(monkeypatch):
    """The per-step loop count goes through the sampler without touching any other random stream."""
    from engine.core.memory import estimate

    for cfg in (tiny(), tiny(loops="uniform:3-3"), tiny(loops="uniform:1-6")):
        estimate(cfg, 2, "cpu")  # the memory estimate's own forwards (cached per config), before counting training's
    seen = []
    forward = LoopedLM.forward
    monkeypatch.setattr(LoopedLM, "forward", lambda self, tokens, n=None, *a, **k: seen.append(n) or forward(
        self, tokens, n, *a, **k))  # fmt: skip
    default, always_T = tiny(), tiny(loops="uniform:3-3")
    assert default.run_key(0) != always_T.run_key(0)
    a = train_group(default, [0, 1], progress=False)
    b = train_group(always_T, [0, 1], progress=False)
    assert seen == [3] * 60
    assert torch.equal(a.losses, b.losses)
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())
    c = train_group(tiny(loops="uniform:1-6"), [0, 1], progress=False)
    assert seen[60:] == loop_schedule("uniform:1-6", 30) and not torch.equal(a.losses, c.losses)


def test_the_loop_sampler_is_seeded_by_its_name_and_has_the_mean_it_names():
    steps = 20_000
    for spec, mean, top in (("fixed:4", 4.0, 4), ("uniform:1-8", 4.5, 8), ("lognormal:4:12", 4.0, 12)):
        drawn = loop_schedule(spec, steps)
        assert drawn == loop_schedule(spec, steps)  # seeded: the same schedule for every seed of every group
        assert min(drawn) >= 1 and max(drawn) == top and np.mean(drawn) == pytest.approx(mean, abs=0.06), spec
    uniform, heavy = np.array(loop_schedule("uniform:1-8", steps)), np.array(loop_schedule("lognormal:4:12", steps))
    assert set(uniform) == set(range(1, 9)) and np.bincount(uniform)[1:].min() > 0.11 * steps
    assert (
        np.bincount(heavy).argmax() < 4 and (heavy > 8).mean() > 0.03
    )  # right-skewed: mode below the mean, a tail past 2T
    assert loop_schedule("uniform:1-8", 100) != loop_schedule("uniform:1-7", 100)
    assert e5.trained_range("uniform:1-8", 2000) == set(range(1, 9)) and e5.trained_range("fixed:4", 10) == {4}
    assert e5.trained_range("lognormal:4:12", 2000) == set(range(1, 11))  # 11 is drawn at 0.5%, the clipped 12 at 1.2%


@pytest.mark.parametrize(
    "spec", ["uniform:8-1", "uniform:0-3", "lognormal:1:4", "lognormal:4-12", "fixed", "poisson:4"]
)
def test_bad_loop_distributions_are_refused_with_a_sentence(spec):
    with pytest.raises(ValueError, match="names no loop-count distribution"):
        tiny(loops=spec)


# ---------------------------------------------------------------- the rescale surgery


def test_rescale_adds_no_parameter_reads_out_as_norm_at_n1_and_uses_its_scalars():
    cfg = preset("smoke", "parity", "norm").model
    model = build(cfg, [0, 1])
    keys = {k: v.shape for k, v in model.state_dict().items()}
    tokens = torch.randint(0, cfg.vocab_size, (2, 4, 9))
    scales = torch.rand(6, 2) + 0.5
    out = {mode: model(tokens, 6, mode, scales=scales if mode == "rescale" else None) for mode in ("norm", "none")}
    out["rescale"] = model(tokens, 6, "rescale", scales=scales)
    assert {k: v.shape for k, v in model.state_dict().items()} == keys  # nothing added by running it
    for mode in ("none", "rescale"):
        assert torch.equal(out[mode].logits[0], out["norm"].logits[0]), mode
        assert torch.equal(out[mode].norm_pre[0], out["norm"].norm_pre[0]), mode
    # the state handed on is the norm's gain times Block(h) over the step's scalar, one scalar per member
    x = model.block(model.embed_tokens[torch.arange(2)[:, None, None], tokens], model_rope(model, tokens))
    expected = model.norm.weight[:, None, None, :] * x / scales[0][:, None, None, None]
    assert torch.allclose(out["rescale"].norm_post[0], expected[:, :, -1].norm(dim=-1))
    doubled = model(tokens, 6, "rescale", scales=2 * scales)
    assert torch.equal(doubled.logits[0], out["rescale"].logits[0])
    assert not torch.allclose(doubled.logits[1:], out["rescale"].logits[1:])
    with pytest.raises(ValueError, match="rescale needs scales"):
        model(tokens, 6, "rescale")


def model_rope(model, tokens):
    from engine.core.model import rope_tables

    return rope_tables(tokens.shape[-1], model.cfg.head_dim, model.cfg.rope_theta, tokens.device)


def test_state_scales_are_the_mean_state_rms_of_a_norm_run_on_training_items():
    run = preset("smoke", "parity", "norm")
    model = build(run.model, [0, 1])
    scales = state_scales(model, run.task, 5, examples=16)
    assert scales.shape == (5, 2) and torch.equal(scales, state_scales(model, run.task, 5, examples=16))
    one = model.member(1)  # by hand, member 1, step 1 and 2: RMS of Block(h) per token, averaged
    import engine.core.tasks as tasks

    g = torch.Generator().manual_seed(tasks.derive_seed("state-scales", run.task.name, 0))
    per_difficulty = []
    for d in run.task.train_difficulties:
        tokens = tasks.train_batch(run.task, d, 16, g).tokens[None]
        h = one.embed_tokens[0][tokens]
        rms = []
        for _ in range(2):
            x = one.block(h, model_rope(one, tokens))
            rms.append(x.pow(2).mean(-1).sqrt().mean())
            h = one.norm(x)
        per_difficulty.append(torch.stack(rms))
    assert torch.allclose(torch.stack(per_difficulty).mean(0), scales[:2, 1], rtol=1e-5)


# ---------------------------------------------------------------- the decomposition on hand-made numbers

CELL_VALUES = {  # per seed: A(norm,norm), A(none,none), A(norm,none), A(none,norm)
    0: (0.9, 0.8, 0.3, 0.2),
    1: (1.0, 0.9, 0.5, 0.5),
    2: (0.8, 1.0, 0.6, 0.2),
}


def hand_made(values=CELL_VALUES, loops=(1, 2, 3, 4, 5, 6)) -> pd.DataFrame:
    rows = [
        dict(task="parity", train_loops="fixed:3", params=100, train_steps=10, trained_loops=3, level=MEAN,
             eval_loops=n, seed=seed, boundary=label, value=v)
        for seed, cells in values.items()
        for n in loops
        for label, v in zip(("norm", "none", "norm->none", "none->norm"), cells, strict=True)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_the_three_effects_per_seed_pair():
    per_seed = e5.decompose(hand_made())
    got = per_seed[per_seed["eval_loops"] == 1].pivot(index="seed", columns="effect", values="value")
    # seed 0: R = (0.3 + 0.8 - 0.9 - 0.2)/2 = 0, M = (0.2 + 0.8 - 0.9 - 0.3)/2 = -0.1, G = (0.9 + 0.8 - 0.3 - 0.2)/2
    expected = {0: (0.0, -0.1, 0.6), 1: (-0.05, -0.05, 0.45), 2: (0.3, -0.1, 0.5)}
    for seed, (r, m, g) in expected.items():
        assert got.loc[seed, ["run", "train", "agreement"]].tolist() == pytest.approx([r, m, g])
    table = e5.effects_table(per_seed)
    g = table[(table["effect"] == "agreement") & (table["eval_loops"] == 3)].iloc[0]
    assert g["mean"] == pytest.approx(np.mean([0.6, 0.45, 0.5])) and g["n"] == 3 and g["side"] == "at"
    assert g["ci_low"] <= g["mean"] <= g["ci_high"] and g["wilcoxon_p"] == pytest.approx(0.25)  # 3 of 3 positive
    assert g["wilcoxon_p_holm"] == pytest.approx(0.25)  # n = T: a family of one
    below = table[(table["effect"] == "agreement") & (table["side"] == "below")]
    assert below["wilcoxon_p_holm"].tolist() == pytest.approx([0.5, 0.5])  # Holm over n = 1, 2
    beyond = table[(table["effect"] == "agreement") & (table["side"] == "beyond")]
    assert beyond["wilcoxon_p_holm"].tolist() == pytest.approx([0.75] * 3)  # over n = 4, 5, 6
    missing = hand_made().query("not (seed == 2 and boundary == 'none->norm')")
    assert set(e5.decompose(missing)["seed"]) == {0, 1}  # a pair without all four cells is left out


def effect_rows(n_values: dict[int, dict[str, float]], p=0.001, T=2) -> pd.DataFrame:
    rows = [dict(eval_loops=n, side="below" if n < T else "at" if n == T else "beyond", quantity=q, mean=v,
                 wilcoxon_p_holm=p) for n, eff in n_values.items() for q, v in eff.items()]  # fmt: skip
    return pd.DataFrame(rows)


def test_part1_rule():
    agree = {n: {"run": 0.01, "train": 0.02, "agreement": 0.3} for n in range(1, 7)}
    assert e5.part1_outcome(effect_rows(agree))[0] == "agreement"
    assert e5.part1_outcome(effect_rows(agree, p=0.2))[0] == "mixed"  # not significant
    norm = {n: {"run": 0.3 if n > 2 else 0.0, "train": 0.0, "agreement": 0.1} for n in range(1, 7)}
    assert e5.part1_outcome(effect_rows(norm))[0] == "normalisation"
    negative = {n: {"run": 0.0, "train": 0.0, "agreement": -0.3} for n in range(1, 7)}
    assert e5.part1_outcome(effect_rows(negative))[0] == "mixed"


def range_rows(means, p) -> pd.DataFrame:
    return pd.DataFrame({"eval_loops": range(1, len(means) + 1), "mean": means, "wilcoxon_p_holm": p})


def test_part2_and_part4_rules():
    inside = {1, 2, 3, 4}
    separated = range_rows([0.2, 0.3, 0.0, 0.1, 0.3], [0.01, 0.01, 1, 0.3, 0.01])
    closed = range_rows([0.1, 0.01, 0.0, 0.05, 0.3], [0.2, 0.01, 1, 0.3, 0.01])
    assert e5.part2_outcome(closed, separated, inside)[0] == "agreement"
    assert e5.part2_outcome(closed, range_rows([0.1] * 5, [0.3] * 5), inside)[0] == "mixed"  # fixed-T never separates
    ahead = range_rows([0.2, 0.3, 0.0, 0.1, 0.0], [0.01, 0.01, 1, 0.3, 1])
    assert e5.part2_outcome(ahead, separated, inside)[0] == "normalisation"  # 2 of 4 n: half
    row = lambda mean, lo, hi, n=12: pd.Series(dict(mean=mean, ci_low=lo, ci_high=hi, n=n))  # noqa: E731
    assert e5.part4_outcome(row(0.6, 0.3, 0.9))[0] == "agreement"
    assert e5.part4_outcome(row(0.6, 0.2, 0.9))[0] == "mixed"
    assert e5.part4_outcome(row(0.1, 0.0, 0.2))[0] == "normalisation"
    assert e5.part4_outcome(row(0.9, 0.8, 1.0, n=5))[0] == "undecided"
    assert e5.part4_outcome(None)[0] == "undecided"


def test_summarize_and_claims_on_hand_made_rows():
    """Hand-made accuracy rows in the table's shape: every part of summarize() and a claim per rule."""
    base = hand_made(loops=range(1, 7)).drop(columns="level")
    ranged = base.assign(train_loops="uniform:1-4")
    ladder = base[base["boundary"].isin(["norm", "norm->none"])].assign(params=10, train_steps=10)
    rescale = base[base["boundary"] == "norm"].assign(boundary="norm->rescale", value=lambda d: d["value"] - 0.1)
    acc = pd.concat([base, ranged, ladder, rescale], ignore_index=True)
    rows = acc.assign(experiment="e5", run_key="k", arch="looped", metric="accuracy", difficulty=1, split="heldout")
    summary = e5.summarize(rows)
    assert set(summary["part"]) == {"effects", "range", "ladder", "rescale", "accuracy"}
    assert set(summary["level"]) == {MEAN, HARDEST}
    rec = summary[(summary["part"] == "rescale") & (summary["train_loops"] == "fixed:3")].iloc[0]
    per_seed = [(0.8 - 0.3) / (0.9 - 0.3), (0.9 - 0.5) / (1.0 - 0.5), (0.7 - 0.6) / (0.8 - 0.6)]
    assert rec["mean"] == pytest.approx(np.mean(per_seed)) and rec["n"] == 3
    damage = summary[(summary["part"] == "ladder") & (summary["params"] == 10)]
    assert damage["mean"].iloc[0] == pytest.approx(np.mean([0.6, 0.5, 0.2]))
    found = e5.judge(summary)
    assert {c.claim for c in found} == {"train x run", "range uniform:1-4", "ladder", "rescale"}
    assert all(c.beyond_paper and c.experiment == "e5" for c in found)
    assert "10 params" in next(c for c in found if c.claim == "ladder").measured


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def e5_results(tmp_path_factory):
    """`loopscope run e5 --preset smoke --seeds 2 --tasks parity` with the smoke preset cut to 30 steps and 64
    evaluation items (the code path is the real one; the numbers are a plumbing check, not a result)."""
    from engine.cli import main

    original = presets.PRESETS["smoke"]

    def short(task="parity", boundary="norm", arch="looped"):
        cfg = original(task, boundary, arch)
        return replace(cfg, train=replace(cfg.train, steps=30), task=replace(cfg.task, eval_examples=64))

    presets.PRESETS["smoke"] = short
    root = tmp_path_factory.mktemp("e5")
    argv = ["run", "e5", "--preset", "smoke", "--seeds", "2", "--tasks", "parity", "--results", str(root)]
    try:
        assert main(argv) == 0
        yield Store(root), argv, main
    finally:
        presets.PRESETS["smoke"] = original


def test_run_e5_writes_every_part_and_stores_the_scalars(e5_results):
    store, _, _ = e5_results
    rows = store.read_table("e5-smoke")
    assert list(rows.columns) == [*RESULT_COLUMNS, "split", *e5.EXTRA] and set(rows["experiment"]) == {"e5"}
    T = 3
    labels = rows.groupby("train_loops")["boundary"].unique().map(set).to_dict()
    assert labels == {
        "fixed:3": {"norm", "none", "norm->none", "none->norm", "norm->rescale"},
        "uniform:1-6": {"norm", "none", "norm->none", "none->norm", "norm->rescale"},
        "lognormal:3:9": {"norm", "none", "norm->none", "none->norm", "norm->rescale"},
    }
    assert rows.groupby(["train_loops", "params"])["seed"].nunique().eq(2).all()
    assert sorted(rows["params"].unique()) == [c.model.n_params for c in e5.ladder("smoke", "parity")]
    assert rows["eval_loops"].max() == 3 * T
    one = rows[(rows["eval_loops"] == 1) & (rows["metric"] == "accuracy")]
    norm = one[one["boundary"] == "norm"].set_index(["run_key", "difficulty"])["value"]
    for label in ("norm->none", "norm->rescale"):  # the n = 1 identity, in the stored rows
        other = one[one["boundary"] == label].set_index(["run_key", "difficulty"])["value"]
        assert other.equals(norm.loc[other.index]), label
    # the stored scalars are what the rescale rows were computed with
    key = rows.loc[(rows["boundary"] == "norm->rescale") & (rows["train_loops"] == "fixed:3"), "run_key"].iloc[0]
    scales = e5.load_scales(store, key, 3 * T)
    assert scales.shape == (3 * T,) and store.manifest(key)["state_scales"]["loops"] == 3 * T
    from engine.experiments.runs import load_models

    model, cfg, _ = load_models(store, [key])
    again = evaluate(model, cfg.task, 3 * T, "rescale", scales=scales[:, None], progress=False)
    stored = rows[(rows["run_key"] == key) & (rows["boundary"] == "norm->rescale")]
    merged = stored.merge(again, on=["difficulty", "eval_loops", "metric"], suffixes=("", "_again"))
    assert len(merged) == len(stored) and (merged["value"] == merged["value_again"]).all()
    other = evaluate(model, cfg.task, 3 * T, "rescale", scales=1.5 * scales[:, None], progress=False)
    assert not other[other["metric"] == "norm_post"]["value"].equals(again[again["metric"] == "norm_post"]["value"])


def test_run_e5_reruns_from_the_cache_and_leaves_e2_tables_alone(e5_results, monkeypatch, capsys):
    store, argv, main = e5_results
    from engine.experiments import runs

    def fail(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(runs, "train_group", fail)
    monkeypatch.setattr(runs, "evaluate", fail)
    monkeypatch.setattr("engine.core.evaluate.evaluate", fail)
    before = store.read_table("e5-smoke")
    assert main(argv) == 0
    pd.testing.assert_frame_equal(store.read_table("e5-smoke"), before)
    out = capsys.readouterr().out
    assert "[E5] (train x run) parity [paired, held-out mean]:" in out and "n = 1 identity" in out
    rows = runs.collect(store, before["run_key"].unique().tolist(), "e2", runs.PAPER_LABELS)
    assert set(rows["boundary"]) == {"norm", "none", "norm->none"}  # what E2's table would take of the same runs


def test_the_fan_out_trains_what_run_e5_trains(monkeypatch, tmp_path):
    """trainings() and seeds_for() are what run() goes through: the ladder's own rungs take the first 4 seeds."""
    from engine.experiments import runs

    trained = []
    monkeypatch.setattr(runs, "ensure_runs", lambda cfg, seeds, *a, **k: trained.append((cfg, list(seeds))) or [])
    monkeypatch.setattr(runs, "ensure_surgery", lambda *a, **k: None)
    monkeypatch.setattr(e5, "ensure_rescale", lambda *a, **k: None)
    monkeypatch.setattr(runs, "collect", lambda *a, **k: pd.DataFrame({"x": [1]}))

    class NoTables:
        root = tmp_path  # an empty folder: no study here yet, so no precision to keep

        def write_table(self, name, rows):
            pass

    seeds = list(range(16))
    e5.run("cpu", seeds, NoTables(), tasks=("parity", "chain"), progress=False)
    units = [(cfg, e5.seeds_for("cpu", cfg, seeds)) for cfg, _ in e5.trainings("cpu", ("parity", "chain"))]
    assert trained == units and len(units) == 2 * (2 + 4) + 5  # the ladder's 5 own rungs: parity only at cpu
    own = [cfg for cfg, s in units if s == [0, 1, 2, 3]]
    assert {cfg.task.name for cfg in own} == {"parity"} and e5.ladder("cpu", "chain") == []
    assert len(own) == 5 and all(cfg.train.group_size == 4 and cfg.model.boundary == "norm" for cfg in own)
    assert {c.model.n_params for c in own} | {preset("cpu").model.n_params} == {15_904, 55_360, 105_792, 229_344,
                                                                               412_288}  # fmt: skip
    assert sorted({c.train_loops for c, _ in units}) == ["fixed:4", "lognormal:4:12", "uniform:1-8"]


def test_the_dashboard_shows_e5_cards_and_its_page_draws_finite_figures(e5_results, monkeypatch):
    """The overview's "beyond the paper" section and the Agreement page, on a real (tiny) E5 table; the page is
    in the navigation only where an E5 table exists; the static report carries the same cards."""
    from dashboard import report
    from tests.test_dashboard import charts_on, finite, measured_values, render

    store, _, _ = e5_results
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(store.root / "cache"))
    at = render(monkeypatch, store.root)
    text = " ".join(m.value for m in at.markdown)
    for claim in ("train x run", "range uniform:1-6", "ladder", "rescale"):
        assert f"E5 · {claim} · parity" in text
    assert "not run yet: `loopscope run e5" not in text
    at = render(monkeypatch, store.root, "agreement")
    figures = charts_on(at)
    assert len(figures) >= 3
    for i, spec in enumerate(figures):
        assert any(finite(v) for v in measured_values(spec)), f"agreement: figure {i} draws no finite value"
    assert any("agreement effect G" in str(spec["datasets"]) for spec in figures)
    page = report.html(store.root, "smoke")
    assert "E5 · agreement tested directly (beyond the paper): train x run · parity" in page


def test_without_an_e5_table_the_overview_says_how_to_make_it(monkeypatch, tmp_path):
    from tests.test_dashboard import render

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    at = render(monkeypatch, tmp_path)
    assert "not run yet: `loopscope run e5 --preset cpu" in " ".join(m.value for m in at.markdown)
    assert not [p for p in at.get("page_link") if "agreement" in str(p.proto.page)]


def test_the_margin_is_the_right_answers_log_probability_minus_the_wrong_ones():
    """docs/design.md §10: per item log p(right) - log p(wrong) under the full softmax, its mean a row; below zero
    for a confident wrong answer (checked against a direct log_softmax on the same model and items)."""
    import torch

    from engine.core import tasks
    from engine.core.evaluate import step_metrics
    from engine.core.model import build
    from engine.core.presets import smoke

    cfg = smoke("parity")
    model = build(cfg.model, [0]).eval()
    batch = tasks.eval_set(cfg.task, cfg.task.eval_difficulties[0])
    got = step_metrics(model, batch, 4, "none")["margin"]  # (n, 1)
    with torch.no_grad():
        logp = model(batch.tokens[None], 4, "none").logits[:, 0, :, -1].float().log_softmax(-1)  # (n, B, V)
    y = batch.answers.long()
    right = logp.gather(-1, y[None, :, None].expand(4, -1, 1))[..., 0]
    wrong = logp.gather(-1, (1 - y)[None, :, None].expand(4, -1, 1))[..., 0]
    assert torch.allclose(got[:, 0], (right - wrong).mean(-1), atol=1e-5)
    flipped = tasks.Batch(batch.tokens, batch.targets, 1 - batch.answers)  # every label wrong: the sign flips
    assert torch.allclose(step_metrics(model, flipped, 4, "none")["margin"], -got, atol=1e-6)


# ---------------------------------------------------------------- the decisive contrast (docs/design.md §10)


def contrast_rows(acc: dict, margin: dict, seeds=range(8)) -> pd.DataFrame:
    """Rows of the design's shape at n = T = 3: per label, accuracy and margin, each seed jittered a little."""
    rows = [
        dict(task="parity", train_loops="fixed:3", params=100, train_steps=10, trained_loops=3, eval_loops=3,
             seed=seed, boundary=label, metric=metric, value=values[label] + 0.001 * seed, experiment="e5",
             run_key=f"k{seed}", arch="looped", difficulty=1, split="heldout")
        for seed in seeds
        for metric, values in (("accuracy", acc), ("margin", margin))
        for label in values
    ]  # fmt: skip
    return pd.DataFrame(rows)


def contrast(acc: dict, margin: dict, seeds=range(16)) -> dict[str, str]:
    found = e5.judge(e5.summarize(contrast_rows(acc, margin, seeds)))
    return {c.claim: c.outcome for c in found if c.level == MEAN and c.claim.startswith(("contrast", "agreement or"))}


def test_the_contrast_rules_read_both_surgeries_on_accuracy_and_on_the_margin():
    A = dict(norm=0.99, none=0.99)
    m = dict(norm=6.0, none=6.0)
    # agreement: the reverse surgery hurts about as much as the forward one, on both measures
    both = contrast(A | {"norm->none": 0.52, "none->norm": 0.60}, m | {"norm->none": -1.0, "none->norm": 1.0})
    assert both == {"contrast (accuracy)": "agreement", "contrast (margin)": "agreement",
                    "agreement or growth": "agreement"}  # fmt: skip
    # growth: the bounded state keeps the none models whole, the forward surgery costs a lot
    grows = contrast(A | {"norm->none": 0.52, "none->norm": 0.98}, m | {"norm->none": 0.5, "none->norm": 5.9})
    assert set(grows.values()) == {"growth"}
    # they disagree: accuracy reads agreement (its forward damage sits at the floor), the margin growth (d_rev
    # 0.05 of a margin that the forward surgery turns to -6, d_fwd 2.0): the margin decides
    split = contrast(A | {"norm->none": 0.50, "none->norm": 0.70}, m | {"norm->none": -6.0, "none->norm": 5.7})
    assert split["contrast (accuracy)"] == "agreement" and split["contrast (margin)"] == "growth"
    assert split["agreement or growth"] == "growth"
    # fewer pairs than the design's 16: shown, not read
    assert set(contrast(A | {"norm->none": 0.52, "none->norm": 0.60}, m | {"norm->none": -1, "none->norm": 1},
                        seeds=range(3)).values()) == {"undecided"}  # fmt: skip
    # neither: a reverse damage above the floor but under half the forward one
    assert contrast(A | {"norm->none": 0.51, "none->norm": 0.88}, m | {"norm->none": -2, "none->norm": 4.5})[
        "contrast (accuracy)"] == "mixed"  # fmt: skip


def test_the_margin_contrast_is_relative_to_each_models_own_margin_and_skips_unlearned_seeds():
    acc = dict(norm=0.9, none=0.9, **{"norm->none": 0.5, "none->norm": 0.5})
    rows = contrast_rows(acc, dict(norm=4.0, none=2.0, **{"norm->none": 0.0, "none->norm": 1.0}), seeds=range(4))
    rows.loc[(rows["seed"] == 3) & (rows["metric"] == "margin") & (rows["boundary"] == "none"), "value"] = -0.5
    c = e5.contrast_table(rows)
    c = c[c["level"] == MEAN].set_index("quantity")
    fwd = [(4.0 + 0.001 * s - 0.001 * s) / (4.0 + 0.001 * s) for s in range(4)]
    assert c.loc["margin fwd", "mean"] == pytest.approx(np.mean(fwd)) and c.loc["margin fwd", "n"] == 4
    assert c.loc["margin rev", "n"] == 3  # seed 3's own margin is below zero: left out
    assert c.loc["accuracy fwd", "mean"] == pytest.approx(0.4)
    assert e5.contrast_table(rows[rows["metric"] != "margin"]).empty  # no margin rows: not this design's table
