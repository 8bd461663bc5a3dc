"""Background jobs, checkpoints, Ray fan-out and sharing: identical specs share one job across processes,
cancel ends the worker, a kill -9 loses nothing that resuming does not redo bit for bit, a damaged job file
is a message, a read-only deployment refuses, and results travel to and from the Hub (mocked)."""

import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import huggingface_hub
import pandas as pd
import pytest
import torch
from safetensors import safe_open

from engine.cli import main
from engine.core.presets import smoke
from engine.core.store import Store
from engine.core.train import train_group
from engine.experiments import runs as experiments
from engine.runtime import fanout, jobs

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

REPO = Path(__file__).resolve().parents[1]


def short(cfg, steps: int):
    return replace(cfg, train=replace(cfg.train, steps=steps))


@pytest.fixture
def one_thread(monkeypatch):
    """Workers inherit the environment: one thread each, like this process (tests/conftest.py)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)


def wait_for(predicate, timeout_s: float = 60, what: str = "a condition"):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


# ---------------------------------------------------------------- checkpoints


def test_resuming_from_a_checkpoint_gives_bit_identical_weights(tmp_path):
    cfg = short(smoke("parity"), 60)
    straight = train_group(cfg, [0, 3], progress=False)

    def crash(done, total, loss):
        if done == 47:
            raise KeyboardInterrupt  # "the machine went away" after the checkpoint at step 40

    ckpt = tmp_path / "group.safetensors"
    with pytest.raises(KeyboardInterrupt):
        train_group(cfg, [0, 3], progress=False, checkpoint_path=ckpt, checkpoint_every=20, on_step=crash)
    with safe_open(str(ckpt), framework="pt") as f:
        assert json.loads(f.metadata()["loopscope"])["step"] == 40  # JSON beside the tensors, no pickle
    resumed = train_group(cfg, [0, 3], progress=False, checkpoint_path=ckpt, checkpoint_every=20)
    assert resumed.resumed_from == 40
    # the last step is checkpointed too: killed during the evaluation, the group resumes there and trains nothing
    again = train_group(cfg, [0, 3], progress=False, checkpoint_path=ckpt, checkpoint_every=20)
    assert again.resumed_from == 60
    for run in (resumed, again):
        assert torch.equal(straight.losses, run.losses)
        for name, value in straight.model.state_dict().items():
            assert torch.equal(value, run.model.state_dict()[name]), name


def test_a_checkpoint_of_another_run_is_ignored(tmp_path):
    ckpt = tmp_path / "group.safetensors"
    cfg = short(smoke("parity"), 30)
    train_group(cfg, [1], progress=False, checkpoint_path=ckpt, checkpoint_every=10)
    assert train_group(cfg, [2], progress=False, checkpoint_path=ckpt).resumed_from == 0  # other seeds
    ckpt.write_bytes(b"truncated")
    assert train_group(cfg, [1], progress=False, checkpoint_path=ckpt).resumed_from == 0  # unreadable


# ---------------------------------------------------------------- jobs


def test_specs_round_trip_and_name_their_job():
    spec = jobs.TrainSpec(short(smoke("chain"), 10), (0, 2), "cpu")
    assert jobs.spec_from_dict(json.loads(json.dumps(jobs.spec_dict(spec)))) == spec
    assert jobs.job_id(spec) == jobs.job_id(jobs.TrainSpec(short(smoke("chain"), 10), (0, 2), "cpu"))
    assert jobs.job_id(spec) != jobs.job_id(replace(spec, seeds=(0,)))
    other = jobs.EvalSpec("abc", 12, "none")
    assert jobs.spec_from_dict(jobs.spec_dict(other)) == other


SUBMIT_AT_ONCE = """
import pathlib, sys, time
from dataclasses import replace
from engine.runtime import jobs
from engine.core.presets import smoke
root, gate, me = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
(gate / me).touch()
while len(list(gate.iterdir())) < 2:  # both processes are imported and ready: go together
    time.sleep(0.001)
