"""Ruff lint and format are part of the test run."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    ruff = str(Path(sys.executable).parent / "ruff")
    ruff = ruff if Path(ruff).exists() else shutil.which("ruff")
    proc = subprocess.run([ruff, *command], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
