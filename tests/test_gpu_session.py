"""One device session of the GPU study (issues 45 and 59): predictions from the rates a calibration measures, the piece
chooser against the pieces' own refusals over a grid of rates, every piece fitting one command or declared outside
the session, a piece cut short returning what it finished, the eager fallback, the Inductor cache that comes back,
and the session's plan (dev/checks/gpu-session.sh, dev/checks/gpu_session.py, engine/runtime/gpu_plan.py)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from engine import cli
from engine.core.presets import preset, study_root
from engine.core.store import Store, weights_not_kept
from engine.experiments import e3, e5
from engine.runtime import gpu_pack, gpu_plan, gpu_study
from engine.runtime.gpu_rates import PROCESS_S, Budget, Rates, h200_rate

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
    assert h200_rate(256) == pytest.approx(0.025 * 783e12)
    assert h200_rate(4096) == pytest.approx(0.115 * 783e12)
    assert 0.025 * 783e12 < h200_rate(1024) < 0.115 * 783e12
    r = Rates.h200("gpu")
    assert r.step(16) > r.step(4) > 0 and r.step(10) == pytest.approx((r.step(4) + r.step(16)) / 2)
    assert r.eval_one_s > r.eval_s  # one member alone, eager: fewer items a launch than the group in one forward
    assert Rates.load(None, "gpu") == r


def test_the_ladder_predicts_each_rung_from_seconds_a_step_and_refuses_none_of_them_on_a_first_call():
    """Issue 45: the FLOP rate of an overhead-bound small rung, carried to the next, refused rungs 2 and 3 at every
    rate tried. From seconds a step (each rung's FLOPs, never under its own launch floor) every rung fits a command,
    and a larger rung never costs less than a smaller one."""
    r, ref = Rates.h200("gpu"), preset("gpu", "parity", "norm")
    seconds = [r.trained_s(cfg, 4, ref, surgery=True) + r.rescale_s(cfg, 4, ref) for cfg in e5.rungs("gpu")]
    assert len(seconds) == 3 and seconds == sorted(seconds)
    budget = Budget(start_by=gpu_study.BUDGET_S, limit=gpu_study.LIMIT_S)
    budget.t0 -= r.compile_s  # the first rung pays the compilation
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


def test_rates_round_trip_through_the_file_a_session_writes(tmp_path):
    r = Rates("measured", {4: 0.05, 16: 0.12}, 0.002, 0.3, 0.1, 20.0, 0.9, 0.4)
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(r.to_dict()))
    assert Rates.load(path) == r
    ref = preset("gpu", "parity", "norm")
    assert r.train_s(ref, 16, ref) == pytest.approx(ref.train.steps * 0.12)
    older = {k: v for k, v in r.to_dict().items() if k not in ("eval_one_s", "refit_eval_s")}  # issue 45's file
    path.write_text(json.dumps(older))
    assert Rates.load(path).eval_one_s == Rates.load(path).refit_eval_s == 0.3


def test_the_plan_of_the_next_real_session_fits_a_session_and_names_what_does_not(tmp_path):
    """From an empty store at the H200's rates (compile assumed 60 s): the calibration and its compilation, then E2 at
    19M (`norm`), each part printed with its prediction, within the 780 s a session plans for. E3 waits for the norm
    group and C2's 2,000 steps are declared outside the session."""
    gs = session_module()
    log = gs.Log(tmp_path)
    p = gs.plan(tmp_path / "empty-results", log)
    assert p["piece"] == "norm" and p["total_s"] <= gpu_plan.SESSION_S
    assert p["parts"]["calibration_compile"] == 60 and p["piece_parts"]["compile"] == 60
    assert p["piece_s"] == pytest.approx(sum(p["piece_parts"].values()))
    assert "waits for the norm piece" in p["waiting"]["e3"] and "outside the session" in p["outside"]["chain-c2"]
    lines = gs.plan_lines(p)
    assert lines[-1].startswith(f"plan: {p['total_s']} s of device time") and "compile 60" in lines[-1]
    assert any(line.startswith("  norm: ") and "compile 60" in line for line in lines)
    assert (tmp_path / "gpu-session.log").read_text().count("the next real session") == 1


# ---------------------------------------------------------------- the chooser against the pieces' own refusals


def h200_times(speed: float, compile_s: float) -> Rates:
    """The H200's rates with every step `speed` times as fast, and `compile_s` of compilation."""
    h = Rates.h200("gpu")
    return Rates(f"H200 x{speed}", {m: s / speed for m, s in h.step_s.items()}, h.floor_s / speed, h.eval_s / speed,
                 h.refit_s / speed, compile_s, h.eval_one_s / speed, h.refit_eval_s / speed)  # fmt: skip


def stored_weightless(root: Path, boundary: str) -> None:
    """E2's group of `boundary` at the `gpu` preset as a session packs it: stored, every row the study needs, no
    weights (they stayed on the GPU machine)."""
    cfg, store = preset("gpu", "parity", boundary), Store(study_root(root, "gpu"))
    labels = [boundary, *(["norm->none", "norm->rescale"] if boundary == "norm" else [])]
    for seed in cfg.group(0):
        key = cfg.run_key(seed)
        rows = pd.DataFrame([dict(experiment="e2", run_key=key, task="parity", arch="looped", boundary=b, seed=seed,
                                  trained_loops=4, eval_loops=n, difficulty=7, metric="accuracy", value=0.5,
                                  split="seen") for b in labels for n in (1, cfg.max_eval_loops)])  # fmt: skip
        manifest = dict(seed=seed, config=cfg.to_dict(), group=cfg.group(0), experiment="e2")
        store.save_run(key, manifest, {"w": torch.zeros(1)}, rows)
        store.drop_weights(key, "trained on the GPU machine (a test's stand-in)")


@dataclass
class Clock(Budget):
    """A budget whose clock is moved by the units' predictions instead of time."""

    now: float = PROCESS_S  # a piece's budget counts its process's start-up (gpu_study.process_age)

    def elapsed(self) -> float:
        return self.now


def simulate(piece: str, results: Path, rates: Rates, left: float, out: Path) -> list[dict]:
    """The piece's own code (gpu_study) with every unit's work replaced by the passing of its prediction (and C1's
    probe by the rates' own seconds for it): the units it starts and those it refuses."""
    real = gpu_study.Piece.unit

    def unit(self, what, cfg, members, work_flops, needed, work, seconds=0.0, trains=False):
        def passes():
            self.budget.now += self.summary["units"][-1]["predicted_s"]

        return real(self, what, cfg, members, work_flops, needed, passes, seconds, trains)

    def probe(cfg, device):
        ref = preset("gpu", "parity", "norm")
        budget.now += rates.compile_s + rates.train_s(cfg, 4, ref, gpu_study.PROBE_STEPS)
        return dict(seconds_a_step=rates.train_s(cfg, 4, ref, 1000) / 1000)

    budget = Clock(left, left)
    p = gpu_study.Piece(piece, "gpu", Store(study_root(results, "gpu")), "cuda", budget, out, rates=rates)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_study.Piece, "unit", unit)
        patch.setattr(gpu_study, "probe_rate", probe)
        patch.setattr(gpu_study.memory, "estimate", lambda *a: SimpleNamespace(peak_bytes=0, sentence=str))
        if piece in ("norm", "none"):
            gpu_study.mode_piece(p, piece)
        elif piece == "e3":
            gpu_study.e3_piece(p)
        else:
            gpu_study.chain_piece(p, piece.split("-")[1].upper())
    return p.summary.get("units", [])


