"""The store: atomic writes, checksums, corrupt files detected and redone, cache hits never recomputed."""

from dataclasses import replace

import pandas as pd
import pytest

from engine import experiments
from engine.experiments import ensure_runs, extend_eval
from engine.presets import smoke
from engine.store import RESULT_COLUMNS, CorruptRun, Store

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
        assert list(rows.columns) == RESULT_COLUMNS
        assert set(rows.metric) == {
            "accuracy",
            "choice_accuracy",
            "top_token_share",
            "top_token",
            "norm_pre",
            "norm_post",
        }
        assert sorted(rows.eval_loops.unique()) == list(range(1, CFG.eval_loops + 1))
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


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_manifest", "garble_manifest"])
def test_corrupt_files_are_detected_reported_and_redone(store, damage, capsys):
    (key,) = ensure_runs(CFG, [0], store, progress=False)
    folder = store.run_dir(key)
    model = folder / "model.safetensors"
    if damage == "truncate":
        model.write_bytes(model.read_bytes()[:100])
    elif damage == "flip":
        data = bytearray(model.read_bytes())
        data[-1] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "delete_manifest":
        (folder / "manifest.json").unlink()
    else:
        (folder / "manifest.json").write_text("{not json")
    assert store.status(key) != "ok"
    if damage in ("truncate", "flip"):
        with pytest.raises(CorruptRun, match="checksum"):
            store.load_checkpoint(key)  # never loaded
    ensure_runs(CFG, [0], store, progress=False)
    assert "redoing it" in capsys.readouterr().err
    assert store.status(key) == "ok"


def test_an_interrupted_write_leaves_no_run(store, monkeypatch):
    import engine.store as store_module

    real = store_module.atomic_write

    def crash_on_manifest(path, data):
        if path.name == "manifest.json":
            raise OSError("disk full")
        real(path, data)

    monkeypatch.setattr(store_module, "atomic_write", crash_on_manifest)
    with pytest.raises(OSError):
        ensure_runs(CFG, [0], store, progress=False)
    assert store.status(CFG.run_key(0)) != "ok"


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
