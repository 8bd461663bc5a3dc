"""The hosting files (no Docker daemon here, so the image itself is not built in the tests): every path the
Dockerfile copies or runs exists, and its CMD, run as written from a copy laid out as the image is, passes
the image's health check. (What LOOPSCOPE_READ_ONLY=1 refuses is tested with the Run page.)"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    text = DOCKERFILE.replace("\\\n", " ")
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", text, flags=re.MULTILINE)]


def test_dockerfile_names_what_a_space_needs():
    assert instructions("FROM") == ["python:3.11-slim"]
    assert instructions("USER") == ["user"] and "--uid 1000" in instructions("RUN")[0]  # non-root, as Spaces run
    assert instructions("EXPOSE") == ["8501"]
    (health,) = instructions("HEALTHCHECK")
    assert "http://localhost:8501/_stcore/health" in health
    for copy in instructions("COPY"):
        sources = [s for s in copy.split()[:-1] if not s.startswith("--")]
        assert all((ROOT / s).exists() for s in sources), copy
    cmd = instructions("CMD")[0]
    assert "dashboard.serve" in cmd and (ROOT / "dashboard" / "serve.py").exists() and "--server.port=8501" in cmd
    assert "LOOPSCOPE_READ_ONLY=1" in " ".join(instructions("ENV"))


@pytest.mark.slow
def test_the_cmd_serves_a_healthy_read_only_dashboard(tmp_path):
    app = tmp_path / "app"  # the image's working directory: what the Dockerfile copies
    for name in ("engine", "dashboard", ".streamlit"):
        shutil.copytree(ROOT / name, app / name, ignore=shutil.ignore_patterns("__pycache__"))
    (app / "cached_results").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = json.loads(instructions("CMD")[0])  # the exec form is a JSON list of strings
    cmd = [sys.executable, *cmd[1:]] if cmd[0] == "python3" else cmd  # the image's python, here this one
    cmd = [c.replace("8501", str(port)).replace("0.0.0.0", "127.0.0.1") for c in cmd]
    env = dict(os.environ, LOOPSCOPE_READ_ONLY="1", LOOPSCOPE_RESULTS=str(app / "cached_results"))
    env["PYTHONPATH"] = str(app)
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(cmd + ["--browser.gatherUsageStats", "false"], cwd=app, env=env, stdout=log, stderr=log)
    try:
        deadline, ok = time.time() + 90, False
        while time.time() < deadline and not ok:
            try:
                ok = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok"
            except OSError:
                time.sleep(0.5)
        assert ok, (tmp_path / "server.log").read_text()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/metrics", timeout=5).read()
        assert b"# TYPE" not in metrics  # dashboard.serve dropped Streamlit's metrics route (issue 33)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