def runs_whole(units: list[dict]) -> bool:
    """Whether a piece started everything it must: E3's refits inside `norm` run only if they fit (else the `e3`
    piece computes them), every other unit must start."""
    must = [u for u in units if not (u["what"].startswith("E3's refits") and "E2" not in u["what"])]
    return bool(must) and not any(u["status"].startswith("not started") for u in must)


STORED = [
    pytest.param((), id="empty"),
    pytest.param(("norm",), id="norm-stored", marks=pytest.mark.slow),
    pytest.param(("norm", "none"), id="both-stored", marks=pytest.mark.slow),
]  # 15-40 s each on 2 loaded cores


@pytest.mark.parametrize("stored", STORED)
def test_the_chooser_picks_the_first_piece_that_runs_whole_over_a_grid_of_rates(tmp_path, monkeypatch, stored):
    """Issue 59: compile 0-60 s and steps 0.5-2x the H200's, with the whole of what a session's command leaves a piece
    and two minutes less. The piece chosen is the first of ORDER whose own code, run against the clock its
    predictions move, starts all it must: so whenever `norm` fits, `norm` is chosen; nothing chosen is refused on
    start; `e3` only once the norm group is stored; and no piece that could run is left out."""
    results = tmp_path / "results"
    for boundary in stored:
        stored_weightless(results, boundary)
    store, read, rows = Store(study_root(results, "gpu")), Store.load_rows, {}
    monkeypatch.setattr(
        Store, "load_rows", lambda self, key: rows.get(key) if key in rows else rows.setdefault(key, read(self, key))
    )  # the store does not change while the grid runs: each run's rows are read once
    chosen = set()
    for compile_s in (0, 5, 15, 30, 60):
        for speed in (0.5, 0.75, 1.0, 1.5, 2.0):
            rates = h200_times(speed, compile_s)
            for left in (gpu_plan.most_s(rates), gpu_plan.most_s(rates) - 120):
                choice, weighed = gpu_plan.choose("gpu", results, rates, left)
                can = [p for p in gpu_plan.ORDER if gpu_plan.state(p, "gpu", store) == "todo"]
                whole = {p: runs_whole(simulate(p, results, rates, left, tmp_path / "out")) for p in can}
                expected = next((p for p in can if whole[p]), None)
                assert choice == expected, (compile_s, speed, left, weighed, whole)
                e3_weighed = [w for w in weighed if w["piece"] == "e3"]
                assert "norm" in stored or all(w["status"].startswith("waits for the norm") for w in e3_weighed)
                chosen.add(choice)
    assert "e3" not in chosen or "norm" in stored
    if stored == ("norm", "none"):
        assert "e3" in chosen  # where it fits: the group trained again and refit in one command
    if not stored:
        assert {"norm", "chain-c1"} <= chosen  # norm where it fits, the chain's search sized to what is left elsewhere
    assert "chain-c2" not in chosen  # 2,000 steps: outside every session at these rates


