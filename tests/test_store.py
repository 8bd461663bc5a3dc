"""The store: atomic writes, checksums, corrupt files detected and redone, cache hits never recomputed."""

import json
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
import torch

from engine.core.presets import smoke
from engine.core.store import RESULT_COLUMNS, BadKey, CorruptRun, Store
from engine.experiments import runs as experiments
from engine.experiments.runs import ensure_runs, extend_eval

CFG = replace(smoke("parity"), train=replace(smoke("parity").train, steps=40))


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "results")


def test_runs_are_written_with_manifest_and_exact_columns(store):
    keys = ensure_runs(CFG, [0, 1], store, progress=False)
    assert len(set(keys)) == 2 and keys[0] == CFG.run_key(0)
    for key in keys:
        assert store.status(key) == "ok"
        rows = store.load_rows(key)
        assert list(rows.columns) == [*RESULT_COLUMNS, "split"]
        assert set(rows.metric) == {
            "accuracy",
            "choice_accuracy",
            "top_token_share",
            "option_rate",
            "top_token",
            "norm_pre",
            "norm_post",
            "margin",
        }
        assert sorted(rows.eval_loops.unique()) == list(range(1, CFG.max_eval_loops + 1))
        m = store.manifest(key)
        for field in ("config", "git_commit", "versions", "device", "wall_time_s", "steps", "final_loss", "files"):
            assert field in m
        assert not list(store.run_dir(key).glob("*.tmp"))


def test_cached_runs_are_never_recomputed(store, monkeypatch):
    ensure_runs(CFG, [0], store, progress=False)

    def fail(*a, **k):
        raise AssertionError("retrained a cached run")

    monkeypatch.setattr(experiments, "train_group", fail)
    ensure_runs(CFG, [0], store, progress=False)


DAMAGES = ["truncate", "flip", "delete_model", "delete_manifest", "garble_manifest", "list", "files_null", "no_files"]


def damage(folder, how: str) -> None:
    (model,) = folder.glob("model-*.safetensors")
    manifest = folder / "manifest.json"
    if how == "truncate":
        model.write_bytes(model.read_bytes()[:100])
    elif how == "flip":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0x01
        model.write_bytes(bytes(data))
    elif how == "delete_model":
        model.unlink()
    elif how == "delete_manifest":
        manifest.unlink()
    elif how == "garble_manifest":
        manifest.write_text("{not json")
    else:  # valid JSON of the wrong shape
        m = json.loads(manifest.read_text())
        wrong = {
            "list": [],
            "files_null": {**m, "files": None},
            "no_files": {k: v for k, v in m.items() if k != "files"},
        }
        manifest.write_text(json.dumps(wrong[how]))


@pytest.mark.parametrize("how", DAMAGES)
def test_damage_is_detected_named_and_repaired_to_the_identical_run(store, how, capsys):
    keys = ensure_runs(CFG, [0, 1], store, progress=False)
    before = {k: (store.load_weights(k), store.load_rows(k)) for k in keys}
    damage(store.run_dir(keys[1]), how)
    status = store.status(keys[1])
    assert status not in ("ok", "missing") and keys[1] in status
    if how in ("truncate", "flip"):
        with pytest.raises(CorruptRun, match="checksum"):
            store.load_weights(keys[1])  # never loaded
    ensure_runs(CFG, [1], store, progress=False)  # seed 1 alone: it is retrained in its group (0, 1)
    assert "redoing it" in capsys.readouterr().err
    for k in keys:
        weights, rows = before[k]
        assert store.status(k) == "ok"
        assert all(torch.equal(weights[n], t) for n, t in store.load_weights(k).items())
        pd.testing.assert_frame_equal(store.load_rows(k), rows)


def test_a_run_changes_in_one_step_and_leaves_nothing_behind(store, monkeypatch):
    import engine.core.store as store_module

    (key,) = ensure_runs(CFG, [0], store, progress=False)
    before = sorted(p.name for p in store.run_dir(key).iterdir())
    real = store_module.atomic_write

    def crash_on_manifest(path, data):
        if path.name == "manifest.json":
            raise OSError("killed")
        real(path, data)

    monkeypatch.setattr(store_module, "atomic_write", crash_on_manifest)
    with pytest.raises(OSError):
        extend_eval(store, [key], [1, 2], boundary="none", progress=False)
    assert store.status(key) == "ok" and "norm->none" not in set(store.load_rows(key).boundary)  # the old run
    monkeypatch.undo()
    extend_eval(store, [key], [1, 2], boundary="none", progress=False)
    after = sorted(p.name for p in store.run_dir(key).iterdir())
    assert len(after) == len(before) == 3 and after != before  # the new rows file replaced the old one


