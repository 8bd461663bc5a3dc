"""The GPU study's pieces on the CPU at `gpu-smoke` size (README, "The GPU study: how to run it"): the rungs and presets
the README fixes, the study's own folder, the budget guard, the pack and `loopscope merge` with its refusals."""

import json
import tarfile
from dataclasses import replace

import pandas as pd
import pytest

from engine import cli
from engine.core import presets
from engine.core.presets import GPU_RECIPES, PAPER_MODEL, SECOND_STUDY_PARITY, preset
from engine.core.store import Store, weights_not_kept
from engine.experiments import e5
from engine.experiments.runs import ensure_runs
from engine.runtime import gpu_pack, gpu_study

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

SMOKE = "gpu-smoke"


def rewrite_rows(store: Store, key: str, rows: pd.DataFrame) -> None:
    """Give a stored run other rows (its weights and the rest of its manifest as they are)."""
    manifest = store.manifest(key)
    files = manifest.pop("files")
    store.commit(key, manifest, {"rows.parquet": rows.to_parquet(index=False)},
                 {n: h for n, h in files.items() if not n.startswith("rows")})  # fmt: skip


def test_the_rungs_are_the_readmes_and_the_19m_rung_is_the_paper_model():
    readme = [412_288, 1.6e6, 5.3e6, 19_024_384]  # "The GPU study: predictions and rules"
    rungs = e5.ladder("gpu", "parity")
    assert [c.model.n_params == pytest.approx(r, rel=0.05) for c, r in zip(rungs, readme, strict=True)] == [True] * 4
    own = preset("gpu", "parity", "norm")
    assert rungs[-1] == own and own.model == replace(PAPER_MODEL, boundary="norm") and own.task == SECOND_STUDY_PARITY
    assert own.train == GPU_RECIPES[presets.GPU_RECIPE] and own.train.group_size == 16
    assert [(cfg, e5.seeds_for("gpu", cfg, range(16))) for cfg, _ in e5.trainings("gpu")] == [
        (cfg, [0, 1, 2, 3]) for cfg in rungs
    ]  # parts 3-4 only: the ladder, seeds 0-3 on every rung, E2's 19M runs included
    assert all(e5.rescaled("gpu", cfg) for cfg in rungs) and e5.parts("cpu") == (1, 2, 3, 4)
    with pytest.raises(ValueError, match="parity only"):
        preset("gpu", "chain")


@pytest.mark.parametrize("recipe", ["R1", "R2"])
def test_the_bridge_is_e5s_cpu_rung_under_r1(monkeypatch, recipe):
    monkeypatch.setattr(presets, "GPU_RECIPE", recipe)
    bridge = e5.ladder("gpu", "parity")[0]
    (cpu_rung,) = [c for c in e5.ladder("cpu", "parity") if c.model.n_params == 412_288]
    assert (bridge == cpu_rung and bridge.run_key(0) == cpu_rung.run_key(0)) == (recipe == "R1")


def test_the_budget_refuses_a_late_group_or_one_predicted_to_overrun():
    late = gpu_study.Budget(start_by=-1, limit=100)
    assert "budget of -1 s is spent" in late.refusal(1.0)
    budget = gpu_study.Budget(start_by=100, limit=50)
    assert "after the command's limit of 50 s" in budget.refusal(60.0) and budget.refusal(10.0) is None


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """The ladder piece at gpu-smoke into a results folder whose CPU store already holds the bridge's runs, packed."""
    root, out = tmp_path_factory.mktemp("results"), tmp_path_factory.mktemp("out")
    bridge = e5.rungs(SMOKE)[0]
    cpu_keys = ensure_runs(bridge, [0, 1, 2, 3], Store(root), "e5", progress=False)
    before = {k: Store(root).manifest(k)["created"] for k in cpu_keys}
    assert gpu_study.main(["run", "ladder", "--preset", SMOKE, "--results", str(root), "--device", "cpu",
                           "--out", str(out)]) == 0  # fmt: skip
    made = gpu_pack.pack("ladder", SMOKE, root, out)
    return dict(root=root, out=out, made=made, cpu_keys=cpu_keys, before=before)


