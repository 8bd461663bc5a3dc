"""Crash consistency: real `loopscope run` processes killed with SIGKILL at chosen points, then rerun to
completion, end with the very tables and tensors of an uninterrupted run.

The kill points come from engine.core.store's fault hook (LOOPSCOPE_FAULT=<file-name text>:<n>: SIGKILL at the
n-th such write, after its bytes are on disk and before they take their name), so each lands exactly
where it is meant to: between a run's files and its manifest, inside a group's save loop, between the
surgery's new rows and the manifest that adopts them, in a refit group, and on a table.
"""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load as load_safetensors

from engine.core.store import Store
from engine.experiments import e3

# e2 --preset smoke --seeds 2 writes, in order: per config (parity norm, parity none, chain norm, chain
# none) one group of two runs (a model, rows and manifest each), and after each norm group the surgery's
# rows for its two runs (rows and manifest each); then the table.
E2_KILLS = [
    "manifest.json:1",  # the first run's model and rows written, its manifest not
    "manifest.json:2",  # half of the first group stored
    "manifest.json:2",  # the repaired group stored, then the surgery's rows written without their manifest
    "model-:5",  # in the last group (chain none), after a model file and before it takes its name
    "manifest.json:2",  # half of the last group stored
    "e2-smoke.parquet:1",  # everything stored, the table not
]
E3_KILLS = ["manifest.json:1", "manifest.json:2"]  # a refit group: nothing stored; half of it stored


def loopscope(results: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", LOOPSCOPE_FAULT=fault or "")
    command = [sys.executable, "-m", "engine", "run", *args, "--preset", "smoke", "--seeds", "2"]
    return subprocess.run([*command, "--results", str(results)], env=env, capture_output=True, text=True, timeout=900)


def killed(results: Path, *args: str, faults: list[str]) -> None:
    for fault in faults:
        done = loopscope(results, *args, fault=fault)
        assert done.returncode == -signal.SIGKILL, (fault, done.returncode, done.stderr[-2000:])


def assert_same_results(got: Path, want: Path, table: str, folder: str = "runs") -> None:
    pd.testing.assert_frame_equal(pd.read_parquet(got / table), pd.read_parquet(want / table))
    a, b = Store(got, folder=folder), Store(want, folder=folder)
    assert a.run_keys() == b.run_keys() and a.run_keys()
    role = "refit.safetensors" if folder == "refits" else "model.safetensors"
    for key in a.run_keys():
        assert a.status(key) == "ok"
        wa, wb = (load_safetensors(s.read(key, role)) for s in (a, b))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)
        pd.testing.assert_frame_equal(a.load_rows(key), b.load_rows(key))


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("uninterrupted")
    assert loopscope(root, "e2").returncode == 0
    return root


def test_e2_killed_six_times_ends_equal_to_an_uninterrupted_run(reference, tmp_path):
    killed(tmp_path, "e2", faults=E2_KILLS)
    done = loopscope(tmp_path, "e2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_results(tmp_path, reference, "e2-smoke.parquet")
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and p.name.startswith(".")]  # no debris


def test_e3_refits_killed_in_a_group_end_equal(reference, tmp_path_factory):
    want, got = tmp_path_factory.mktemp("e3-straight"), tmp_path_factory.mktemp("e3-killed")
    for root in (want, got):
        shutil.copytree(reference, root, dirs_exist_ok=True)
    assert loopscope(want, "e3", "--tasks", "parity").returncode == 0
    killed(got, "e3", "--tasks", "parity", faults=E3_KILLS)
    assert loopscope(got, "e3", "--tasks", "parity").returncode == 0
    assert_same_results(got, want, "e3-smoke.parquet", folder="refits")
    assert e3.refit_store(Store(got)).run_keys() == e3.refit_store(Store(want)).run_keys()
