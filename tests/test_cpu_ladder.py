"""The CPU ladder's pieces (engine.runtime.cpu_ladder): the recipe rule seed by seed, a probe that stops as soon as
its outcome is certain, a resumed probe that computes nothing, and `rungs` refused before the probe adopted."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import pandas as pd
import pytest

from engine import studies
from engine.core.model import ModelConfig
from engine.core.presets import CPU_LADDER_RECIPE, cpu_ladder, preset, study_root
from engine.core.store import Store, is_weights
from engine.core.tasks import VOCAB_SIZE
from engine.experiments import e5
from engine.experiments.ladder import best_candidate, recipe_outcome
from engine.runtime import cpu_ladder as cl


def test_recipe_outcome_is_decided_as_soon_as_it_is_certain():
    assert recipe_outcome([0.5]) == "rejected"  # 0.5 + 3 * 1.0 = 3.5 < 3.8
    assert recipe_outcome([0.86]) == "open"  # 0.86 + 3 = 3.86 >= 3.8
    assert recipe_outcome([0.86, 0.90]) == "rejected"  # 1.76 + 2 = 3.76
    assert recipe_outcome([1.0, 1.0, 1.0]) == "open"  # 3.0 < 3.8: the fourth seed still decides
    assert recipe_outcome([1.0, 1.0, 1.0, 0.8]) == "adopted"
    assert recipe_outcome([0.95] * 4) == "adopted" and recipe_outcome([0.95, 0.95, 0.95, 0.9499]) == "rejected"


def test_the_preset_is_the_paper_model_one_seed_a_group_in_its_own_folder(tmp_path):
    cfg = preset("cpu-ladder")
    assert cfg.model.n_params == 19_024_384 and cfg.train.group_size == 1
    assert cl.candidate(CPU_LADDER_RECIPE) == cfg
    assert study_root(tmp_path, "cpu-ladder") == tmp_path / "cpu-ladder"
    rungs = [c.model.n_params for c in e5.ladder("cpu-ladder", "parity")]
    lower = [c.model.n_params for c in e5.ladder("cpu", "parity") if c.train.steps == 2000]  # the `cpu` study's R1
    assert rungs == [*(lower if CPU_LADDER_RECIPE != "R1" else []), 1_627_392, 5_342_592, 19_024_384]
    assert len(rungs) == 8 and CPU_LADDER_RECIPE == "R3"  # the probe adopted R3 (cached_results/cpu-ladder)
    assert {c.train.group_size for c in e5.ladder("cpu-ladder", "parity")} == {1}
    assert e5.ladder_only("cpu-ladder") and e5.rescaled("cpu-ladder", cfg)
    with pytest.raises(ValueError, match="parity only"):
        cpu_ladder("chain")


def test_the_lower_rungs_are_the_cpu_study_s_only_under_its_recipe(monkeypatch):
    """docs/gpu-study.md: the rungs to 412k again only if the adopted recipe is not R1 (the `cpu` study's); the
    dashboard's twin of that fact (results.PARTNER_RECIPE, no torch on its script thread) agrees with the configs."""
    from dashboard import results
    from engine.core import presets

    for name in presets.GPU_RECIPES:
        own = partial(cpu_ladder, recipe=name)
        monkeypatch.setattr(e5, "preset", lambda p, task="parity", boundary="norm", own=own: (
            own(task, boundary) if p == "cpu-ladder" else preset(p, task, boundary)))  # fmt: skip
        same = name == results.PARTNER_RECIPE["cpu-ladder"]
        assert e5.continues("cpu-ladder") == ("cpu" if same else None)
        rungs = e5.ladder("cpu-ladder", "parity")
        lower = [c.model.n_params for c in e5.ladder("cpu", "parity") if c.train.steps == 2000]
        assert [c.model.n_params for c in rungs] == [*([] if same else lower), 1_627_392, 5_342_592, 19_024_384]
        assert {replace(c.train, group_size=1) for c in rungs} == {replace(own().train, group_size=1)}
        assert rungs[-1] == own()  # the top rung is E2's config, as before
    assert results.RECIPE_PROBE_FILE == cl.PROBE_FILE  # where the dashboard reads the record the probe writes


REAL_CANDIDATE = cl.candidate


def tiny(name: str):
    """The probe's candidate at a size the CPU trains in seconds (the recipe's lr and length kept apart)."""
    cfg = REAL_CANDIDATE(name)
    model = ModelConfig(VOCAB_SIZE, d_model=16, n_heads=2, d_ff=48, layers_per_block=1, trained_loops=4)
    task = replace(cfg.task, eval_examples=32)
    return replace(cfg, model=model, task=task, train=replace(cfg.train, steps=cfg.train.steps // 100, warmup_steps=5))


@pytest.mark.slow
def test_the_probe_stops_a_candidate_once_decided_and_resumes_from_its_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cl, "candidate", tiny)
    handed = []  # the best of the rejected candidates is below_bar's (its own test below)
    monkeypatch.setattr(cl, "below_bar", lambda store, names, record: handed.append(names) or record)
    store = Store(study_root(tmp_path, "cpu-ladder"))
    record = cl.probe(store, ["R1", "R2"])  # 20-step models stay near chance: each is rejected after one seed
    assert handed == [["R1", "R2"]]
    for name in ("R1", "R2"):
        got = record["candidates"][name]
        assert got["outcome"] == "rejected" and len(got["scores"]) == 1, got
    assert record["adopted"] is None
    assert json.loads((store.root / cl.PROBE_FILE).read_text())["candidates"] == record["candidates"]
    key = tiny("R1").run_key(0)
    labels = set(store.load_rows(key)["boundary"])
    assert {"norm", "norm->none", "norm->rescale"} <= labels  # evaluated as every rung is
    manifests = {k: store.manifest(k) for k in store.run_keys()}
    capsys.readouterr()
    again = cl.probe(store, ["R1", "R2"])
    assert again["candidates"] == record["candidates"]
    assert {k: store.manifest(k) for k in store.run_keys()} == manifests  # nothing recomputed
    assert "cached" in capsys.readouterr().out


def test_best_of_the_candidates_once_it_is_certain():
    assert best_candidate({"R1": [0.9, 0.5]}) == "R1"  # one candidate: the best whatever its seeds
    assert best_candidate({"R1": [0.92, 0.5], "R2": [0.96, 0.5], "R3": [0.68]}) is None
    assert best_candidate({"R1": [0.9, 0.5, 0.5, 0.5], "R2": [0.96, 0.5, 0.9, 0.9], "R3": [0.68, 0.5]}) == "R2"
    assert best_candidate({"R1": [0.9, 0.5, 0.5, 0.5], "R2": [0.96, 0.5, 0.9, 0.9], "R3": [0.68, 0.6]}) is None
    assert best_candidate({"R1": [0.5] * 4, "R2": [0.5] * 4}) == "R1"  # a tie: the earlier candidate
    assert best_candidate({"R1": [0.5] * 4, "R2": [0.5] * 3}) is None  # R2's last seed could still pass R1
    assert best_candidate({"R1": [0.5] * 3, "R2": [0.5] * 4}) is None  # R1's last seed could still reach R2, and win
    # a possible exact tie decides nothing for the later candidate, and everything for the earlier one
    assert best_candidate({"R1": [0.5] * 3, "R2": [0.625] * 4}) is None  # R1's last seed at 1.0 ties, and wins it
    assert best_candidate({"R1": [0.625] * 4, "R2": [0.5] * 3}) == "R1"  # R2 at best ties, and loses it


def test_below_the_bar_trains_the_skipped_seeds_in_order_until_the_best_is_certain(tmp_path, monkeypatch):
    # the probe's record as the 19M rung left it on 2026-12-06: every candidate rejected by the early stop
    record = {"candidates": {"R1": {"scores": [0.9215, 0.5], "outcome": "rejected"},
                             "R2": {"scores": [0.9553, 0.4984], "outcome": "rejected"},
                             "R3": {"scores": [0.684], "outcome": "rejected"}}, "adopted": None}  # fmt: skip
    future = {("R1", 2): 0.5, ("R1", 3): 0.5, ("R2", 2): 0.95, ("R2", 3): 0.95, ("R3", 1): 0.5, ("R3", 2): 1.0}
    by_key = {cl.candidate(n).run_key(s): (n, s) for n, s in future}
    trained = []
    monkeypatch.setattr(cl, "piece", lambda cfg, seed, store: trained.append(by_key[cfg.run_key(seed)]))
    monkeypatch.setattr(cl, "recipe_score", lambda rows: future[rows])
    store = Store(study_root(tmp_path, "cpu-ladder"))
    monkeypatch.setattr(store, "load_rows", lambda key: by_key[key])
    store.root.mkdir(parents=True)
    out = cl.below_bar(store, ["R1", "R2", "R3"], record)
    # R3 after seed 1 can reach (0.684 + 0.5 + 2) / 4 = 0.796 at most, R2 has 0.838: decided without R3's seeds 2-3
    assert trained == [("R1", 2), ("R1", 3), ("R2", 2), ("R2", 3), ("R3", 1)]
    assert out["adopted"] == "R2" and out["below_bar"] is True
    assert out["candidates"]["R3"]["scores"] == [0.684, 0.5] and out["candidates"]["R3"]["outcome"] == "rejected"
    assert out["candidates"]["R3"]["mean_range"] == [0.296, 0.796]  # as the dashboard shows it: what the rule read
    assert json.loads((store.root / cl.PROBE_FILE).read_text()) == out


@pytest.mark.slow
def test_rungs_under_another_recipe_train_the_lower_rungs_and_the_rules_read_them_alone(tmp_path, monkeypatch):
    """The path an R2 or R3 adoption takes, at a size the CPU trains in seconds: `cpu_ladder rungs` trains the `cpu`
    ladder's rungs to 412k again under the adopted recipe, with its own, and the rules read that ladder alone."""
    from dashboard import results
    from engine.core import presets
    from engine.experiments import ladder

    def small(name, task="parity", boundary="norm", arch="looped"):
        cfg = cpu_ladder(task, boundary, recipe="R2") if name == "cpu-ladder" else preset(name, task, boundary)
        model = replace(cfg.model, d_model=32, n_heads=2, d_ff=96) if name == "cpu-ladder" else cfg.model
        train = replace(cfg.train, steps=cfg.train.steps // 100, warmup_steps=5)
        return replace(cfg, model=model, task=replace(cfg.task, eval_examples=32), train=train)

    monkeypatch.setattr(e5, "preset", small)
    entry = replace(studies.STUDIES["cpu-ladder"], ladder=((24, 2, 64, 2, 1), (32, 2, 96, 2, 1)))  # the last: E2's
    monkeypatch.setitem(studies.STUDIES, "cpu-ladder", entry)
    monkeypatch.setattr(presets, "CPU_LADDER_RECIPE", "R2")
    store = Store(study_root(tmp_path, "cpu-ladder"))
    store.root.mkdir(parents=True)
    (store.root / cl.PROBE_FILE).write_text(json.dumps({"candidates": {}, "adopted": "R2", "below_bar": True}))
    cl.rungs(store)
    rows = pd.read_parquet(store.root / "e5-cpu-ladder.parquet")
    lower = [c.model.n_params for c in e5.ladder("cpu", "parity") if c.train.steps == 20]
    assert len(lower) == 5 and set(lower) < set(rows["params"]) and rows["params"].nunique() == 7
    assert {store.manifest(k)["config"]["train"]["lr"] for k in store.run_keys()} == {5e-4}  # R2's, every rung
    trend = [c for c in ladder.rules(rows, None) if c.claim.startswith("ladder trend")]
    assert trend and all("over 7 rungs" in c.measured for c in trend), [c.measured for c in trend]
    assert results.ladder_partner("cpu-ladder", tmp_path) is None  # the `cpu` study's R1 rungs stay out


def test_a_share_of_the_rungs_trains_and_evaluates_its_own_seeds_whole_on_its_share_of_the_threads(
    tmp_path, monkeypatch, capsys
):
    import torch

    monkeypatch.setattr(e5, "trainings", lambda preset_name, tasks: [(tiny("R1"), "e2")])
    monkeypatch.setattr(cl, "check_study_precision", lambda *a: None)
    store = Store(study_root(tmp_path, "cpu-ladder"))
    store.root.mkdir(parents=True)
    (store.root / cl.PROBE_FILE).write_text(json.dumps({"candidates": {}, "adopted": CPU_LADDER_RECIPE}))
    threads = torch.get_num_threads()
    try:
        cl.rungs(store, (1, 2))
        assert torch.get_num_threads() == max(1, (__import__("os").cpu_count() or 1) // 2)
    finally:
        torch.set_num_threads(threads)
    assert sorted(store.run_keys()) == sorted(tiny("R1").run_key(s) for s in (1, 3))
    assert all(e5.evaluated("cpu-ladder", tiny("R1"), store.load_rows(k)) for k in store.run_keys())
    assert not (store.root / "e5-cpu-ladder.parquet").exists()  # the table: `rungs` without --share, at the end
    assert "share 1/2 done" in capsys.readouterr().out
    for bad in ("2/2", "1", "a/b", "-1/2"):
        assert cl.main(["rungs", "--results", str(tmp_path), f"--share={bad}"]) == 2
        assert "--share must be I/N" in capsys.readouterr().err
    assert cl.main(["rungs", "--results", str(tmp_path), "--share", "0/4", "--threads", "0"]) == 2
    assert "--threads must be between 1" in capsys.readouterr().err
    try:  # one seed a rung (seed 0 alone) on the threads named
        cl.rungs(store, (0, 4), threads=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert len(store.run_keys()) == 3


def test_rungs_are_refused_before_the_probe_adopted_the_presets_recipe(tmp_path, capsys):
    assert cl.main(["rungs", "--results", str(tmp_path)]) == 2
    assert "run the probe first" in capsys.readouterr().err
    assert cl.main(["probe", "--results", str(tmp_path), "--candidates", "R2,R1"]) == 2
    assert "in that order" in capsys.readouterr().err


def test_run_e5_trains_no_rung_before_the_probe_adopted_the_presets_recipe(tmp_path, capsys, monkeypatch):
    """`loopscope run e5 --preset cpu-ladder` used to train the 1.6M rung under the preset's recipe with no recipe
    adopted (found on 2026-12-06): now one sentence and exit 2 before anything trains or is written."""
    import shutil

    from engine.cli import main

    shipped = Path(__file__).resolve().parents[1] / "cached_results" / "cpu-ladder"
    folder = tmp_path / "cpu-ladder"
    shutil.copytree(shipped, folder, ignore=shutil.ignore_patterns("runs", "locks"))  # locks: a local run's, ignored
    probe = json.loads((folder / cl.PROBE_FILE).read_text())
    probe["adopted"] = None
    (folder / cl.PROBE_FILE).write_text(json.dumps(probe))

    def trains(*args, **kwargs):
        raise AssertionError("a rung started training")

    monkeypatch.setattr(e5, "ensure", trains)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["run", "e5", "--preset", "cpu-ladder", "--seeds", "0-3", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "run the probe first" in err and "Traceback" not in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "locks" not in p.parts) == before


def test_list_shows_each_rung_and_a_part_trained_seed_at_its_step(tmp_path, capsys):
    from engine.cli import main
    from engine.core.train import train_group
    from engine.experiments.runs import checkpoint_path

    cfg = tiny("R1")
    store = Store(study_root(tmp_path, "cpu-ladder"))

    def kill(done, total, loss):
        if done == 15:
            raise KeyboardInterrupt  # the session ends after the checkpoint of step 10

    ckpt = checkpoint_path(store, cfg, [1])
    with pytest.raises(KeyboardInterrupt):
        train_group(cfg, [1], progress=False, checkpoint_path=ckpt, checkpoint_every=10, on_step=kill)
    assert main(["list", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert cfg.run_key(1) in out and "part-trained: step 10 of 20" in out and "cpu-ladder" in out
    assert main(["list", "--json", "--results", str(tmp_path)]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["params"] == cfg.model.n_params and record["steps"] == 10 and record["folder"] == "cpu-ladder"
    train_group(cfg, [1], progress=False, checkpoint_path=ckpt, checkpoint_every=10)  # trained; killed in evaluation
    assert main(["list", "--results", str(tmp_path)]) == 0
    assert "trained, not evaluated: step 20 of 20" in capsys.readouterr().out


def test_ship_copies_finished_runs_weightless_and_builds_the_table_without_computing(tmp_path, monkeypatch):
    monkeypatch.setattr(cl, "candidate", tiny)
    source = Store(study_root(tmp_path / "pieces", "cpu-ladder"))
    cl.probe(source, ["R1"])
    monkeypatch.setattr(e5, "ladder", lambda preset_name, task: [tiny("R1")])  # the shipped rung is the table's
    monkeypatch.setattr(e5, "preset", lambda name, task="parity", boundary="norm": tiny("R1"))
    store = Store(study_root(tmp_path / "repo", "cpu-ladder"))
    key = tiny("R1").run_key(0)
    store.run_dir(key).mkdir(parents=True)  # a damaged folder of the same run (a copy cut off): replaced whole
    (store.run_dir(key) / "part.tmp").write_bytes(b"cut off")
    assert store.status(key) != "ok"
    assert cl.ship(source, store) == [key]
    assert store.status(key) == "ok" and store.weights_state(key).startswith("not kept")
    names = {p.name for p in source.run_dir(key).iterdir() if not is_weights(p.name)}
    assert {p.name for p in store.run_dir(key).iterdir()} == names
    assert not list(store.root.glob(".ship-*"))  # nothing staged is left behind
    assert store.load_rows(key).equals(source.load_rows(key))
    table = pd.read_parquet(store.root / "e5-cpu-ladder.parquet")
    assert set(table["run_key"]) == {key} and {"norm", "norm->none", "norm->rescale"} <= set(table["boundary"])
    assert (store.root / cl.PROBE_FILE).read_bytes() == (source.root / cl.PROBE_FILE).read_bytes()
    assert cl.ship(source, store) == []  # a second ship copies nothing


def test_ship_leaves_a_trained_but_unevaluated_run_behind_and_replaces_one_shipped_so(tmp_path, monkeypatch):
    """A run is `ok` once trained, before its surgery rows: three 55k seeds were shipped in that gap (2026-12-06)."""
    import shutil

    from engine.experiments.runs import ensure_runs

    monkeypatch.setattr(cl, "candidate", tiny)
    monkeypatch.setattr(e5, "ladder", lambda preset_name, task: [tiny("R1")])
    monkeypatch.setattr(e5, "preset", lambda name, task="parity", boundary="norm": tiny("R1"))
    source = Store(study_root(tmp_path / "pieces", "cpu-ladder"))
    (key,) = ensure_runs(tiny("R1"), [1], source, "e2", progress=False)  # trained; the surgery not run yet
    assert source.status(key) == "ok" and not e5.evaluated("cpu-ladder", tiny("R1"), source.load_rows(key))
    store = Store(study_root(tmp_path / "repo", "cpu-ladder"))
    assert cl.ship(source, store) == [] and store.status(key) != "ok"
    shutil.copytree(source.run_dir(key), store.run_dir(key))  # as shipped before this mend
    cl.piece(tiny("R1"), 1, source)  # the surgery and the rescale finish in the pieces' folder
    assert cl.ship(source, store) == [key]
    assert e5.evaluated("cpu-ladder", tiny("R1"), store.load_rows(key))
    assert {"norm->none", "norm->rescale"} <= set(store.load_rows(key)["boundary"])


def test_ship_brings_the_record_up_to_the_seeds_trained_after_it(tmp_path, monkeypatch):
    """The skipped seeds' driver trains seeds outside the probe: the shipped record lists them, in seed order."""
    monkeypatch.setattr(cl, "candidate", tiny)
    source = Store(study_root(tmp_path / "pieces", "cpu-ladder"))
    cl.probe(source, ["R1"])  # rejected after seed 0
    cl.piece(tiny("R1"), 1, source)  # as skipped_seeds.py does
    cl.piece(tiny("R1"), 3, source)  # seed 2 missing: seed 3 is not read (scores stay in seed order)
    written = (source.root / cl.PROBE_FILE).read_bytes()
    monkeypatch.setattr(e5, "ladder", lambda preset_name, task: [tiny("R1")])
    monkeypatch.setattr(e5, "preset", lambda name, task="parity", boundary="norm": tiny("R1"))
    monkeypatch.setattr(cl, "piece", lambda *a: pytest.fail("ship computes nothing"))
    store = Store(study_root(tmp_path / "repo", "cpu-ladder"))
    assert len(cl.ship(source, store)) == 3
    got = json.loads((store.root / cl.PROBE_FILE).read_text())["candidates"]["R1"]
    seed1 = round(cl.recipe_score(store.load_rows(tiny("R1").run_key(1))), 4)
    assert got["scores"] == [json.loads(written)["candidates"]["R1"]["scores"][0], seed1]
    assert got["runs"] == [tiny("R1").run_key(s) for s in (0, 1)] and got["outcome"] == "rejected"
    assert got["mean_range"] == [round(sum(got["scores"]) / 4, 4), round((sum(got["scores"]) + 2) / 4, 4)]
    assert (source.root / cl.PROBE_FILE).read_bytes() == written  # the pieces' own record is left as it was
    record = json.loads(written)  # a candidate with no new seed keeps the range the probe wrote, from unrounded scores
    record["candidates"]["R1"]["mean_range"] = [0.123, 0.456]
    assert cl.caught_up(Store(tmp_path / "empty"), record)["candidates"]["R1"]["mean_range"] == [0.123, 0.456]


def test_list_says_where_a_resumed_run_s_wall_time_counts_from(capsys):
    """R3's 19M seed 0 (shipped) resumed from its step-3,500 checkpoint: its wall_s is the last 500 steps' alone."""
    from engine.cli import main

    shipped = str(Path(__file__).resolve().parents[1] / "cached_results")
    assert main(["list", "--json", "--results", shipped]) == 0
    listed = {r["run_key"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["abc00faaf66abcf3"]["resumed_from"] == 3500 and listed["abc00faaf66abcf3"]["steps"] == 4000
    resumed = [r for r in listed.values() if r["resumed_from"] is not None]
    assert {r["folder"] for r in resumed} <= {"cpu-ladder", "cpu-agree"}  # the campaigns resume; a study's runs do not
    assert all(0 < r["resumed_from"] < r["steps"] for r in resumed)
    assert main(["list", "--results", shipped]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "abc00faaf66abcf3" in ln]
    assert "step 3500" in line