def test_the_gpu_study_trains_the_bridge_in_its_own_folder(ladder):
    root, keys = ladder["root"], ladder["cpu_keys"]
    study = Store(root / SMOKE)
    assert all(study.status(k) == "ok" for k in keys)  # trained again, not taken from the CPU's store
    assert {k: Store(root).manifest(k)["created"] for k in keys} == ladder["before"]  # the CPU's runs untouched
    assert (root / SMOKE / f"e5-{SMOKE}.parquet").is_file() and not (root / f"e5-{SMOKE}.parquet").exists()
    summary = json.loads((ladder["out"] / "gpu-study-ladder.json").read_text())
    assert [u["status"] for u in summary["units"]] == ["done"] * 3 and all("memory_gib" in u for u in summary["units"])


def test_the_pack_keeps_one_seeds_weights_per_group_and_merges_into_a_results_folder(ladder, tmp_path, capsys):
    made, dest = ladder["made"], tmp_path / "merged"
    assert len(made["runs"]) == 12 and made["weightless"] == 9 and made["left_out"] == {}
    assert cli.main(["merge", str(ladder["out"] / made["file"]), "--results", str(dest)]) == 0
    assert "12 runs or refits added" in capsys.readouterr().out
    store = Store(dest / SMOKE)
    kept = {store.manifest(k)["seed"] for k in store.run_keys() if weights_not_kept(store.manifest(k)) is None}
    assert kept == {0} and len(store.run_keys()) == 12
    assert cli.main(["list", "--results", str(dest)]) == 0
    listed = capsys.readouterr()
    assert "9 of 12 runs are stored without their weights" in listed.err and listed.out.count("not kept") == 9
    rows = pd.read_parquet(dest / SMOKE / f"e5-{SMOKE}.parquet")
    table = pd.read_parquet(ladder["root"] / SMOKE / f"e5-{SMOKE}.parquet")
    pd.testing.assert_frame_equal(rows, table)  # rebuilt from the merged store: what the GPU machine wrote
    found = e5.claims(rows, SMOKE)
    assert {c.claim for c in found} == {"ladder", *(f"rescale {c.model.n_params:,} params" for c in e5.rungs(SMOKE))}
    assert cli.main(["merge", str(ladder["out"] / made["file"]), "--results", str(dest)]) == 0  # again: nothing new
    assert "0 runs or refits added, 0 extended" in capsys.readouterr().out
    key = made["runs"][0]
    full = store.load_rows(key)
    rewrite_rows(store, key, full[full["boundary"] != "norm->rescale"])  # as before its rescale surgery
    assert cli.main(["merge", str(ladder["out"] / made["file"]), "--results", str(dest)]) == 0
    assert "0 runs or refits added, 1 extended" in capsys.readouterr().out and store.load_rows(key).equals(full)


def test_merge_refuses_what_is_not_a_pack_or_conflicts_in_one_sentence(ladder, tmp_path, capsys):
    pack = ladder["out"] / ladder["made"]["file"]
    not_gz = tmp_path / "x.tar.gz"
    not_gz.write_bytes(b"not a tarball")
    stray = tmp_path / "stray.tar.gz"
    with tarfile.open(stray, "w:gz") as tar:
        tar.add(pack, arcname="gpu-study.json")  # a file of that name that is no JSON of the study
    outside = tmp_path / "outside.tar.gz"
    with tarfile.open(pack) as src, tarfile.open(outside, "w:gz") as tar:
        for m in src.getmembers():
            tar.addfile(m, src.extractfile(m) if m.isfile() else None)
        tar.add(pack, arcname="cpu/runs/0000000000000000/manifest.json")
    dest = tmp_path / "dest"
    for bad, words in ((not_gz, "not a readable .tar.gz"), (stray, "names no study preset"),
                       (outside, "it holds 'cpu/runs")):  # fmt: skip
        assert cli.main(["merge", str(bad), "--results", str(dest)]) == 2
        err = capsys.readouterr().err
        assert words in err and "nothing was merged" in err and err.count("\n") == 1 and not dest.exists()
    assert cli.main(["merge", str(pack), "--results", str(dest)]) == 0
    key = ladder["made"]["runs"][-1]
    store = Store(dest / SMOKE)
    other = store.load_rows(key).assign(value=lambda d: d["value"] + 1)
    rewrite_rows(store, key, other)
    capsys.readouterr()
    assert cli.main(["merge", str(pack), "--results", str(dest)]) == 2
    err = capsys.readouterr().err
    assert f"conflicts with {dest / SMOKE}: run {key} (other rows) is stored there with other bytes" in err
    assert store.load_rows(key).equals(other)  # nothing written


