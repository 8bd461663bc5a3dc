"""The Runs page and the Run page as a reader finds them (issue 60, items 4, 6 and 7): every run names its study, no
cell says "None" and a loss of 0 that was never measured is shown as missing, the stored E3 refits are listed with
the run each refits, the one-run figure's legend names every run mode, a weightless run says how to restore it (the
command and its time) before Submit, and a job shows its estimate, its final state, its start and its duration.

Each page is rendered by AppTest over a small copy of shipped runs (seconds, not the minute the whole folder takes)."""

import json
import math
import os
import platform
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from engine.core.presets import RunConfig
from engine.core.store import Store, weights_not_kept
from engine.runtime import jobs

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "cached_results"
APP = str(REPO / "dashboard" / "app.py")
PARITY = "54cb465fa855929b"  # cpu, E2 parity norm seed 0: weights kept, evaluated as norm, norm->none, norm->rescale
CHAIN = "9734984bb9384aa9"  # cpu, E2 chain none seed 0: its loss curve reaches 0 (fp32), final_loss 0.0
CHAIN_NORM = "0d911260484af682"  # cpu, E2 chain norm seed 0: the run that refit REFIT starts from
REFIT = "80ff9ba426b9e120"  # E3's refit of CHAIN_NORM (head, head+last, head+first)
LADDER = "88a10749c5678ea2"  # cpu-ladder, E5 rung of width 32, seed 0 (a study's own folder)
NO_LOSS = "0000000000000a01"  # a copy of CHAIN's seed 1 whose manifest says final_loss 0 with no loss curve


def group_member(key: str, seed: int) -> str:
    """The run key of another seed of `key`'s group (stored without its weights)."""
    return RunConfig.from_dict(Store(SHIPPED).manifest(key)["config"]).run_key(seed)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A results folder: five cpu runs (two weightless seeds of the groups of PARITY and CHAIN), a run whose final
    loss was never measured, the cpu study's E2 table over them, one refit, and one cpu-ladder run in its folder."""
    root = tmp_path_factory.mktemp("runs-page")
    keys = [PARITY, group_member(PARITY, 3), CHAIN, group_member(CHAIN, 1), CHAIN_NORM]
    for key in keys:
        shutil.copytree(SHIPPED / "runs" / key, root / "runs" / key)
    shutil.copytree(SHIPPED / "refits" / REFIT, root / "refits" / REFIT)
    shutil.copytree(SHIPPED / "cpu-ladder" / "runs" / LADDER, root / "cpu-ladder" / "runs" / LADDER)
    table = pd.read_parquet(SHIPPED / "e2-cpu.parquet")
    table[table["run_key"].isin(keys)].to_parquet(root / "e2-cpu.parquet", index=False)
    shutil.copytree(root / "runs" / keys[3], root / "runs" / NO_LOSS)  # not in the table: in no study
    manifest = json.loads((root / "runs" / NO_LOSS / "manifest.json").read_text())
    manifest |= {"final_loss": 0.0, "loss_curve": [], "seed": 99, "group": [99]}
    for field in ("steps", "device"):  # fields an older or hand-made manifest may lack
        manifest.pop(field)
    (root / "runs" / NO_LOSS / "manifest.json").write_text(json.dumps(manifest))
    return root


def page(monkeypatch, root: Path, name: str, **query) -> AppTest:
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.switch_page(f"app_pages/{name}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module")
def runs_page(folder):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPSCOPE_CACHE", str(folder.parent / "runs-page-cache"))
        yield page(mp, folder, "runs", run=PARITY)


def listed(at: AppTest) -> pd.DataFrame:
    (table,) = [d.value for d in at.dataframe if "run_key" in d.value.columns]
    return table.set_index("run_key")


def test_every_run_names_its_study(runs_page, folder):
    table = listed(runs_page)
    assert table.loc[[PARITY, CHAIN, CHAIN_NORM, group_member(PARITY, 3)], "study"].tolist() == ["cpu"] * 4
    assert table.loc[LADDER, "study"] == "cpu-ladder"  # its own folder's study
    assert table.loc[NO_LOSS, "study"] == "—"  # in no table of the results folder
    (studies,) = [p for p in runs_page.get("button_group") if p.proto.label == "runs of"]
    assert [o.content for o in studies.proto.options] == ["cpu", "results folder", "cpu-ladder"]


def test_no_cell_says_none_and_a_zero_loss_says_whether_it_was_measured(runs_page):
    table = listed(runs_page)
    for column in table.columns:
        text = table[column].astype(str)
        assert not text.isin(["None", "nan", "NaN", "<NA>", ""]).any(), (column, table[column].tolist())
    assert table.loc[CHAIN, "final loss"] == "0 exactly"  # its curve reaches 0: fp32 rounds the answer's p to 1
    assert table.loc[NO_LOSS, "final loss"] == "—"  # 0 with no curve: never measured
    assert table.loc[NO_LOSS, ["steps", "device"]].tolist() == ["—", "—"]
    assert table.loc[PARITY, "final loss"] == "0.0648"
    assert table.loc[CHAIN, "group wall (s)"] == "3,362" and table.loc[group_member(CHAIN, 1), "group wall (s)"] == "—"


