"""The command line: the happy path end to end, and every bad input ends in one sentence and exit 2."""

import json
import re
import subprocess
import sys

import pytest
import torch

from engine.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_train_list_eval_check(tmp_path, capsys):
    res = str(tmp_path / "res")
    code, out, _ = run(capsys, "train", "--preset", "smoke", "--seeds", "2", "--results", res, "--device", "cpu")
    assert code == 0 and "mean accuracy over 2 seed(s)" in out
    keys = out.strip().splitlines()[-1].split()[1:]
    assert len(keys) == 2
    code, out, _ = run(capsys, "list", "--results", res, "--json")
    listed = json.loads(out)
    assert code == 0 and {r["run_key"] for r in listed} == set(keys) and {r["status"] for r in listed} == {"ok"}
    code, out, _ = run(capsys, "eval", keys[0], "--loops", "1-24", "--boundary", "none", "--results", res)
    assert code == 0 and "norm->none" in out and "24" in out
    code, out, _ = run(capsys, "eval", keys[0], "--loops", "1-6", "--boundary", "rescale", "--results", res)
    assert code == 0 and "norm->rescale" in out and "6" in out
    code, out, _ = run(capsys, "train", "--preset", "smoke", "--boundary", "none", "--seeds", "1", "--results", res)
    none_key = out.strip().splitlines()[-1].split()[1]
    code, _, err = run(capsys, "eval", none_key, "--boundary", "rescale", "--results", res)
    assert code == 2 and "pick a norm-trained looped run" in err and "Traceback" not in err
    code, out, _ = run(capsys, "check", "--json")
    assert code == 0 and all(c["passed"] for c in json.loads(out))


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["train", "--preset", "huge"], "unknown preset 'huge'"),
        (["train", "--preset", "smoke", "--seeds", "-3"], "positive number of seeds"),
        (["train", "--preset", "smoke", "--seeds", "2--5"], "cannot read --seeds"),
        (["train", "--preset", "smoke", "--config", "missing.json"], "does not exist"),
        (["train", "--task", "sorting"], "invalid choice"),
        (["eval", "0123456789abcdef", "--loops", "1-24"], "no run '0123456789abcdef'"),
        (["eval", "0123456789abcdef", "--loops", "24-1"], "runs backwards"),
        (["eval", "0123456789abcdef", "--loops", "one-two"], "cannot read --loops"),
        (["eval", "0123456789abcdef", "--loops", "0-4"], "start at 1"),
        (["train", "--preset", "smoke", "--group-size", "0"], "--group-size"),
        (["run", "all", "--preset", "smoke", "--tasks", "parity,sorting"], "unknown task 'sorting'"),
        (["run", "e2", "--preset", "smoke", "--workers", "0"], "--workers must be at least 1"),
        (["run", "e2", "--preset", "smoke", "--workers", "2", "--backend", "ray"], "--workers is for the local"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(tmp_path, capsys, argv, phrase):
    res = tmp_path / "res"
    code, out, err = run(capsys, *argv, "--results", str(res))
    assert code == 2
    assert phrase in err and err.startswith("loopscope: error:") and len(err.strip().splitlines()) == 1
    assert not res.exists()  # nothing written


def test_unwritable_results_folder_is_refused_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = run(capsys, "train", "--preset", "smoke", "--results", str(blocker / "res"))
    assert code == 2 and "cannot write results" in err


def test_module_entry_point_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "eval", "nope", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "'nope' is not a run key" in proc.stderr


@pytest.mark.slow
def test_run_all_runs_e2_e3_e4_in_order_and_reruns_from_cache(tmp_path, capsys, monkeypatch):
    from engine.core.store import Store
    from engine.experiments import refit as rf
    from engine.experiments import runs as experiments

    res = str(tmp_path / "res")
    argv = ("run", "all", "--preset", "smoke", "--seeds", "2", "--tasks", "parity", "--results", res)
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert [line.split()[1] for line in out.splitlines() if line.startswith("== ")] == ["E2", "E3", "E4"]
    tables = {name: Store(res).read_table(f"{name}-smoke") for name in ("e2", "e3", "e4")}
    assert all(set(t.task) == {"parity"} and t.seed.nunique() == 2 for t in tables.values())

    def fail(*a, **k):
        raise AssertionError("recomputed")

    for module, name in ((experiments, "train_group"), (rf, "refit")):
        monkeypatch.setattr(module, name, fail)
    code, again, _ = run(capsys, *argv)
    untimed = lambda text: re.sub(r"\(\d+ s\)", "", text)  # noqa: E731
    assert code == 0 and untimed(again) == untimed(out)


@pytest.mark.slow
def test_local_workers_store_what_one_process_would(tmp_path, capsys):
    """`--workers 2`: trainings and E3's refits in two processes, results equal to a one-process run's."""
    from engine.core.store import Store

    argv = ("run", "e3", "--preset", "smoke", "--seeds", "2", "--tasks", "parity")
    outputs = {}
    for name, extra in (("one", ()), ("two", ("--workers", "2"))):
        code, outputs[name], err = run(capsys, *argv, *extra, "--results", str(tmp_path / name))
        assert code == 0
    from engine.core.presets import preset
    from engine.experiments import e3
    from engine.experiments.refit import distinct_targets

    targets = len(distinct_targets(e3.refit_config("smoke").targets, preset("smoke", "parity").model.layers_per_block))
    assert targets > 1  # one job per target, so the targets' refits really ran in separate processes
    assert "local: 1/1 training groups done" in err
    assert f"local: {targets}/{targets} refits (group x target) done" in err
    assert outputs["one"] == outputs["two"]
    one, two = Store(tmp_path / "one"), Store(tmp_path / "two")
    assert one.run_keys() == two.run_keys() and len(one.run_keys()) == 2
    for key in one.run_keys():
        a, b = one.load_weights(key), two.load_weights(key)
        assert all(torch.equal(a[k], b[k]) for k in a)
    import pandas as pd

    pd.testing.assert_frame_equal(one.read_table("e3-smoke"), two.read_table("e3-smoke"))
    from safetensors.torch import load_file

    refits = sorted(
        p.relative_to(tmp_path / "one") for p in (tmp_path / "one" / "refits").glob("*/refit-*.safetensors")
    )
    assert len(refits) == 2 and refits == sorted(
        p.relative_to(tmp_path / "two") for p in (tmp_path / "two" / "refits").glob("*/refit-*.safetensors")
    )
    for path in refits:
        a, b = load_file(tmp_path / "one" / path), load_file(tmp_path / "two" / path)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