cfg = smoke("parity")
print(jobs.submit(jobs.TrainSpec(replace(cfg, train=replace(cfg.train, steps=5000)), (0,), "cpu"), root))
"""


def test_two_processes_submitting_one_spec_share_one_job_and_cancel_ends_it(tmp_path, one_thread):
    root, gate = tmp_path / "res", tmp_path / "gate"
    gate.mkdir()
    cmd = [sys.executable, "-c", SUBMIT_AT_ONCE, str(root), str(gate)]
    procs = [subprocess.Popen([*cmd, str(i)], stdout=subprocess.PIPE, text=True, cwd=REPO) for i in range(2)]
    ids = {p.communicate(timeout=120)[0].strip() for p in procs}
    cfg = short(smoke("parity"), 5000)
    jid = jobs.job_id(jobs.TrainSpec(cfg, (0,), "cpu"))
    try:
        assert ids == {jid}
        assert jobs.status(jid, root).launches == 1  # one worker for both submissions
        assert len(list(jobs.jobs_dir(root).glob("*.json"))) == 1
        job = wait_for(lambda: (j := jobs.status(jid, root)).eta_s is not None and j, what="an ETA")
    finally:
        cancelled = jobs.cancel(jid, root)  # this process did not start the worker: it is not its child
    assert job.state == "running" and job.total == 5000 and job.loss is not None and 0 < job.step < 5000
    assert cancelled.state == "cancelled" and "resume" in cancelled.message
    assert cancelled.ended is not None and cancelled.started is not None and cancelled.took_s() > 0
    assert not jobs._alive(job.pid)
    assert Store(root).status(cfg.run_key(0)) == "missing" and jobs.workbench(root).status(cfg.run_key(0)) == "missing"


def test_kill_9_mid_training_then_resubmit_ends_equal_to_an_uninterrupted_run(tmp_path, one_thread, monkeypatch):
    monkeypatch.setenv("LOOPSCOPE_CHECKPOINT_EVERY", "20")
    cfg, root = short(smoke("parity"), 200), tmp_path / "res"
    spec = jobs.TrainSpec(cfg, (0,), "cpu")
    key, ckpt = cfg.run_key(0), experiments.checkpoint_path(jobs.workbench(root), cfg, cfg.group(0))
    jid = jobs.submit(spec, root)
    try:
        wait_for(lambda: jobs.status(jid, root).step >= 45, what="step 45")
    finally:
        os.kill(jobs.status(jid, root).pid, signal.SIGKILL)
    lost = wait_for(lambda: (j := jobs.status(jid, root)).state == "lost" and j, what="the job to be seen lost")
    assert "resume" in lost.message and lost.step < 200
    bench = jobs.workbench(root)
    assert bench.status(key) == "missing" and not bench.run_dir(key).exists()  # nothing partial
    with safe_open(str(ckpt), framework="pt") as f:
        saved_step = json.loads(f.metadata()["loopscope"])["step"]
    assert saved_step >= 40 and saved_step % 20 == 0

    assert jobs.resume(jid, root) == jid  # the Run page's Resume button: the job's own spec, submitted again
    done = jobs.wait(jid, root, timeout_s=120)
    assert done.state == "done" and done.launches == 2, done.message
    store = jobs.workbench(root)  # a job's runs: in the workbench, never in the results folder's own store
    assert Store(root).run_keys() == [] and "in the workbench" in done.message
    assert store.manifest(key)["resumed_from_step"] >= saved_step and not ckpt.exists()

    reference = Store(tmp_path / "reference")
    experiments.ensure_runs(cfg, [0], reference, "train", "cpu", progress=False)
    resumed, straight = store.load_weights(key), reference.load_weights(key)
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    pd.testing.assert_frame_equal(store.load_rows(key), reference.load_rows(key))
    for field in ("final_loss", "loss_curve"):
        assert store.manifest(key)[field] == reference.manifest(key)[field]


def test_the_estimate_after_a_tenth_of_a_smoke_e2_is_within_one_and_a_half_times_what_was_left(tmp_path, one_thread):
    """Issue 60: a smoke E2 (parity and chain, seeds 0-1: four trainings, their evaluations, the surgeries, the table)
    showed 3.6x the time it then took, its rate taken from the warm-up steps. The first estimate its worker writes
    once a tenth of the job's time has passed, against the time from that write to the job's end (wall clock, as the
    page shows it)."""
    root = tmp_path / "res"
    jid = jobs.submit(jobs.ExperimentSpec("e2", "smoke", (0, 1), ("parity", "chain"), "cpu"), root)
    submitted, seen = time.time(), []
    while (job := jobs.status(jid, root)).active:
        if not seen or job.updated != seen[-1].updated:
            seen.append(job)
        time.sleep(0.05)
    assert job.state == "done" and job.took_s() > 0, job.message
    first = next(j for j in seen if j.updated >= submitted + (job.ended - submitted) / 10 and j.eta_s is not None)
    left = job.ended - first.updated
    timeline = [(round(j.updated - submitted, 1), j.message, j.step, j.eta_s and round(j.eta_s, 1)) for j in seen]
    at, total = first.updated - submitted, job.ended - submitted
    print(f"\nat {at:.1f} s of {total:.1f}: estimated {first.eta_s:.1f} s left, took {left:.1f}")
    assert left / 1.5 <= first.eta_s <= left * 1.5, timeline


def test_a_corrupt_job_file_is_reported_not_raised(tmp_path):
    folder = jobs.jobs_dir(tmp_path)
    folder.mkdir()
    (folder / "0123456789abcdef.json").write_text('{"state": "runn')
    (folder / "fedcba9876543210.json").write_text('["not", "a", "job"]')
    found = jobs.list_jobs(tmp_path)
    assert [j.state for j in found] == ["corrupt", "corrupt"]
    assert all("is not a job file" in j.message for j in found)
    assert jobs.status("0123456789abcdef", tmp_path).state == "corrupt"
    assert jobs.cancel("0123456789abcdef", tmp_path).state == "corrupt"


def test_read_only_and_caps_are_refused_before_anything_starts(tmp_path, monkeypatch):
    spec = jobs.TrainSpec(short(smoke("parity"), 10), (0, 1), "cpu")
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "1")
    with pytest.raises(jobs.Refused, match="read-only"):
        jobs.submit(spec, tmp_path)
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY")
    monkeypatch.setenv("LOOPSCOPE_MAX_SEEDS", "1")
    with pytest.raises(jobs.Refused, match="LOOPSCOPE_MAX_SEEDS"):
        jobs.submit(spec, tmp_path)
    monkeypatch.setenv("LOOPSCOPE_MAX_STEPS", "100")
    with pytest.raises(jobs.Refused, match="LOOPSCOPE_MAX_STEPS"):
        jobs.submit(jobs.ExperimentSpec("e2", "smoke", (0,), ("parity",)), tmp_path)  # 300 steps
    with pytest.raises(ValueError, match="not a valid cached run"):
        jobs.submit(jobs.EvalSpec("0000000000000000", 12), tmp_path)
    assert not jobs.jobs_dir(tmp_path).exists()
    monkeypatch.delenv("LOOPSCOPE_MAX_SEEDS")
    monkeypatch.setenv("LOOPSCOPE_MAX_LOOPS", "")
    monkeypatch.delenv("LOOPSCOPE_MAX_LOOPS")  # recorded (unlike deleting an absent one): teardown undoes what follows
    jobs.adopt_settings({"read_only": True, "max_loops": 7})  # st.secrets' way in
    assert jobs.read_only() and jobs.caps()["max_loops"] == 7


# ---------------------------------------------------------------- evaluation jobs, in this process


@pytest.fixture(scope="module")
def small_results(tmp_path_factory):
    """One smoke run (30 steps) and an e2-style table holding it."""
    root = tmp_path_factory.mktemp("small") / "res"
    store = Store(root)
    keys = experiments.ensure_runs(short(smoke("parity"), 30), [0], store, "e2", "cpu", progress=False)
    store.write_table("e2-smoke", experiments.collect(store, keys, "e2"))
    return root


def published_files(root: Path) -> dict[str, bytes]:
    """Every file under root outside the workbench, by its path relative to root."""
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {name: path.read_bytes() for name, path in files.items() if not name.startswith(f"{jobs.WORKBENCH}/")}


def test_an_eval_job_extends_a_copy_of_the_run_and_its_tables_in_the_workbench(small_results, tmp_path):
    root = tmp_path / "res"
    shutil.copytree(small_results, root)
    published = published_files(root)
    key = short(smoke("parity"), 30).run_key(0)  # the table's run (its group partner is stored too)
    seen = []
    message = jobs.execute(jobs.EvalSpec(key, 12, "none", "cpu"), Store(root), lambda *a: seen.append(a[1:3]))
    assert "workbench/e2-smoke.parquet" in message and "unchanged" in message
    assert published_files(root) == published  # not a byte changed, not a file added outside the workbench
    bench = jobs.workbench(root)
    cut = bench.load_rows(key).query("boundary == 'norm->none'")
    assert cut["eval_loops"].max() == 12
    assert Store(root).load_rows(key).query("boundary == 'norm->none'").empty  # the published run: as it was
    table = pd.read_parquet(bench.root / "e2-smoke.parquet")  # the published table's rows of the run, and the new
    theirs = pd.read_parquet(root / "e2-smoke.parquet").query("run_key == @key")
    assert table.query("boundary == 'norm->none'")["eval_loops"].max() == 12 and set(table["run_key"]) == {key}
    pd.testing.assert_frame_equal(table.query("boundary != 'norm->none'").reset_index(drop=True), theirs)
    assert set(table["experiment"]) == {"e2"} and not table.duplicated(list(table.columns[:-1])).any()
    difficulties = len(smoke("parity").task.eval_difficulties)  # progress: one report per difficulty
    assert seen == [(d, difficulties) for d in range(1, difficulties + 1)]
    again = jobs.execute(jobs.EvalSpec(key, 14, "none", "cpu"), Store(root), lambda *a: None)  # the copy, extended
    assert "workbench/e2-smoke.parquet" in again and bench.load_rows(key)["eval_loops"].max() == 14
    assert len(bench.manifest(key)["rows_added"]) == 2 and published_files(root) == published


# ---------------------------------------------------------------- Ray


def test_a_ray_sweep_lands_in_the_same_store(tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'loopscope[ray]')")
    units = [(short(smoke("parity"), 20), [0], "train"), (short(smoke("chain"), 20), [0, 1], "train")]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        store = Store(tmp_path / "ray")
        assert fanout.fan_out(units, store, "cpu") == 2  # one group (seeds 0, 1) per config
        assert fanout.fan_out(units, store, "cpu") == 0  # cached: nothing to fan out
    finally:
        ray.shutdown()
    keys = [cfg.run_key(s) for cfg, _, _ in units for s in cfg.group(0)]
    assert sorted(keys) == store.run_keys() and all(store.status(k) == "ok" for k in keys)
    local = Store(tmp_path / "local")
    experiments.ensure_runs(units[1][0], [1], local, "train", "cpu", progress=False)
    key = units[1][0].run_key(1)
    a, b = store.load_weights(key), local.load_weights(key)
    assert all(torch.equal(a[k], b[k]) for k in a)  # a Ray task trains exactly what this process would
    pd.testing.assert_frame_equal(store.load_rows(key), local.load_rows(key))


# ---------------------------------------------------------------- push and pull (the Hub mocked)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """HfApi.create_repo/upload_folder and snapshot_download against a folder standing in for the repo."""
    remote = tmp_path / "hub"

    def upload_folder(self, *, folder_path, repo_id, repo_type, **kw):
        assert (repo_id, repo_type) == ("org/results", "dataset")
        shutil.copytree(folder_path, remote, dirs_exist_ok=True)

    def snapshot_download(*, repo_id, repo_type, local_dir, ignore_patterns=(), **kw):
        assert (repo_id, repo_type) == ("org/results", "dataset")
        for path in remote.rglob("*"):
            rel = path.relative_to(remote).as_posix()
            if path.is_file() and not any(fnmatch.fnmatch(rel, p) for p in ignore_patterns):
                (Path(local_dir) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, Path(local_dir) / rel)
        return local_dir

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, *a, **k: None)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return remote


def test_push_then_pull_gives_a_results_folder_the_dashboard_reads(small_results, fake_hub, tmp_path, capsys):
    (small_results / "jobs").mkdir(exist_ok=True)
    (small_results / "jobs" / "local.json").write_text("{}")
    assert main(["push", "--repo", "org/results", "--results", str(small_results)]) == 0
    pushed = sorted(p.relative_to(fake_hub).as_posix() for p in fake_hub.rglob("*") if p.is_file())
    assert "e2-smoke.parquet" in pushed and not [p for p in pushed if p.endswith(".safetensors") or "jobs" in p]

    pulled = tmp_path / "pulled"
    assert main(["pull", "--repo", "org/results", "--results", str(pulled)]) == 0
    assert "loopscope dashboard --results" in capsys.readouterr().out
    store = Store(pulled)
    key = store.run_keys()[0]
    assert store.status(key) == "ok"  # verifies, so the dashboard lists it, weights or not
    assert [n for n in store.manifest(key)["files_not_included"] if n.startswith("model-")]
    assert (pulled / "e2-smoke.parquet").read_bytes() == (small_results / "e2-smoke.parquet").read_bytes()
    pd.testing.assert_frame_equal(store.load_rows(key), Store(small_results).load_rows(key))

    assert main(["push", "--repo", "org/results", "--results", str(small_results), "--checkpoints"]) == 0
    assert main(["pull", "--repo", "org/results", "--results", str(pulled), "--checkpoints"]) == 0
    assert Store(pulled).status(key) == "ok"
    assert Store(pulled).load_weights(key).keys() == Store(small_results).load_weights(key).keys()


def test_push_leaves_weights_home_unless_asked_but_measurements_travel(tmp_path):
    """A run's and a refit's weights go only with --checkpoints; what is measured beside them (E5's rescale
    scalars, scales-<sha>.safetensors) always goes: without it a pulled copy could not rerun the surgery."""
    from engine.runtime import share

    sha = "0123456789ab"
    kept = [f"runs/k/scales-{sha}.safetensors", f"runs/k/rows-{sha}.parquet", "e2-cpu.parquet", "verdicts.json"]
    names = [
        *kept,
        f"runs/k/model-{sha}.safetensors",
        "runs/old/model.safetensors",
        f"refits/r/refit-{sha}.safetensors",
    ]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    without = {p.as_posix() for p in share.files_to_push(tmp_path, checkpoints=False)}
    assert without == set(kept)
    assert {p.as_posix() for p in share.files_to_push(tmp_path, checkpoints=True)} == set(names)


@pytest.mark.parametrize("command", ["push", "pull"])
def test_offline_push_and_pull_end_in_one_sentence(small_results, tmp_path, monkeypatch, capsys, command):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the real client, no traffic
    results = small_results if command == "push" else tmp_path / "pulled"
    assert main([command, "--repo", "org/results", "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("loopscope: error: cannot reach the Hugging Face Hub") and len(err.splitlines()) == 1


@pytest.mark.parametrize("experiment", ["e2", "e3", "e4"])
def test_the_fan_out_trains_what_the_experiment_would(experiment, monkeypatch, tmp_path):
    """The Ray fan-out reads the same list of trainings that the experiment's run() goes through."""
    import pandas as pd

    from engine.experiments import REGISTRY

    module, trained = REGISTRY[experiment], []

    def record(cfg, seeds, store, label, *a, **k):
        trained.append((cfg, label))
        return []

    monkeypatch.setattr(experiments, "ensure_runs", record)
    monkeypatch.setattr(experiments, "ensure_surgery", lambda *a, **k: None)
    monkeypatch.setattr(experiments, "collect", lambda *a, **k: pd.DataFrame())
    if experiment == "e3":
        monkeypatch.setattr(module, "refit_runs", lambda run, *a, **k: record(run, [], None, "e2") or pd.DataFrame())

    class NoTables:
        root = tmp_path  # an empty folder: no study here yet, so no precision to keep

        def write_table(self, name, rows):
            pass

    module.run("smoke", [0, 1], NoTables(), tasks=("parity", "chain"), progress=False)
    units = fanout.experiment_units(experiment, "smoke", ("parity", "chain"))
    assert trained == units and len(units) == {"e2": 4, "e3": 2, "e4": 6}[experiment]


def test_workers_end_when_the_command_that_started_them_is_killed(tmp_path):
    """`kill -9` of a `--workers` command leaves no worker training (and holding its group's lock)."""
    script = (
        "import sys, time\n"
        "from engine.runtime.fanout import local_pool\n"
        "with local_pool(2) as pool:\n"
        "    futures = [pool.submit(time.sleep, 120) for _ in range(2)]\n"
        "    time.sleep(1)\n"
        "    print(*pool._processes, flush=True)\n"
        "    time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"

    assert all(alive(pid) for pid in workers)
    parent.kill()
    parent.wait()
    wait_for(lambda: not any(alive(pid) for pid in workers), 20, "the workers to end")
