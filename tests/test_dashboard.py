"""The dashboard renders on real results, an empty folder and a damaged run, without a traceback."""

from dataclasses import replace
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.experiments import ensure_runs
from engine.presets import smoke
from engine.store import Store

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    cfg = replace(smoke("parity"), train=replace(smoke("parity").train, steps=20))
    ensure_runs(cfg, [0, 1], Store(root), progress=False)
    return root


def render(monkeypatch, root) -> AppTest:
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    return AppTest.from_file(APP, default_timeout=60).run()


def test_runs_page_lists_runs(monkeypatch, results):
    at = render(monkeypatch, results)
    assert not at.exception
    assert at.dataframe[0].value.shape[0] == 2


def test_empty_folder_says_what_to_do(monkeypatch, tmp_path):
    at = render(monkeypatch, tmp_path / "nothing")
    assert not at.exception
    assert "loopscope train" in at.info[0].value


def test_corrupt_run_is_reported_not_raised(monkeypatch, results, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(results, root)
    key = Store(root).run_keys()[0]
    (root / "runs" / key / "model.safetensors").write_bytes(b"garbage")
    at = render(monkeypatch, root)
    assert not at.exception
    assert at.dataframe[0].value.shape[0] == 1
    assert "checksum" in at.warning[0].value
