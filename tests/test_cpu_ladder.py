"""The CPU ladder's pieces (engine.runtime.cpu_ladder): the recipe rule seed by seed, a probe that stops as soon as
its outcome is certain, a resumed probe that computes nothing, and `rungs` refused before the probe adopted."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.core.model import ModelConfig
from engine.core.presets import CPU_LADDER_RECIPE, cpu_ladder, preset, study_root
from engine.core.store import Store
from engine.core.tasks import VOCAB_SIZE
from engine.experiments import e5
from engine.experiments.ladder import recipe_outcome
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
    assert rungs == [1_627_392, 5_342_592, 19_024_384]
    assert {c.train.group_size for c in e5.ladder("cpu-ladder", "parity")} == {1}
    assert e5.ladder_only("cpu-ladder") and e5.rescaled("cpu-ladder", cfg)
    with pytest.raises(ValueError, match="parity only"):
        cpu_ladder("chain")


REAL_CANDIDATE = cl.candidate


def tiny(name: str):
    """The probe's candidate at a size the CPU trains in seconds (the recipe's lr and length kept apart)."""
    cfg = REAL_CANDIDATE(name)
    model = ModelConfig(VOCAB_SIZE, d_model=16, n_heads=2, d_ff=48, layers_per_block=1, trained_loops=4)
    task = replace(cfg.task, eval_examples=32)
    return replace(cfg, model=model, task=task, train=replace(cfg.train, steps=cfg.train.steps // 100, warmup_steps=5))


def test_the_probe_stops_a_candidate_once_decided_and_resumes_from_its_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cl, "candidate", tiny)
    store = Store(study_root(tmp_path, "cpu-ladder"))
    record = cl.probe(store, ["R1", "R2"])  # 20-step models stay near chance: each is rejected after one seed
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


def test_rungs_are_refused_before_the_probe_adopted_the_presets_recipe(tmp_path, capsys):
    assert cl.main(["rungs", "--results", str(tmp_path)]) == 2
    assert "run the probe first" in capsys.readouterr().err
    assert cl.main(["probe", "--results", str(tmp_path), "--candidates", "R2,R1"]) == 2
    assert "in that order" in capsys.readouterr().err
