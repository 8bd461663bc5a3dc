"""The GPU study in the dashboard and the report (issue 30 item 6): found in its own folder under the results folder,
offered beside `cpu`, every page drawing it, its runs listed with their GPU provenance, the E5 ladder spanning both
devices, and a section of its own in the overview and in `loopscope report`.

The folder is real: the GPU study's structure (`gpu-smoke`: E2, E3 and E5's ladder with the rescale surgery, parity,
2 seeds) computed by the engine's own command (`loopscope run ... --preset gpu-smoke`, which writes into `gpu-smoke/`),
beside the shipped CPU study's own E2 and E5 tables (cached_results/e2-cpu.parquet, e5-cpu.parquet: the CPU side of
the ladder; `gpu-smoke` shares its task and T). There is no GPU here: the gpu-smoke runs trained on the CPU, so their
manifests are given a GPU's provenance (the keys engine.core.store.gpu_info writes) to test how it is shown."""

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import charts, report, results
from engine.cli import main
from tests.test_dashboard import charts_on
from tests.test_dashboard import render as dashboard_page

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

SHIPPED = Path(__file__).resolve().parents[1] / "cached_results"
GPU = {"name": "NVIDIA H200", "capability": "9.0", "memory_gib": 139.8, "driver": "580.95.05", "cuda": "13.0",
       "cudnn": 91300, "torch": "2.11.0+cu130"}  # fmt: skip
POLICY = "cuda: bf16 autocast for matmuls and attention, fp32 weights, AdamW (fused) and evaluation"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("two-studies")
    for experiment in ("e2", "e3", "e5"):
        argv = ["run", experiment, "--preset", "gpu-smoke", "--seeds", "2", "--tasks", "parity", "--results", str(root)]
        assert main(argv) == 0, argv
    for name in ("e2-cpu.parquet", "e5-cpu.parquet"):  # the CPU study's own tables, as shipped
        shutil.copy(SHIPPED / name, root / name)
    for path in (root / "gpu-smoke").glob("runs/*/manifest.json"):  # no GPU here: the provenance a GPU run has
        manifest = json.loads(path.read_text())
        path.write_text(json.dumps(manifest | {"gpu": GPU, "dtype_policy": POLICY, "device": "cuda (NVIDIA H200)"}))
    return root


@pytest.fixture(autouse=True)
def _verdict_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path_factory.getbasetemp() / "verdict-cache"))


def render(monkeypatch, root: Path, page: str = "overview", **query) -> AppTest:
    """tests/test_dashboard.py's render, and no error box on the page either."""
    at = dashboard_page(monkeypatch, root, page, **query)
    assert not at.error, [e.value for e in at.error]
    return at


def test_the_gpu_study_is_found_in_its_own_folder_only(root, tmp_path):
    assert (root / "gpu-smoke" / "e2-gpu-smoke.parquet").is_file() and not (root / "e2-gpu-smoke.parquet").exists()
    found = results.catalog(root)
    assert found["e2"] == ["cpu", "gpu-smoke"] and found["e3"] == ["gpu-smoke"] and found["e5"] == ["cpu", "gpu-smoke"]
    assert "e4" not in found and results.studies(root) == ["cpu", "gpu-smoke"]
    assert results.default_study(root) == "cpu"  # the largest study with an E2 table: gpu-smoke ranks below cpu
    assert "gpu-smoke/e2-gpu-smoke.parquet" in {name for name, *_ in results.tables_state(root)}
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    (copy / "elsewhere").mkdir()  # neither another subfolder nor a GPU table outside its folder is read
    shutil.copy(copy / "e2-cpu.parquet", copy / "elsewhere" / "e2-elsewhere.parquet")
    shutil.copy(copy / "gpu-smoke" / "e3-gpu-smoke.parquet", copy / "e3-gpu-smoke.parquet")
    (copy / "gpu-smoke" / "e3-gpu-smoke.parquet").unlink()
    assert "e3" not in results.catalog(copy) and results.studies(copy) == ["cpu", "gpu-smoke"]
    (copy / "e2-cpu.parquet").unlink()
    assert results.default_study(copy) == "gpu-smoke"  # the only study with an E2 table
    rows = [p for p in results.study_provenance(root, "gpu-smoke") if p["GPU"] == "NVIDIA H200"]
    assert rows and rows[0]["dtype policy"] == POLICY and rows[0]["driver"] == GPU["driver"]


