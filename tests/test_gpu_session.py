"""One device session of the GPU study (issue 45): predictions from seconds a step, every piece fitting one command or
refused before it starts, a piece cut short returning what it finished, and the session's plan
(dev/checks/gpu-session.sh, dev/checks/gpu_session.py)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cli
from engine.core.presets import preset
from engine.core.store import Store, weights_not_kept
from engine.experiments import e3, e5
from engine.runtime import gpu_pack, gpu_study
from engine.runtime.gpu_study import Budget, Rates

REPO = Path(__file__).resolve().parents[1]
SMOKE = "gpu-smoke"


def session_module():
    spec = importlib.util.spec_from_file_location("gpu_session", REPO / "dev" / "checks" / "gpu_session.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_h200_rates_are_its_measured_shares_of_the_peak_at_the_gpu_presets_batch():
    """The default rates read issue 29's two measurements (2.5% at 256 items a step, 11.5% at 4,096) and nothing else:
    the 16-seed group at batch 64 (1,024 items) lies between them, and more members never make a step cheaper."""
    assert gpu_study.h200_rate(256) == pytest.approx(0.025 * 783e12)
    assert gpu_study.h200_rate(4096) == pytest.approx(0.115 * 783e12)
    assert 0.025 * 783e12 < gpu_study.h200_rate(1024) < 0.115 * 783e12
    r = Rates.h200("gpu")
    assert r.step(16) > r.step(4) > 0 and r.step(10) == pytest.approx((r.step(4) + r.step(16)) / 2)
    again = Rates.load(None, "gpu")
    assert again == r


def test_the_ladder_predicts_each_rung_from_seconds_a_step_and_refuses_none_of_them_on_a_first_call():
    """Issue 45: the FLOP rate of an overhead-bound small rung, carried to the next, refused rungs 2 and 3 at every
    rate tried. From seconds a step (each rung's FLOPs, never under its own launch floor) every rung fits a command,
    and a larger rung never costs less than a smaller one."""
    r, ref = Rates.h200("gpu"), preset("gpu", "parity", "norm")
    seconds = [r.train_s(cfg, 4, ref) + r.evals_s(cfg, 4, 3, ref) for cfg in e5.rungs("gpu")]
    assert len(seconds) == 3 and seconds == sorted(seconds)
    budget = Budget(start_by=gpu_study.BUDGET_S, limit=gpu_study.LIMIT_S)
    for s in seconds:
        assert budget.refusal(s) is None
        budget.t0 -= s  # as if it ran for its prediction
    assert budget.elapsed() < gpu_study.LIMIT_S
    small, large = e5.rungs("gpu")[0], ref
    assert r.train_s(small, 4, ref) >= small.train.steps * r.floor(small)  # the floor holds a small model
    assert r.train_s(large, 4, ref) > r.train_s(small, 4, ref)


def test_a_piece_predicted_past_the_limit_is_refused_before_it_starts():
    budget = Budget(start_by=300, limit=450)
    assert budget.refusal(449.0) is None
    why = budget.refusal(451.0)
    assert why.startswith("not started: predicted 451 s") and "limit of 450 s" in why
    assert Budget(start_by=-1, limit=450).refusal(1.0).startswith("not started: the budget of -1 s is spent")


def test_the_plan_of_the_next_real_session_fits_a_session_and_starts_with_e2_norm(tmp_path):
    """From an empty store: the calibration, then E2 at 19M (`norm`), within the 780 s a session plans for at the H200's
    rates of 2026-12-04; each of the E2 pieces and E3 (after a norm group stored weightless) fits one command."""
    gs = session_module()
    log = gs.Log(tmp_path)
    p = gs.plan(tmp_path / "empty-results", log)
    assert p["piece"] == "norm" and p["total_s"] <= gs.SESSION_S
    left = gs.COMMAND_S - gs.CALIBRATION_S - gs.RESERVE_S
    r, ref = Rates.h200("gpu"), preset("gpu", "parity", "norm")
    refit = e3.refit_config("gpu")
    for piece in ("norm", "none"):
        assert gs.predict(piece, "gpu", tmp_path / "empty-results", r) <= left, piece
    retrain_and_refit = r.train_s(ref, 16, ref) + r.refits_s(ref, 16, refit.targets, refit.schedule, ref)
    assert retrain_and_refit <= left
    assert (tmp_path / "gpu-session.log").read_text().count("the next real session") == 1


def test_rates_round_trip_through_the_file_a_session_writes(tmp_path):
    r = Rates("measured", {4: 0.05, 16: 0.12}, 0.002, 0.3, 0.1, 20.0)
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(r.to_dict()))
    assert Rates.load(path) == r
    ref = preset("gpu", "parity", "norm")
    assert r.train_s(ref, 16, ref) == pytest.approx(ref.train.steps * 0.12)


@pytest.mark.slow
def test_a_norm_piece_that_cannot_fit_its_refits_returns_e2s_rows_and_the_e3_piece_finishes_it(tmp_path):
    """gpu-smoke on the CPU: rates under which the refits cannot follow the training in one command. The norm piece
    stores E2 and the surgery, refuses the refits before they start and packs every seed's rows (weightless seeds
    named in still_needs); in a fresh store holding only that pack (the next session), the e3 piece retrains the
    group, keeps the weights only because every row reproduces bit for bit, and refits."""
    cfg = preset(SMOKE, "parity", "norm")
    slow_refits = Rates("test", {4: 0.001, 16: 0.004}, 0.0, 0.001, 1e3)  # a refit step of 1,000 s: never fits
    first, out = tmp_path / "first", tmp_path / "out"
    assert gpu_study.run("norm", SMOKE, first, "cpu", 300, 450, out, slow_refits) == 0
    summary = json.loads((out / "gpu-study-norm.json").read_text())
    refit_units = [u for u in summary["units"] if "refit" in u["what"]]
    assert refit_units and all(u["status"].startswith("not started") for u in refit_units)
    made = gpu_pack.pack("norm", SMOKE, first, out)
    keys = [cfg.run_key(s) for s in cfg.group(0)]
    assert sorted(made["runs"]) == sorted(keys) and set(made["still_needs"]) == set(keys[1:])
    second = tmp_path / "second"
    assert cli.main(["merge", str(out / made["file"]), "--results", str(second)]) == 0
    store = Store(second / SMOKE)
    assert [k for k in keys if weights_not_kept(store.manifest(k))] == keys[1:]
    fast = Rates("test", {4: 0.001, 16: 0.004}, 0.0, 0.001, 0.001)
    assert gpu_study.run("e3", SMOKE, second, "cpu", 300, 450, tmp_path / "out2", fast) == 0
    summary = json.loads((tmp_path / "out2" / "gpu-study-e3.json").read_text())
    restored = summary["restored"]  # the seed that kept its weights says so; each weightless one came back bit for bit
    assert all("bit for bit" in restored[k] for k in keys[1:]), restored
    assert not e3.missing_refits(keys, e3.refit_config(SMOKE), store)


@pytest.mark.slow
def test_the_dry_run_session_ends_with_its_plan_and_at_most_eight_files(tmp_path):
    out = tmp_path / "out"
    env = {"OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", str(REPO / "dev" / "checks" / "gpu-session.sh"), "--dry-run"], capture_output=True,
                          text=True, env=env, timeout=900, cwd=REPO)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert lines[-1].startswith("plan: ") and " s of device time" in lines[-1]
    summary = json.loads((out / "gpu-session.json").read_text())
    assert summary["plan"]["total_s"] <= 780 and len(list(out.iterdir())) <= 8
    assert {"gpu-session.log", "gpu-session.json", "rates.json"} <= {p.name for p in out.iterdir()}
