"""Runs without their weights are a state, not damage (issue 34): kept rows, one sentence wherever weights are
needed, nothing recomputed, and `loopscope restore` that keeps retrained weights only when the rows match."""

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from engine import cli
from engine.core.presets import smoke
from engine.core.store import MODEL, Store, WeightsNotKept, file_of, parquet_bytes, weights_not_kept
from engine.experiments import runs as experiments
from engine.experiments.runs import ensure_runs, lighten, restore

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

CFG = replace(smoke("parity"), train=replace(smoke("parity").train, steps=40))  # groups of 2 seeds
WHY = "kept for one seed per training group"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def light(tmp_path):
    """Two smoke groups (seeds 0-3), then lightened: seeds 0 and 2 keep their weights, 1 and 3 do not."""
    store = Store(tmp_path / "results")
    keys = ensure_runs(CFG, range(4), store, progress=False)
    weights = {k: store.read(k, MODEL) for k in keys}
    assert lighten(store, WHY) == (2, 2)
    return store, keys, weights


def test_lighten_keeps_the_lowest_seed_of_each_group_and_the_rows_of_all(light):
    store, keys, _ = light
    assert [store.weights_state(k) for k in keys] == ["kept", f"not kept ({WHY})", "kept", f"not kept ({WHY})"]
    for key in keys:
        assert store.status(key) == "ok" and len(store.load_rows(key)) > 0
        m = store.manifest(key)
        assert (file_of(m["files"], MODEL) is None) == (weights_not_kept(m) is not None)
    assert not list(store.run_dir(keys[1]).glob("model*"))


def test_a_weightless_run_says_how_to_get_its_weights_back_and_is_never_retrained(light, monkeypatch):
    store, keys, _ = light
    with pytest.raises(WeightsNotKept, match=f"loopscope restore {keys[1]}.*--checkpoints|--checkpoints.*restore"):
        store.load_weights(keys[1])
    monkeypatch.setattr(experiments, "train_group", lambda *a, **k: pytest.fail("retrained a weightless run"))
    ensure_runs(CFG, range(4), store, progress=False)


def test_commands_say_one_sentence_for_a_weightless_run(light, capsys):
    store, keys, _ = light
    assert cli.main(["eval", keys[1], "--loops", "1-4", "--results", str(store.root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no weights here" in err and f"loopscope restore {keys[1]}" in err
    assert cli.main(["list", "--results", str(store.root)]) == 0
    out = capsys.readouterr()
    assert "2 of 4 runs are stored without their weights" in out.err and "not kept" in out.out
    from engine.runtime import jobs

    with pytest.raises(ValueError, match="no weights here"):
        jobs.check(jobs.EvalSpec(run_key=keys[1], loops=4), store)


def test_restore_keeps_retrained_weights_only_when_the_rows_match_bit_for_bit(light, capsys):
    store, keys, weights = light
    damaged = store.load_rows(keys[3])  # seed 3's stored rows: one value off, as if another machine made them
    damaged.loc[0, "value"] += 1e-9
    files = store.manifest(keys[3])["files"]
    rows_name = next(n for n in files if n.startswith("rows-"))
    manifest = {k: v for k, v in store.manifest(keys[3]).items() if k != "files"}
    store.commit(keys[3], manifest, {"rows.parquet": parquet_bytes(damaged)},
                 {n: h for n, h in files.items() if n != rows_name})  # fmt: skip
    outcome = restore(store, [keys[0], keys[1], keys[3]], progress=False)
    assert outcome[keys[0]].startswith("has its weights")
    assert outcome[keys[1]].startswith("restored") and store.read(keys[1], MODEL) == weights[keys[1]]
    assert "differ" in outcome[keys[3]] and "nothing stored" in outcome[keys[3]]
    assert store.weights_state(keys[1]) == "kept" and store.weights_state(keys[3]).startswith("not kept")
    assert cli.main(["restore", "--experiment", "e2", "--preset", "smoke", "--results", str(store.root)]) == 0
    assert "lacks its weights" in capsys.readouterr().out  # e2's smoke configs are not these runs


def test_verify_judges_a_weightless_run_on_its_rows(light):
    from engine.runtime import verify

    store, keys, _ = light
    result = verify.verify(store, CFG, [0, 1], progress=False)
    assert result["identical"] == {0: True, 1: True} and result["rows_only"] == [1]
    assert "compared on their stored rows alone" in verify.report(result, CFG)


def test_push_keeps_a_weightless_runs_record(light, tmp_path):
    from engine.runtime import share

    store, keys, _ = light
    share.stage(store.root, checkpoints=False, into=tmp_path / "staged")
    m = json.loads((tmp_path / "staged" / "runs" / keys[1] / "manifest.json").read_text())
    assert m["weights_not_kept"] == WHY and any(n.startswith("model-") for n in m["files_not_included"])


def test_the_repository_is_light():
    """Issue 34: tracked files at most 24 MiB (a remote GPU run receives the working tree, at most 64 MiB)."""
    try:
        names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [REPO / n for n in names.decode().split("\0") if n]
    size = sum(p.stat().st_size for p in paths if p.is_file())
    assert size <= 24 * 2**20, f"tracked files are {size / 2**20:.1f} MiB"
    shipped = Store(REPO / "cached_results")
    kept = [k for k in shipped.run_keys() if shipped.weights_state(k) == "kept"]
    groups = {json.dumps([shipped.manifest(k)["config"], shipped.manifest(k)["group"]]) for k in shipped.run_keys()}
    assert len(kept) == len(groups)  # one seed per training group can be extended live from the browser
    assert all(pd.notna(shipped.manifest(k)["seed"]) for k in kept)


def test_the_runs_page_says_how_to_get_a_weightless_runs_weights_back(light, monkeypatch, tmp_path):
    from tests.test_dashboard import render

    store, keys, _ = light
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    at = render(monkeypatch, store.root, "runs", run=keys[1])
    infos = " ".join(i.value for i in at.info)
    assert "weights are not kept here" in infos and f"loopscope restore {keys[1]}" in infos
    assert not [e for e in at.expander if "Evaluate at more loop counts" in e.label]
    at = render(monkeypatch, store.root, "runs", run=keys[0])
    assert "weights are not kept here" not in " ".join(i.value for i in at.info)
