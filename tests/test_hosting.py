"""Safe to host (issue 33): `loopscope dashboard` listens on 127.0.0.1 unless told otherwise, is read-only beyond
localhost unless a second flag allows jobs, serves no /_stcore/metrics and leaves no zombie; a read-only page shows
no server path, traceback or log; the compare box reads only under its roots; the Run form lives in the URL and a
lost job resumes from its own spec."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from dashboard.serve import wait_until_healthy
from engine.cli import build_parser, dashboard_env, main
from engine.core.presets import smoke
from engine.errors import UsageError
from engine.runtime import jobs

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "dashboard" / "app.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) listening on port."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                found.append(local.rsplit(":", 1)[0])
    return found


def children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command) of pid's child processes."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append((int(stat.parent.name), fields[0], cmdline))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc (Linux)")
def test_the_dashboard_listens_on_localhost_serves_no_metrics_and_reaps_its_warm_up(tmp_path):
    port = free_port()
    env = dict(os.environ, LOOPSCOPE_CACHE=str(tmp_path / "cache"), LOOPSCOPE_READ_ONLY="")
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (closed below)
    command = [sys.executable, "-m", "engine", "dashboard", "--port", str(port), "--results", str(tmp_path / "r")]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        up = wait_until_healthy(f"http://127.0.0.1:{port}", lambda: proc.poll() is None, 60)
        assert up, (tmp_path / "server.log").read_text()
        assert set(listening(port)) == {"0100007F"}, listening(port)  # 127.0.0.1 only, no other interface
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/metrics", timeout=5).read().decode()
        assert "cache_memory_bytes" not in body and "# TYPE" not in body  # no metrics: the page shell at most
        deadline = time.monotonic() + 60  # the verdicts' warm-up ends within seconds on an empty folder
        while any("dashboard.results" in cmd and state != "Z" for _, state, cmd in children(proc.pid)):
            assert time.monotonic() < deadline, children(proc.pid)
            time.sleep(0.2)
        time.sleep(0.5)
        assert not [c for c in children(proc.pid) if c[1] == "Z"], children(proc.pid)  # reaped, no zombie
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
        log.close()
    assert "Network URL" not in (tmp_path / "server.log").read_text()


def env_for(*argv: str) -> dict[str, str]:
    return dashboard_env(build_parser().parse_args(["dashboard", *argv]))


def test_serving_beyond_localhost_needs_a_flag_and_jobs_need_a_second(monkeypatch, capsys):
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    assert not env_for().get("LOOPSCOPE_READ_ONLY")  # 127.0.0.1: writable, for this machine only
    assert build_parser().parse_args(["dashboard"]).host == "127.0.0.1"
    assert env_for("--host", "0.0.0.0")["LOOPSCOPE_READ_ONLY"] == "1"  # beyond localhost: read-only
    assert "read-only" in capsys.readouterr().err
    allowed = env_for("--host", "0.0.0.0", "--allow-remote-jobs")
    assert allowed["LOOPSCOPE_REMOTE_JOBS"] == "1" and not allowed.get("LOOPSCOPE_READ_ONLY")
    with pytest.raises(UsageError, match="is for a server beyond localhost"):
        env_for("--allow-remote-jobs")
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "0")  # writable asked, but no second flag: refused, not guessed
    assert main(["dashboard", "--host", "0.0.0.0"]) == 2
    assert "add --allow-remote-jobs" in capsys.readouterr().err


@pytest.fixture
def address(monkeypatch):
    """Set Streamlit's server.address for an AppTest run (as a server started with it would have)."""
    before = st_config.get_option("server.address")
    yield lambda value: st_config.set_option("server.address", value)
    st_config.set_option("server.address", before)


def test_the_app_itself_is_read_only_beyond_localhost_unless_jobs_are_allowed(monkeypatch, tmp_path, address):
    """`streamlit run dashboard/app.py --server.address 0.0.0.0`, without loopscope: still read-only."""
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(tmp_path))
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)  # recorded: teardown removes what the app sets
    monkeypatch.delenv("LOOPSCOPE_REMOTE_JOBS", raising=False)
    address("0.0.0.0")
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("app_pages/run.py").run()
    assert "Read-only" in at.info[0].value and not [b for b in at.button if b.key == "submit"]
    assert any("every network interface" in c.value or "0.0.0.0" in c.value for c in at.sidebar.caption)
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY")
    monkeypatch.setenv("LOOPSCOPE_REMOTE_JOBS", "1")
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("app_pages/run.py").run()
    assert [b for b in at.button if b.key == "submit"]
    address("127.0.0.1")
    monkeypatch.delenv("LOOPSCOPE_REMOTE_JOBS")
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("app_pages/run.py").run()
    assert [b for b in at.button if b.key == "submit"]


def short_spec(steps: int = 5) -> jobs.TrainSpec:
    cfg = smoke("parity")
    return jobs.TrainSpec(replace(cfg, train=replace(cfg.train, steps=steps)), (0,), "cpu")


def dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def write_job(root: Path, spec, state: str, message: str, log: str = "") -> str:
    jid = jobs.job_id(spec)
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    record = {"job_id": jid, "state": state, "what": jobs.describe(spec), "spec": jobs.spec_dict(spec),
              "message": message, "pid": dead_pid(), "host": "", "launches": 1, "updated": 1.0}  # fmt: skip
    (root / "jobs" / f"{jid}.json").write_text(json.dumps(record))
    (root / "jobs" / f"{jid}.log").write_text(log)
    return jid


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "code", "info", "error", "warning", "success", "title")
             for e in getattr(at, kind)]  # fmt: skip
    parts += [e.value for e in at.sidebar.caption]
    return "\n".join(str(p) for p in parts)


def test_a_read_only_copy_shows_no_server_path_traceback_or_log(monkeypatch, tmp_path):
    root = tmp_path / "srv" / "results"
    root.mkdir(parents=True)
    traceback = f'Traceback (most recent call last):\n  File "{sys.prefix}/lib/x.py", line 1\nOSError: boom'
    write_job(root, short_spec(), "failed", f"failed: OSError: [Errno 28] No space left: '{root}/runs/x'", traceback)
    write_job(root, short_spec(6), "running", "step 3")  # its worker is gone: lost
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "1")
    for page in ("overview", "runs", "run"):
        at = AppTest.from_file(APP, default_timeout=60).run()
        if page != "overview":
            at.switch_page(f"app_pages/{page}.py").run()
        assert not at.exception
        shown = texts(at)
        assert str(tmp_path) not in shown and sys.prefix not in shown and "Traceback" not in shown, shown
        assert not at.code or page != "run" or all("Traceback" not in c.value for c in at.code)
    assert "No space left" in shown and "…/x" in shown  # the short reason stays, its path cut to its last part
    from dashboard import report

    shutil.copy(REPO / "cached_results" / "e2-cpu.parquet", root / "e2-cpu.parquet")
    page = report.html_bytes().decode()  # the overview's "Download report"
    assert str(tmp_path) not in page and "Static report of <code>results</code>" in page
    assert not [b for b in at.button if b.key.startswith(("resume-", "cancel-"))]
    assert st_config.get_option("client.showErrorDetails") == "type"  # an uncaught error: its type, no traceback
    st_config.set_option("client.showErrorDetails", "full")


def test_a_lost_job_resumes_from_its_own_spec_with_one_click(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(tmp_path))
    spec = short_spec()
    jid = write_job(tmp_path, spec, "running", "step 3")
    assert jobs.status(jid, tmp_path).state == "lost"
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("app_pages/run.py").run()
    assert "Resume" in jobs.status(jid, tmp_path).message
    at.button(key=f"resume-{jid}").click().run()
    done = jobs.wait(jid, tmp_path, timeout_s=120)
    assert done.state == "done" and done.launches == 2 and jobs.spec_from_dict(done.spec) == spec, done.message


def test_the_run_form_is_restored_from_the_url(monkeypatch, tmp_path):
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(run_task="chain", run_boundary="none", run_steps="77", run_seeds="2-3", run_loops="5")
    at.switch_page("app_pages/run.py").run()
    assert at.selectbox(key="run_task").value == "chain" and at.selectbox(key="run_boundary").value == "none"
    assert at.number_input(key="run_steps").value == 77 and at.number_input(key="run_loops").value == 5
    assert at.text_input(key="run_seeds").value == "2-3"
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(run_kind="E3", run_preset="smoke", run_tasks=["chain"])
    at.switch_page("app_pages/run.py").run()
    assert at.get("button_group")[0].value == "E3" and "smoke preset" in texts(at)


def test_the_run_form_offers_the_gpu_presets_only_what_they_define(monkeypatch, tmp_path):
    """The GPU study's presets define parity alone and run as pieces on a GPU machine: the train form offers them
    with parity only (a chain in the URL falls back), the experiment form does not offer them."""
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(run_preset="gpu-smoke", run_task="chain")
    at.switch_page("app_pages/run.py").run()
    assert not at.exception and at.selectbox(key="run_preset").value == "gpu-smoke"
    assert at.selectbox(key="run_task").options == ["parity"] and at.selectbox(key="run_task").value == "parity"
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(run_kind="E2")
    at.switch_page("app_pages/run.py").run()
    assert not at.exception and "gpu" not in at.selectbox(key="run_preset").options


def test_the_compare_box_reads_only_under_its_roots(monkeypatch, tmp_path):
    from dashboard import data

    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    for folder in (home / "results", home / "pulled", elsewhere / "secret"):
        folder.mkdir(parents=True)
    (home / "link").symlink_to(elsewhere / "secret")
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(home / "results"))
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    monkeypatch.delenv("LOOPSCOPE_COMPARE_ROOTS", raising=False)
    assert data.compare_folder(str(home / "pulled")) == home / "pulled"  # under the results folder's parent
    for typed in (str(elsewhere / "secret"), str(home / "link"), str(home / "results" / ".." / ".." / "elsewhere"),
                  "/etc", "~"):  # fmt: skip
        assert data.compare_folder(typed) is None, typed
    monkeypatch.setenv("LOOPSCOPE_COMPARE_ROOTS", str(elsewhere))
    assert data.compare_folder(str(elsewhere / "secret")) == elsewhere / "secret"
    assert data.compare_folder(str(home / "pulled")) is None
    shutil.rmtree(home / "pulled")
