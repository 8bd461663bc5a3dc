"""The results store: one folder per run, written atomically, checked before every read.

    <root>/runs/<run_key>/model.safetensors   the trained weights of one seed
    <root>/runs/<run_key>/rows.parquet        its tidy evaluation rows (RESULT_COLUMNS)
    <root>/runs/<run_key>/manifest.json       config, provenance and the files' sha256
    <root>/<experiment>.parquet               one table per experiment, assembled from runs

Every file is written to a temporary name and renamed into place; the manifest goes last, so a
run without a manifest that matches its files is not a run. A checksum mismatch is reported and
the run is redone; a corrupt file is never loaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

RESULT_COLUMNS = [
    "experiment", "run_key", "task", "arch", "boundary", "seed",
    "trained_loops", "eval_loops", "difficulty", "metric", "value",
]  # fmt: skip
ROW_KEY = [c for c in RESULT_COLUMNS if c != "value"]
MODEL, ROWS, MANIFEST = "model.safetensors", "rows.parquet", "manifest.json"
REPO = Path(__file__).resolve().parents[1]


class CorruptRun(Exception):
    """A run folder whose files do not match its manifest."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def provenance(device: str) -> dict:
    """Where and with what a result was produced."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=5,
            ).stdout.strip()
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    import numpy
    import safetensors

    if device.startswith("cuda") and torch.cuda.is_available():
        device_name = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        device_name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {
        "git_commit": commit or "unknown",
        "git_dirty": dirty,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "pandas": pd.__version__,
            "safetensors": safetensors.__version__,
        },
        "device": device_name,
        "host": platform.node(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@dataclass
class Store:
    root: Path

    def __post_init__(self):
        self.root = Path(self.root)

    # -- layout
    def run_dir(self, key: str) -> Path:
        return self.root / "runs" / key

    def run_keys(self) -> list[str]:
        runs = self.root / "runs"
        return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []

    def check_writable(self) -> None:
        """Raise PermissionError with a sentence if results cannot be written under root."""
        probe_dir = self.root
        while not probe_dir.exists():
            probe_dir = probe_dir.parent
        if not probe_dir.is_dir() or not os.access(probe_dir, os.W_OK | os.X_OK):
            raise PermissionError(
                f"cannot write results under {self.root} ({probe_dir} is not a writable folder); "
                "pass --results DIR with a folder you can write, or fix its permissions."
            )

    # -- reading, always verified
    def manifest(self, key: str) -> dict:
        path = self.run_dir(key) / MANIFEST
        try:
            return json.loads(path.read_text())
        except FileNotFoundError as e:
            raise CorruptRun(f"run {key}: no manifest (an interrupted write?)") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptRun(f"run {key}: manifest.json is not valid JSON") from e

    def _read_verified(self, key: str, name: str) -> bytes:
        files = self.manifest(key).get("files", {})
        if name not in files:
            raise CorruptRun(f"run {key}: the manifest lists no {name}")
        try:
            data = (self.run_dir(key) / name).read_bytes()
        except FileNotFoundError as e:
            raise CorruptRun(f"run {key}: {name} is missing") from e
        if sha256(data) != files[name]:
            raise CorruptRun(f"run {key}: {name} does not match its checksum (truncated or corrupt)")
        return data

    def status(self, key: str) -> str:
        """'ok', 'missing', or a sentence saying what is wrong."""
        if not self.run_dir(key).exists():
            return "missing"
        try:
            for name in self.manifest(key).get("files", {}):
                self._read_verified(key, name)
        except CorruptRun as e:
            return str(e)
        return "ok"

    def load_checkpoint(self, key: str) -> dict[str, torch.Tensor]:
        return load_safetensors(self._read_verified(key, MODEL))

    def load_rows(self, key: str) -> pd.DataFrame:
        return pd.read_parquet(io.BytesIO(self._read_verified(key, ROWS)))

    # -- writing, atomically, manifest last
    def save_run(self, key: str, manifest: dict, state: dict[str, torch.Tensor], rows: pd.DataFrame) -> None:
        folder = self.run_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).unlink(missing_ok=True)  # not a run until the new manifest lands
        model_bytes = save_safetensors(state)
        rows_bytes = parquet_bytes(rows[RESULT_COLUMNS])
        atomic_write(folder / MODEL, model_bytes)
        atomic_write(folder / ROWS, rows_bytes)
        manifest = dict(manifest, run_key=key, files={MODEL: sha256(model_bytes), ROWS: sha256(rows_bytes)})
        atomic_write(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())

    def add_rows(self, key: str, rows: pd.DataFrame) -> pd.DataFrame:
        """Merge new rows into a run's table (a new value replaces the old one); returns the merged table."""
        manifest = self.manifest(key)
        merged = pd.concat([self.load_rows(key), rows[RESULT_COLUMNS]], ignore_index=True)
        merged = merged.drop_duplicates(ROW_KEY, keep="last").reset_index(drop=True)
        data = parquet_bytes(merged)
        atomic_write(self.run_dir(key) / ROWS, data)
        manifest["files"][ROWS] = sha256(data)
        atomic_write(self.run_dir(key) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
        return merged

    def write_table(self, experiment: str, rows: pd.DataFrame) -> Path:
        path = self.root / f"{experiment}.parquet"
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write(path, parquet_bytes(rows.reset_index(drop=True)))
        return path

    def read_table(self, experiment: str) -> pd.DataFrame | None:
        path = self.root / f"{experiment}.parquet"
        return pd.read_parquet(path) if path.exists() else None