def test_run_keys_are_checked_before_they_become_paths(store):
    for bad in ("../../etc/passwd", "ABCDEF0123456789", "0123", "0123456789abcdef/.."):
        with pytest.raises(BadKey):
            store.run_dir(bad)


def test_writability_is_probed_by_writing(tmp_path):
    Store(tmp_path / "new" / "folder").check_writable()
    assert not (tmp_path / "new").exists()  # the probe and the folders made for it are gone
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="cannot write results under"):
        Store(blocker / "sub").check_writable()


@pytest.mark.slow
def test_two_processes_asking_for_one_group_train_it_once(tmp_path):
    script = (
        "import sys; from dataclasses import replace; from engine.core.presets import smoke; "
        "from engine.core.store import Store; from engine.experiments import runs as e; "
        "c = smoke('parity'); c = replace(c, train=replace(c.train, steps=40)); "
        "print(e.train_and_store(c, [0, 1], Store(sys.argv[1]), 'train', progress=False))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert sorted(o.strip() for o, _ in outs) == ["False", "True"], outs  # one trained, one found it stored


def test_eval_extends_a_cached_run_and_labels_the_surgery(store):
    (key,) = ensure_runs(CFG, [0], store, progress=False)
    extend_eval(store, [key], list(range(1, 25)), progress=False)
    extend_eval(store, [key], list(range(1, 7)), boundary="none", progress=False)
    rows = store.load_rows(key)
    assert rows[rows.boundary == "norm"].eval_loops.max() == 24
    assert set(rows.boundary) == {"norm", "norm->none"}
    assert not rows.duplicated([c for c in RESULT_COLUMNS if c != "value"]).any()
    # the surgery is the identity at n = 1
    acc = rows[(rows.metric == "accuracy") & (rows.eval_loops == 1)]
    pivot = acc.pivot_table(index="difficulty", columns="boundary", values="value")
    pd.testing.assert_series_equal(pivot["norm"], pivot["norm->none"], check_names=False)


def test_rows_added_after_training_record_their_own_provenance(store):
    (key,) = ensure_runs(CFG, [0], store, progress=False)
    trained = store.manifest(key)
    assert "rows_added" not in trained
    extend_eval(store, [key], [1, 2], boundary="none", experiment="e5", progress=False)
    manifest = store.manifest(key)
    (added,) = manifest["rows_added"]
    assert added["boundaries"] == ["norm->none"] and added["experiment"] == "e5"
    assert added["git_commit"] == trained["git_commit"] and added["git_dirty"] == trained["git_dirty"]
    assert {k: v for k, v in manifest.items() if k not in ("files", "rows_added")} == {
        k: v for k, v in trained.items() if k != "files"
    }  # the training's provenance is kept as it was
    assert store.status(key) == "ok"


def test_a_safetensors_file_written_tensor_by_tensor_reads_back_as_written(tmp_path):
    """write_safetensors (checkpoints: no whole-file copy in memory) against safetensors' own reader."""
    from safetensors import safe_open

    from engine.core.store import write_safetensors

    g = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16),
               "step": torch.tensor(12, dtype=torch.int64), "mask": torch.tensor([True, False, True]),
               "state": torch.randint(0, 255, (9,), dtype=torch.uint8, generator=g), "empty": torch.zeros(0),
               "strided": torch.randn(4, 6, generator=g)[:, ::2]}  # fmt: skip
    path = tmp_path / "x.safetensors"
    write_safetensors(path, tensors, metadata={"loopscope": '{"step": 3}'})
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"loopscope": '{"step": 3}'} and set(f.keys()) == set(tensors)
        for name, t in tensors.items():
            back = f.get_tensor(name)
            assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t), name
    assert [p.name for p in tmp_path.iterdir()] == ["x.safetensors"]  # no temporary left
