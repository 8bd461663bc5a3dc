"""Input handling fails closed: run keys that are paths, unwritable results folders, numbers past the caps,
unclear read-only settings and a worker entry started by hand all end in one sentence, exit 2 and nothing
written; and finished workers leave no zombie process behind."""

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine import cli
from engine.core.presets import smoke
from engine.core.store import Store
from engine.experiments import runs as experiments
from engine.runtime import jobs

REPO = Path(__file__).resolve().parents[1]
KEY = "0123456789abcdef"  # well formed, names no run


def tiny(task: str):
    cfg = smoke(task)
    return replace(cfg, train=replace(cfg.train, steps=5))


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under folder with its size and mtime: equal before and after means nothing was written."""
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def refused(capsys, argv: list[str], phrase: str, watch: Path) -> str:
    """Run the CLI; assert exit 2, one line on stderr holding phrase, no traceback, nothing written under watch."""
    before = files_under(watch)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("loopscope: error:") and len(err.strip().splitlines()) == 1, err
    assert phrase in err and "Traceback" not in err, err
    assert files_under(watch) == before
    return err.strip()


@pytest.fixture(scope="module")
def two_configs(tmp_path_factory) -> tuple[Path, str, str]:
    """Two 5-step smoke runs with different configs (parity, chain), under one results folder."""
    root = tmp_path_factory.mktemp("two") / "res"
    (a,) = experiments.ensure_runs(tiny("parity"), [0], Store(root), "train", "cpu", progress=False)
    (b,) = experiments.ensure_runs(tiny("chain"), [0], Store(root), "train", "cpu", progress=False)
    return root, a, b


@pytest.fixture
def writable(monkeypatch):
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers these tests start


# ---------------------------------------------------------------- 1. run keys are not paths


@pytest.mark.parametrize("key", ["../../other/runs/" + KEY, "..", KEY.upper(), KEY + "0", "/etc/passwd"])
def test_a_run_key_that_is_a_path_is_refused(tmp_path, capsys, key):
    res = tmp_path / "res"
    (res / "runs").mkdir(parents=True)
    refused(capsys, ["eval", key, "--results", str(res)], "is not a run key (16 hex digits)", tmp_path)
    with pytest.raises(ValueError, match="is not a run key"):
        jobs.submit(jobs.EvalSpec(key, 12), res)
    assert not jobs.jobs_dir(res).exists()


def test_a_run_folder_linked_out_of_the_results_is_refused(two_configs, tmp_path, capsys):
    """A well-formed key whose folder is a symbolic link to a run elsewhere: neither read nor rewritten."""
    other, key, _ = two_configs
    res = tmp_path / "res"
    (res / "runs").mkdir(parents=True)
    (res / "runs" / key).symlink_to(other / "runs" / key)
    before = files_under(other)
    refused(capsys, ["eval", key, "--results", str(res)], "leads outside", tmp_path)
    with pytest.raises(ValueError, match="leads outside"):
        jobs.submit(jobs.EvalSpec(key, 12), res)
    assert files_under(other) == before and not jobs.jobs_dir(res).exists()


# ---------------------------------------------------------------- 2. the results folder is probed by a write


def test_results_under_proc_are_refused_even_as_root(tmp_path, capsys):
    if not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    refused(
        capsys, ["train", "--preset", "smoke", "--results", "/proc/x"], "cannot write results under /proc/x", tmp_path
    )


def test_a_failed_probe_leaves_no_half_made_folders(tmp_path, capsys):
    res = tmp_path / "new" / "deeper" / ("x" * 300)  # the first two folders can be made, the last cannot
    refused(capsys, ["train", "--preset", "smoke", "--results", str(res)], "cannot write results under", tmp_path)
    assert not (tmp_path / "new").exists()


def test_a_successful_probe_leaves_nothing_either(tmp_path):
    Store(tmp_path / "new" / "res").check_writable()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 3. numbers past the caps


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["eval", KEY, "--loops", "1-100000"], f"goes past {cli.MAX_LOOPS}, the largest loop count"),
        (["eval", KEY, "--loops", "9" * 5000], f"goes past {cli.MAX_LOOPS}"),
        (["eval", KEY, "--loops", "\u0661-\u0663"], "cannot read --loops"),  # Arabic-Indic digits
        (["train", "--preset", "smoke", "--seeds", "99999999999999999999"], f"more than {cli.MAX_SEEDS} seeds"),
        (["train", "--preset", "smoke", "--seeds", "0,99999999999"], f"goes past {cli.MAX_SEED}, the largest seed"),
        (["train", "--preset", "smoke", "--seeds", "0-2000000000"], f"names more than {cli.MAX_SEEDS} seeds"),
        (["train", "--preset", "smoke", "--seeds", "0-1000,2000-2100"], f"names more than {cli.MAX_SEEDS} seeds"),
        (["train", "--preset", "smoke", "--seeds", "\u0661\u0662"], "cannot read --seeds"),
        (["train", "--preset", "smoke", "--seeds", "\uff11"], "cannot read --seeds"),  # a full-width 1
        (["run", "e2", "--preset", "smoke", "--workers", "100000"], "--workers must be at least 1 and at most"),
        (["dashboard", "--port", "99999999"], "is not a TCP port; pick one from 1 to 65535"),
        (["dashboard", "--port", "0"], "is not a TCP port"),
        (["push", "--repo", "../.."], "is not a Hugging Face repo id"),
    ],
)
def test_numbers_past_the_caps_are_refused(tmp_path, capsys, argv, phrase):
    refused(capsys, [*argv, "--results", str(tmp_path / "res")], phrase, tmp_path)


def test_runs_with_different_configs_are_refused_before_loading(two_configs, capsys):
    root, a, b = two_configs
    refused(capsys, ["eval", a, b, "--results", str(root)], f"runs {a} and {b} have different configs", root)


def test_the_caps_leave_room_for_what_the_readme_does():
    assert cli.parse_seeds("16") == list(range(16)) and cli.parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
    assert cli.parse_seeds(str(cli.MAX_SEEDS)) == list(range(cli.MAX_SEEDS))
    assert cli.parse_loops("1-24") == list(range(1, 25)) and cli.parse_loops(f"{cli.MAX_LOOPS}") == [cli.MAX_LOOPS]


# ---------------------------------------------------------------- 4. read-only fails closed


@pytest.mark.parametrize("value, setting", [("1", True), (" ON ", True), ("False", False), ("off", False), ("", None)])
def test_clear_read_only_spellings(monkeypatch, value, setting):
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", value)
    assert jobs.read_only_setting() is setting and jobs.read_only() is bool(setting)


@pytest.mark.parametrize("value", ["enabled", "2", "y", "tru"])
def test_an_unclear_read_only_setting_is_read_only_and_says_so(tmp_path, monkeypatch, value):
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", value)
    assert jobs.read_only()
    with pytest.raises(jobs.Refused, match=f"LOOPSCOPE_READ_ONLY='{value}' is neither yes"):
        jobs.read_only_setting()
    with pytest.raises(jobs.Refused, match="stays read-only"):
        jobs.submit(jobs.TrainSpec(tiny("parity"), (0,), "cpu"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_variable_does_not_override_the_secrets(monkeypatch):
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "")
    monkeypatch.setenv("LOOPSCOPE_MAX_LOOPS", " ")
    jobs.adopt_settings({"read_only": True, "max_loops": 7})
    assert jobs.read_only() and jobs.caps()["max_loops"] == 7
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "0")  # a variable that is set still wins
    jobs.adopt_settings({"read_only": True})
    assert not jobs.read_only()


def test_a_cap_that_is_not_a_number_refuses(tmp_path, monkeypatch, writable):
    monkeypatch.setenv("LOOPSCOPE_MAX_SEEDS", "lots")
    with pytest.raises(jobs.Refused, match="LOOPSCOPE_MAX_SEEDS='lots' is not a whole number"):
        jobs.submit(jobs.TrainSpec(tiny("parity"), (0,), "cpu"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def running_job(root: Path, pid: int) -> tuple[str, bytes]:
    """A job file that says a worker (pid) is running it, as submit writes it."""
    spec = jobs.TrainSpec(tiny("parity"), (0,), "cpu")
    jid = jobs.job_id(spec)
    record = {"state": "running", "spec": jobs.spec_dict(spec), "pid": pid, "host": "", "job_id": jid}
    jobs._write(root, record)
    return jid, jobs.job_file(root, jid).read_bytes()


@pytest.mark.parametrize("value", ["1", "enabled"])
def test_a_read_only_copy_cancels_nothing(tmp_path, monkeypatch, writable, value):
    jobs.jobs_dir(tmp_path).mkdir()
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        jid, before = running_job(tmp_path, sleeper.pid)
        monkeypatch.setenv("LOOPSCOPE_READ_ONLY", value)
        with pytest.raises(jobs.Refused, match="read-only"):
            jobs.cancel(jid, tmp_path)
        assert sleeper.poll() is None and jobs.job_file(tmp_path, jid).read_bytes() == before
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(
    "env, jid, phrase",
    [
        ({"LOOPSCOPE_READ_ONLY": "1"}, None, "is read-only"),
        ({"LOOPSCOPE_READ_ONLY": "enabled"}, None, "is neither yes"),
        ({}, "../../etc/passwd", "is not a job id"),
        ({}, KEY, f"no job {KEY}"),
    ],
)
@pytest.mark.slow
def test_the_worker_entry_refuses_in_one_line(tmp_path, writable, env, jid, phrase):
    jobs.jobs_dir(tmp_path).mkdir()
    own, _ = running_job(tmp_path, os.getpid())
    before = files_under(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "engine.runtime.jobs", str(tmp_path), jid or own],
        env={k: v for k, v in os.environ.items() if k != "LOOPSCOPE_READ_ONLY"} | env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2 and phrase in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert files_under(tmp_path) == before


def test_the_dashboard_shows_an_unclear_setting_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "enabled")
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(tmp_path))
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=60).run()
    at.switch_page("app_pages/run.py").run()
    assert not at.exception
    assert any("LOOPSCOPE_READ_ONLY='enabled' is neither yes" in e.value for e in at.error)
    assert "Read-only" in at.info[0].value and not [b for b in at.button if b.key == "submit"]


# ---------------------------------------------------------------- 5. no zombie workers


def children_of(pid: int) -> dict[int, str]:
    """pid's child processes and their states (R, S, Z, ...), from /proc/*/stat."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = fields[0]
    return found


@pytest.mark.slow
def test_a_finished_worker_is_reaped(tmp_path, writable):
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc here")
    jid = jobs.submit(jobs.TrainSpec(tiny("parity"), (0,), "cpu"), tmp_path)
    worker = jobs.status(jid, tmp_path).pid
    done = jobs.wait(jid, tmp_path, timeout_s=120)
    assert done.state == "done", done.message
    deadline = time.monotonic() + 30  # the job file says done a moment before the process ends
    while worker in children_of(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker not in children_of(os.getpid()), "the finished worker is still a child (a zombie)"
    assert "Z" not in children_of(os.getpid()).values()
