"""Reading the results store for the dashboard: cached, keyed on the files' state, never raising."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import streamlit as st

from engine.store import Store


def results_root() -> Path:
    return Path(os.environ.get("LOOPSCOPE_RESULTS", "cached_results"))


def files_state(root: Path) -> tuple:
    """(path, size, mtime) of every file under root: the cache key that changes when results do."""
    if not root.is_dir():
        return ()
    return tuple(sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()))


@st.cache_data(max_entries=8, show_spinner=False)
def _runs(root: str, _state: tuple) -> tuple[pd.DataFrame, list[str]]:
    store, records, problems = Store(Path(root)), [], []
    for key in store.run_keys():
        status = store.status(key)
        if status != "ok":
            problems.append(status)
            continue
        m = store.manifest(key)
        cfg = m["config"]
        records.append(
            {
                "run_key": key,
                "task": cfg["task"]["name"],
                "arch": "looped" if cfg["model"]["tied"] else "stacked",
                "trained boundary": cfg["model"]["boundary"],
                "T": cfg["model"]["trained_loops"],
                "seed": m["seed"],
                "steps": m["steps"],
                "final loss": m["final_loss"],
                "wall (s)": m["wall_time_s"],
                "device": m["device"],
                "commit": m["git_commit"][:10],
                "created": m["created"],
            }
        )
    return pd.DataFrame(records), problems


def runs() -> tuple[pd.DataFrame, list[str]]:
    """Every valid cached run, and a sentence for each run that could not be read."""
    root = results_root()
    return _runs(str(root), files_state(root / "runs"))