def test_e3_waits_for_the_norm_group_and_then_trains_it_again_itself(tmp_path):
    """E3 after a session packed the norm group without weights: one unit that trains the group again and refits it
    (no bet on retraining bit for bit), its prediction the training's and the refits' together."""
    results, rates = tmp_path / "results", Rates.h200("gpu")
    store = Store(study_root(results, "gpu"))
    assert gpu_plan.state("e3", "gpu", store).startswith("waits for the norm piece")
    stored_weightless(results, "norm")
    assert gpu_plan.state("e3", "gpu", store) == "todo" and gpu_plan.state("norm", "gpu", store) == "done"
    ref, refit = preset("gpu", "parity", "norm"), e3.refit_config("gpu")
    ((what, seconds, trains),) = gpu_plan.units("e3", "gpu", store, rates)
    assert trains and "again" in what
    assert seconds == pytest.approx(rates.trained_s(ref, 16, ref) + rates.refits_s(ref, 16, refit.targets,
                                                                                    refit.schedule, ref))  # fmt: skip


# ---------------------------------------------------------------- the session's script, its cache


def test_a_real_session_refuses_to_start_without_the_commit_it_was_sent_from(tmp_path):
    """A tree without .git records its commit only from LOOPSCOPE_COMMIT: without one (or with one that is no
    commit id) a real session stops in one sentence, exit 2, before Python starts; a dry run does not need it."""
    tree = tmp_path / "tree"
    (tree / "dev" / "checks").mkdir(parents=True)
    shutil.copy(REPO / "dev" / "checks" / "gpu-session.sh", tree / "dev" / "checks")
    for commit in ("", "main"):
        env = {"OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin", "LOOPSCOPE_COMMIT": commit,
               "PYTHON": "/bin/false"}  # fmt: skip
        done = subprocess.run(["bash", str(tree / "dev" / "checks" / "gpu-session.sh")], capture_output=True,
                              text=True, env=env, timeout=60)  # fmt: skip
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "LOOPSCOPE_COMMIT" in done.stderr and "not started" in (tmp_path / "out" / "gpu-session.log").read_text()
    env["LOOPSCOPE_COMMIT"] = "0123abcd" * 5
    done = subprocess.run(["bash", str(tree / "dev" / "checks" / "gpu-session.sh")], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "not started" not in done.stderr  # it went on to Python (here /bin/false)


def test_the_inductor_cache_that_comes_back_is_this_gpus_and_fits_one_file(tmp_path, monkeypatch):
    """Only this GPU's (and torch's) folder is tarred and unpacked; over the limit, Triton's intermediate files go,
    then everything but the graph caches."""
    gs = session_module()
    log = gs.Log(tmp_path)
    monkeypatch.setenv("LOOPSCOPE_INDUCTOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    folder = gs.use_cache("gpu-a", log, carried=tmp_path / "none.tar.gz")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder) and folder.is_dir()
    (folder / "fxgraph").mkdir()
    (folder / "fxgraph" / "entry").write_bytes(b"graph" * 100)
    (folder / "triton" / "0" / "k").mkdir(parents=True)
    (folder / "triton" / "0" / "k" / "kernel.cubin").write_bytes(os.urandom(300_000))
    (folder / "triton" / "0" / "k" / "kernel.ptx").write_bytes(os.urandom(300_000))
    other = tmp_path / "cache" / "gpu-b"  # another GPU's folder beside it: never tarred
    other.mkdir()
    (other / "x").write_bytes(b"other")
    out = tmp_path / "out"
    out.mkdir()
    assert gs.tar_cache(out, folder, "gpu-a", log, limit_mib=1) == "every entry"
    assert gs.tar_cache(out, folder, "gpu-a", log, limit_mib=0.5) == "without Triton's intermediate files"
    assert gs.tar_cache(out, folder, "gpu-a", log, limit_mib=0.1) == "Inductor's graph caches alone"
    with tarfile.open(out / "inductor-cache.tar.gz") as tar:
        assert tar.getnames() == ["inductor/gpu-a/fxgraph/entry"]
    assert gs.tar_cache(out, folder, "gpu-a", log, limit_mib=1e-4) is None
    assert not (out / "inductor-cache.tar.gz").exists()
    assert gs.tar_cache(out, folder, "gpu-a", log) == "every entry"
    carried = tmp_path / "inductor-cache.tar.gz"
    with tarfile.open(out / "inductor-cache.tar.gz") as mine, tarfile.open(carried, "w:gz") as tar:
        for m in mine.getmembers():
            tar.addfile(m, mine.extractfile(m))
        tar.add(other / "x", arcname="inductor/gpu-b/x")  # a carried tar holding another GPU's entry too
    monkeypatch.setenv("LOOPSCOPE_INDUCTOR_CACHE", str(tmp_path / "fresh"))
    gs.use_cache("gpu-a", log, carried=carried)
    unpacked = sorted(str(p.relative_to(tmp_path / "fresh")) for p in (tmp_path / "fresh").rglob("*") if p.is_file())
    assert unpacked == ["gpu-a/fxgraph/entry", "gpu-a/triton/0/k/kernel.cubin", "gpu-a/triton/0/k/kernel.ptx"]
    assert "1 of another GPU or torch left out" in (tmp_path / "gpu-session.log").read_text()


# ---------------------------------------------------------------- whole pieces and sessions on the CPU


@pytest.mark.slow
def test_a_norm_piece_that_cannot_fit_its_refits_returns_e2s_rows_and_the_e3_piece_finishes_it(tmp_path):
    """gpu-smoke on the CPU: rates under which the refits cannot follow the training in one command. The norm piece
    stores E2 and the surgery, refuses the refits before they start and packs every seed's rows (weightless seeds
    named in still_needs); in a fresh store holding only that pack (the next session), the e3 piece trains the group
    again and refits it, each refit naming the retraining and how many E2 values it reproduced; the runs stay."""
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
    before = {k: store.manifest(k) for k in keys}
    fast = Rates("test", {4: 0.001, 16: 0.004}, 0.0, 0.001, 0.001)
    assert gpu_study.run("e3", SMOKE, second, "cpu", 300, 450, tmp_path / "out2", fast) == 0
    summary = json.loads((tmp_path / "out2" / "gpu-study-e3.json").read_text())
    assert set(summary["retrained"]) == set(keys) and all("trained again" in s for s in summary["retrained"].values())
    assert not e3.missing_refits(keys, e3.refit_config(SMOKE), store)
    cache = Store(second / SMOKE, folder="refits")
    for key in keys:
        m = cache.manifest(e3.refit_key(key, e3.refit_config(SMOKE)))
        assert m["retrained_group"]["bit_for_bit"] == (m["retrained_group"]["e2_values_equal"] ==
                                                       m["retrained_group"]["e2_values"] > 0)  # fmt: skip
    assert {k: store.manifest(k) for k in keys} == before  # the stored runs are left as they were
    packed = gpu_pack.pack("e3", SMOKE, second, tmp_path / "out2")
    assert len(packed["refits"]) == len(keys)
    assert cli.main(["merge", str(tmp_path / "out2" / packed["file"]), "--results", str(tmp_path / "third")]) == 0


def dry_run(out: Path, **env) -> tuple[subprocess.CompletedProcess, dict]:
    base = {"OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
            "HOME": str(out.parent), **env}  # fmt: skip
    done = subprocess.run(["bash", str(REPO / "dev" / "checks" / "gpu-session.sh"), "--dry-run"], capture_output=True,
                          text=True, env=base, timeout=900, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done, json.loads((out / "gpu-session.json").read_text())


@pytest.mark.slow
def test_the_dry_run_session_ends_with_its_plan_and_at_most_eight_files(tmp_path):
    done, summary = dry_run(tmp_path / "out")
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("plan: ") and " s of device time" in lines[-1] and "compile" in lines[-1]
    assert any(line.startswith("  norm: ") for line in lines)
    assert summary["plan"]["total_s"] <= gpu_plan.SESSION_S and len(list((tmp_path / "out").iterdir())) <= 8
    assert {"gpu-session.log", "gpu-session.json", "rates.json"} <= {p.name for p in (tmp_path / "out").iterdir()}
    calibration = summary["calibration"]
    assert calibration["rates"]["compile_s"] >= 0 and "training" in calibration["one_off_s"]
    assert summary["piece"]["status"] == 0 and all(u["wall_s"] is not None for u in summary["piece"]["units"])


@pytest.mark.slow
def test_a_compile_that_fails_leaves_an_eager_session_that_returns_rows(tmp_path):
    """LOOPSCOPE_COMPILE=1 on the CPU with LOOPSCOPE_COMPILE_FAIL=1: the calibration's first compiled forward raises,
    and the session says so, calibrates again eager, plans at the eager rates and brings its piece's rows back."""
    done, summary = dry_run(tmp_path / "out", LOOPSCOPE_COMPILE="1", LOOPSCOPE_COMPILE_FAIL="1")
    assert summary["compile"]["mode"] == "eager" and "simulated" in summary["compile"]["failed"]
    assert summary["calibration"]["compiled"] is False and "eager" in summary["calibration"]["rates"]["source"]
    log = (tmp_path / "out" / "gpu-session.log").read_text()
    assert "the compiled path failed" in log and "goes on eager (LOOPSCOPE_COMPILE=0)" in log
    piece = summary["piece"]["name"]
    assert summary["piece"]["status"] == 0 and piece == "norm"
    pack = json.loads((tmp_path / "out" / f"gpu-study-{piece}.json").read_text())
    assert pack["compiled"] is False and len(pack["pack"]["runs"]) == preset(SMOKE, "parity", "norm").train.group_size