def test_a_run_whose_weights_stay_behind_comes_back_with_its_rows_and_says_what_it_still_needs(tmp_path):
    """E2's norm-trained group stored without the surgery (a command cut short, issue 45): every seed's rows come back
    (the weights of one), and the pack names what each weightless seed still needs; nothing is left out."""
    cfg = preset(SMOKE, "parity", "norm")
    keys = ensure_runs(cfg, cfg.group(0), Store(tmp_path / SMOKE), "e2", progress=False)
    made = gpu_pack.pack("norm", SMOKE, tmp_path, tmp_path / "out")
    assert sorted(made["runs"]) == sorted(keys) and made["left_out"] == {} and made["weightless"] == len(keys) - 1
    assert set(made["still_needs"]) == set(keys[1:])
    assert "still needs the surgery (norm->none), the rescale surgery, E3's refits" in made["still_needs"][keys[1]]


def test_a_spent_budget_starts_nothing_and_still_packs(tmp_path, capsys):
    out = tmp_path / "out"
    code = gpu_study.main(["run", "ladder", "--preset", SMOKE, "--results", str(tmp_path), "--device", "cpu",
                           "--budget", "-1", "--out", str(out)])  # fmt: skip
    summary = json.loads((out / "gpu-study-ladder.json").read_text())
    assert code == 0 and all(u["status"].startswith("not started: the budget") for u in summary["units"])
    assert Store(tmp_path / SMOKE).run_keys() == [] and gpu_pack.pack("ladder", SMOKE, tmp_path, out)["runs"] == []


def test_the_gpu_presets_refuse_the_chain_and_store_in_their_own_folder(tmp_path, capsys):
    assert cli.main(["run", "e2", "--preset", SMOKE, "--tasks", "chain", "--results", str(tmp_path)]) == 2
    assert "defines parity only; pick --tasks parity" in capsys.readouterr().err
    assert cli.main(["train", "--preset", SMOKE, "--seeds", "1", "--results", str(tmp_path), "--device", "cpu"]) == 0
    assert len(Store(tmp_path / SMOKE).run_keys()) == 4 and Store(tmp_path).run_keys() == []  # a whole group of 4


def test_a_tree_without_git_records_the_commit_it_was_sent_from(monkeypatch, tmp_path):
    """The GPU machine gets a copy of the tree without .git: manifests take the commit from $LOOPSCOPE_COMMIT."""
    from engine.core import store

    checkout = store.REPO
    monkeypatch.setattr(store, "REPO", tmp_path)  # a copy of the tree: no .git
    monkeypatch.setenv("LOOPSCOPE_COMMIT", "0123abcd" * 5)
    assert store.git_state() == ("0123abcd" * 5, False)
    monkeypatch.setenv("LOOPSCOPE_DIRTY", "1")
    assert store.git_state() == ("0123abcd" * 5, True)
    monkeypatch.delenv("LOOPSCOPE_COMMIT")
    assert store.git_state()[0] == ""  # nothing to say: no commit recorded
    monkeypatch.setattr(store, "REPO", checkout)
    monkeypatch.setenv("LOOPSCOPE_COMMIT", "ignored")  # a checkout: git itself says
    assert store.git_state()[0] not in ("ignored", "")