def test_each_page_draws_the_gpu_study(monkeypatch, root):
    for page in ("accuracy", "norms"):
        at = render(monkeypatch, root, page, preset="gpu-smoke")
        assert at.selectbox(key="preset").value == "gpu-smoke" and charts_on(at)
        assert "gpu-smoke.parquet`: **gpu-smoke** preset, 2 seeds" in at.caption[0].value
    at = render(monkeypatch, root, "refit", metric="accuracy")  # E3 exists at gpu-smoke alone: no picker
    assert "`e3-gpu-smoke.parquet`" in at.caption[0].value and charts_on(at)
    at = render(monkeypatch, root, "stacked", preset="gpu-smoke")  # no E4 anywhere: the study does not run it
    assert [i.value for i in at.info if "Not part of this study" in i.value and "e4-gpu-smoke" in i.value]
    assert not charts_on(at)
    at = render(monkeypatch, root, "agreement", preset="gpu-smoke")
    assert sum("Not part of this study" in i.value for i in at.info) == 2  # parts 1 and 2
    ladder = next(s for s in charts_on(at) if "mean-gpu" in [layer.get("name") for layer in s["layer"]])
    points = [p for rows in ladder["datasets"].values() for p in rows if "device" in p]
    assert {p["device"] for p in points} == {"CPU", "GPU"}
    assert {p["study"] for p in points if p["device"] == "GPU"} == {"gpu-smoke"}
    assert any(p["params"] == 412_288 and p["device"] == "CPU" for p in points)  # the bridge rung's CPU side
    assert any("Markers by device" in c.value for c in at.caption)
    rules = next(d.value for d in at.dataframe if "claim" in d.value.columns)  # engine.experiments.ladder.rules
    claims = dict(zip(rules["claim"], rules["outcome"], strict=True))
    assert claims["ladder trend at n=4"] in ("grows", "shrinks", "flat") and "ladder trend at n=12" in claims
    assert any(c.startswith("collapse ") and c.endswith("(gpu)") for c in claims)
    assert any(c.startswith("collapse 412,288 params (cpu)") for c in claims)
    at = render(monkeypatch, root, "agreement", preset="cpu", task="parity")  # the CPU ladder spans the GPU's too
    assert any("GPU: `gpu-smoke`" in c.value for c in at.caption)


def test_the_runs_page_lists_the_gpu_runs_with_their_provenance(monkeypatch, root):
    at = render(monkeypatch, root, "runs")
    runs = at.selectbox(key="run").options
    assert runs and all(r.startswith("gpu-smoke/") for r in runs)  # the results folder itself holds no runs here
    at = render(monkeypatch, root, "runs", run=runs[-1])
    shown = "\n".join(m.value for m in at.markdown)
    assert "GPU provenance" in shown and "NVIDIA H200" in shown and "compute capability: `9.0`" in shown
    assert f"dtype policy: `{POLICY}`" in shown and "CUDA: `13.0`" in shown and "driver: `580.95.05`" in shown
    assert not at.expander or all("Evaluate" not in e.label for e in at.expander)  # jobs run in the results folder


def test_the_overview_and_the_report_give_the_gpu_study_a_section(monkeypatch, root):
    at = render(monkeypatch, root)
    assert at.selectbox(key="study").value == "cpu"
    headers = [h.value for h in at.header]
    assert "The GPU study (`gpu-smoke`), beside it" in headers
    assert {"gpu-smoke · E2 · norm vs none, from scratch", "gpu-smoke · E3 · readout refit"} <= set(headers)
    assert not [h for h in headers if h.startswith("gpu-smoke · E4")]
    shown = [re.sub(r"\\(.)", r"\1", c.value) for c in at.caption]  # as read: Markdown's backslash escapes resolved
    assert any("NVIDIA H200 (compute capability 9.0)" in c for c in shown)
    page = report.html(root)
    assert '<h2 id="study-gpu-smoke">The GPU study (<code>gpu-smoke</code>)</h2>' in page
    for heading in (  # laid out as the pages (report.PAGES), each part headed by its page's title
        "gpu-smoke · Overview",
        "gpu-smoke · Accuracy vs depth",
        "gpu-smoke · Provenance",
        "gpu-smoke · GPU provenance",
        "gpu-smoke · the rules over both devices' ladders",
    ):
        assert heading in page
    rules = page.split("the rules over both devices' ladders")[1]
    assert "ladder trend at n=4" in rules and "collapse 412,288 params (cpu)" in rules
    assert "What it says about the paper's collapse.</strong>" in rules
    assert "NVIDIA H200" in page and "Markers by device" in page
    assert "E5 · parity: accuracy per training distribution" not in page.split("gpu-smoke · Overview")[1]  # no part 2
    main, gpu = page.split('<h2 id="study-gpu-smoke">')
    assert "e2-cpu.parquet" in main and "e2-gpu-smoke.parquet" not in main and "e2-gpu-smoke.parquet" in gpu
    assert "loopscope run e2 --preset gpu-smoke --seeds 0-1 --tasks parity" in gpu


def test_the_ladder_marks_each_device_and_the_bridge():
    """Points of one rung from both devices (the bridge) are drawn twice, the GPU's hollow over the CPU's filled."""
    rung = {"params": 412_288, "steps": "2000", "ci_low": -0.2, "ci_high": 0.1, "n": 4}
    points = pd.DataFrame([
        rung | {"series": "n = 4 (T)", "mean": -0.05, "device": "CPU", "study": "cpu"},
        rung | {"series": "n = 4 (T)", "mean": -0.02, "device": "GPU", "study": "gpu"},
        rung | {"series": "n = 4 (T)", "params": 19_024_384, "mean": 0.3, "device": "GPU", "study": "gpu"},
    ])  # fmt: skip
    spec = charts.ladder_chart(points, 19_024_384).to_dict()
    marks = {layer.get("name"): layer["mark"] for layer in spec["layer"]}
    assert marks["mean-cpu"]["filled"] is True and marks["mean-gpu"]["filled"] is False
    shape = spec["layer"][3]["encoding"]["shape"]
    assert shape["title"] == "device · training steps" and shape["scale"]["domain"] == [
        "CPU · 2,000 steps",
        "GPU · 2,000 steps",
    ]
    note = charts.devices_note(points, 4)
    assert "412,288 parameters: CPU -0.050 (4 seeds), GPU -0.020 (4 seeds)" in note
    one = charts.ladder_chart(points[points["device"] == "GPU"].drop(columns=["device", "study"]), 19_024_384)
    assert "mean" in [layer.get("name") for layer in one.to_dict()["layer"]]  # one device: the figure as before
