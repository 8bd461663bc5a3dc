"""Streamlit Community Cloud's entry point: the dashboard (dashboard/app.py) on the results in the repository.

A hosted copy is read-only unless its secrets say otherwise (`read_only = false`, or LOOPSCOPE_READ_ONLY=0);
`results` in the secrets picks another results folder (a `loopscope pull` copy, for instance).
"""

import os
import runpy
from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent


def secret(name: str):
    try:
        return st.secrets[name]
    except Exception:  # no secrets file, or not set
        return None


if secret("read_only") is None and not os.environ.get("LOOPSCOPE_READ_ONLY", "").strip():
    os.environ["LOOPSCOPE_READ_ONLY"] = "1"  # unset or empty: a hosted copy shows results, it runs nothing
os.environ.setdefault("LOOPSCOPE_RESULTS", str(secret("results") or HERE / "cached_results"))
runpy.run_path(str(HERE / "dashboard" / "app.py"), run_name="__main__")
