"""A study's precision is one value (issue 44, item 4): a bf16 run never mixes into, nor replaces, an fp32 study's
tables (and the other way round), and the dashboard says the precision the study's runs trained in."""

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from dashboard import results
from engine.cli import main
from engine.core import presets
from engine.core.store import Store
from engine.errors import UsageError

RUN = ["run", "e2", "--preset", "smoke", "--seeds", "2", "--tasks", "parity", "--device", "cpu"]


@pytest.fixture
def tiny(monkeypatch):
    """The smoke preset cut to 4 steps and 16 evaluation items: the real code path in seconds."""
    original = presets.PRESETS["smoke"]

    def short(task="parity", boundary="norm", arch="looped"):
        cfg = original(task, boundary, arch)
        return replace(cfg, train=replace(cfg.train, steps=4), task=replace(cfg.task, eval_examples=16))

    monkeypatch.setitem(presets.PRESETS, "smoke", short)


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root, a file with its SHA-256."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def refused(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_bf16_run_into_an_fp32_study_is_refused_and_writes_nothing(tiny, tmp_path, capsys):
    assert main([*RUN, "--results", str(tmp_path)]) == 0
    assert (tmp_path / "e2-smoke.parquet").is_file()
    before = snapshot(tmp_path)
    for experiment in ("e2", "e3", "e4", "e5"):  # the CLI refuses before any training, whichever experiment
        argv = ["run", experiment, *RUN[2:], "--precision", "bf16", "--results", str(tmp_path)]
        err = refused(capsys, argv)
        assert (
            f"the `smoke` study in {tmp_path} is fp32; a bf16 run would mix precisions in one study: run it with "
            "--results ANOTHER_FOLDER, or with --precision fp32 to extend it." in err
        ), err
        assert snapshot(tmp_path) == before
    # every table writer refuses on its own too (a dashboard job calls them without the CLI)
    from engine.experiments import REGISTRY

    with presets.precision_override("bf16"):
        for module in REGISTRY.values():
            with pytest.raises(UsageError, match="is fp32; a bf16 run would mix precisions"):
                module.run("smoke", [0, 1], Store(tmp_path), "cpu", ["parity"], progress=False)
    assert snapshot(tmp_path) == before
    assert results.run_on("smoke", tmp_path) == "CPU, fp32"


def test_a_bf16_study_in_its_own_folder_says_bf16_and_refuses_fp32(tiny, tmp_path, capsys):
    root = tmp_path / "bf16"
    assert main([*RUN, "--precision", "bf16", "--results", str(root)]) == 0
    table = Store(root).read_table("e2-smoke")
    assert table is not None and len(table)
    manifests = [Store(root).manifest(k) for k in table["run_key"].unique()]
    assert {m["config"]["train"]["precision"] for m in manifests} == {"bf16"}
    assert results.run_on("smoke", root) == "CPU, bf16"  # the dashboard's device and precision line
    before = snapshot(root)
    err = refused(capsys, [*RUN, "--results", str(root)])  # an fp32 run into the bf16 study: the same rule
    assert f"the `smoke` study in {root} is bf16; an fp32 run would mix precisions in one study" in err, err
    assert snapshot(root) == before