def test_the_refits_are_listed_with_the_run_each_refits(runs_page):
    (refits,) = [d.value for d in runs_page.dataframe if "refit_key" in d.value.columns]
    row = refits.set_index("refit_key").loc[REFIT]
    assert row["refits run"] == CHAIN_NORM and row["study"] == "cpu"
    assert (row["task"], row["arch"], row["trained boundary"], row["seed"]) == ("chain", "looped", "norm", "0")
    assert row["targets"] == "head, head+last, head+first" and row["refit steps"] == "800"
    assert "head+first 0 exactly" in row["final loss"]
    assert any("E3 refits: 1 stored" in e.label for e in runs_page.expander)


def test_the_one_run_figure_names_every_run_mode(runs_page):
    """Beside the ten difficulties' legend, the run modes' legend ran past the figure's height: Chromium showed
    `norm` alone of norm, norm->none and norm->rescale. Below the figure it has the room for all three."""
    from tests.test_dashboard import charts_on

    (spec,) = [s for s in charts_on(runs_page) if any(layer.get("name") == "run" for layer in s.get("layer", []))]
    (lines,) = [layer for layer in spec["layer"] if layer.get("name") == "run"]
    assert lines["encoding"]["strokeDash"]["legend"]["orient"] == "bottom"
    drawn = pd.DataFrame(spec["datasets"][lines["data"]["name"]])
    assert set(drawn["boundary"]) == {"norm", "norm->none", "norm->rescale"}
    assert [m.value for m in runs_page.metric if m.label == "final loss"] == ["0.0648"]


def test_a_missing_manifest_value_is_a_dash_on_the_one_run_view(monkeypatch, folder, tmp_path):
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    at = page(monkeypatch, folder, "runs", run=NO_LOSS)
    facts = {m.label: m.value for m in at.metric}
    assert facts["final loss"] == "—" and facts["steps"] == "—"
    text = " ".join(c.value for c in at.caption)
    assert not re.search(r"\b(None|nan|NaN)\b", text), text


# ---------------------------------------------------------------- the Run page: before Submit, and its jobs


def test_a_weightless_run_says_how_to_restore_it_before_submit(monkeypatch, folder, tmp_path):
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    key = group_member(PARITY, 3)
    assert weights_not_kept(Store(folder).manifest(key)) is not None
    at = page(monkeypatch, folder, "run", run_kind="evaluate a run", run_key=key)
    assert at.selectbox(key="run_key").value == key
    assert "no weights here" in " ".join(c.value for c in at.caption)
    (warning,) = at.warning
    minutes = jobs.restore_seconds(Store(folder).manifest(key)) / 60
    assert "stored without its weights" in warning.value and "retrains its group of 16 seeds" in warning.value
    assert f"about {math.ceil(minutes)} min on the machine that made it" in warning.value, warning.value
    assert [c.value for c in at.code] == [f"loopscope restore {key} --results {folder}"]
    assert at.button(key="submit").disabled
    at = page(monkeypatch, folder, "run", run_kind="evaluate a run", run_key=PARITY)  # one with weights: evaluable
    assert not at.warning and not at.button(key="submit").disabled


def job_file(root: Path, jid: str, **fields) -> None:
    """A job's file as its worker writes it (this process stands in for a running worker: it is alive)."""
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    record = {"job_id": jid, "what": f"evaluate run {PARITY} at n = 1..24", "spec": {}, "pid": os.getpid(),
              "host": platform.node(), "updated": time.time()} | fields  # fmt: skip
    (root / "jobs" / f"{jid}.json").write_text(json.dumps(record))


def test_an_evaluation_job_shows_its_estimate_then_its_final_state_start_and_duration(monkeypatch, tmp_path):
    """The issue's evaluation job showed "step 0 of 1" and no estimate for its whole 166 s, and the same once done;
    a finished job showed neither its start nor its duration."""
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "results"
    started = time.time() - 40
    job_file(root, "00000000000000e1", state="running", message=f"evaluate run {PARITY}", step=3, total=10,
             unit="difficulty", stage="", eta_s=90.0, eta_covers="evaluation", started=started)  # fmt: skip
    at = page(monkeypatch, root, "run")
    (bar,) = at.get("progress")
    assert re.fullmatch(r"difficulty 3 of 10 · about (\d+) s left \(evaluation\)", bar.proto.text), bar.proto.text
    assert "running" in " ".join(m.value for m in at.markdown)
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d, running \d+ s", " ".join(c.value for c in at.caption))

    job_file(root, "00000000000000e1", state="done", message="1680 rows added to the workbench's copy", step=10,
             total=10, unit="difficulty", eta_s=0, started=started, ended=started + 166)  # fmt: skip
    at = page(monkeypatch, root, "run")
    assert not at.get("progress")  # no bar, no "step 0 of 1" once it is done
    assert any("**done**" in m.value for m in at.markdown)
    card = " ".join(c.value for c in at.caption)
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d, took 3 min", card), card  # 166 s, rounded up
    assert "left" not in card
