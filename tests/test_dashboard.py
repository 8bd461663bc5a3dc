"""The dashboard: every page renders on real smoke results, on an empty folder and on damaged files
without a traceback; deep links restore widgets; the chart builders draw what the captions promise."""

import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path
from urllib.parse import parse_qs

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import caching, charts
from engine.core.presets import preset
from engine.core.store import Store
from engine.experiments import REGISTRY, e2, e3, e4
from engine.runtime import jobs

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
PAGES = ["overview", "accuracy", "norms", "refit", "stacked", "ouro", "runs"]


def smoke_results(tmp_path_factory) -> Path:
    """E2 at the smoke preset, parity, seeds 0-1; one folder per session (the store makes a second call free)."""
    root = tmp_path_factory.getbasetemp() / "loopscope-smoke"
    e2.run("smoke", [0, 1], Store(root), tasks=("parity",), progress=False)
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return smoke_results(tmp_path_factory)


@pytest.fixture(scope="module")
def damaged(results, tmp_path_factory):
    """A copy with a garbage e2 table and one run's checkpoint overwritten."""
    root = tmp_path_factory.mktemp("damaged")
    shutil.copytree(results, root, dirs_exist_ok=True)
    (root / "e2-smoke.parquet").write_bytes(b"not a parquet file")
    key = Store(root).run_keys()[0]
    next((root / "runs" / key).glob("model*.safetensors")).write_bytes(b"garbage")
    return root


@pytest.fixture(scope="module")
def all_tables(results, tmp_path_factory):
    """The smoke results plus small E3, E4 and E1 tables shaped as the engine writes them, derived from E2's
    rows in milliseconds instead of trained: they exercise those pages' drawing code, not the science."""
    root = tmp_path_factory.mktemp("all")
    shutil.copytree(results, root, dirs_exist_ok=True)
    rows = pd.read_parquet(root / "e2-smoke.parquet")
    cut = rows[(rows["boundary"] == "norm->none") & (rows["metric"] == "accuracy")]
    grid = [(t, k, m) for t in ("head", "head+last") for k in (0, 50, 100) for m in ("accuracy", "recovery")]
    e3 = pd.concat([cut.assign(refit_target=t, refit_steps=k, metric=m, experiment="e3") for t, k, m in grid])
    in_range = e3[e3["metric"] == "recovery"].assign(difficulty=0)  # recovery over the in-range mean, as E3 writes
    original = rows[(rows["boundary"] == "norm") & (rows["metric"] == "accuracy")]
    original = original.assign(refit_target="original", refit_steps=0, experiment="e3")
    e3 = pd.concat([original, e3, in_range.drop_duplicates(["seed", "refit_target", "refit_steps", "eval_loops"])])
    e3.to_parquet(root / "e3-smoke.parquet")
    looped = rows[rows["boundary"].isin(["norm", "none"])]
    stacked = looped.assign(arch="stacked", trained_loops=1)
    pd.concat([looped, stacked]).assign(experiment="e4").to_parquet(root / "e4-smoke.parquet")
    e1 = rows[rows["boundary"].isin(["norm", "norm->none"]) & (rows["seed"] == 0)].assign(experiment="e1")
    e1.to_parquet(root / "e1-demo.parquet")
    tops = {m: {str(n): {"id": 1, "text": "1"} for n in range(1, 10)} for m in ("norm", "norm->none")}
    manifest = {
        "model": {
            "spec": "cached_results/e1-demo",
            "parameters": 15904,
            "trained_loops": 3,
            "training": {"probe": {"difficulty": {"parity": 12}}, "held_out": {"prompts": 200}},
        },  # fmt: skip
        "tasks": {"parity": {"n1_identity": {"passed": True}, "top_tokens": tops}},
        "files": {"e1-demo.parquet": hashlib.sha256((root / "e1-demo.parquet").read_bytes()).hexdigest()},
    }
    (root / "e1-demo.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(autouse=True)
def _verdict_cache(monkeypatch, tmp_path_factory):
    """The overview's verdicts are kept on disk between processes (dashboard.results.cache_dir): in the tests'
    own folder, never in the home directory."""
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path_factory.getbasetemp() / "verdict-cache"))


def render(monkeypatch, root, page: str = "overview", **query) -> AppTest:
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(query)
    at.run()
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [e for e in at.error if "could not be drawn" in e.value], [e.value for e in at.error]
    return at


def charts_on(at: AppTest) -> list[dict]:
    """The Vega-Lite specs the page sent, with their datasets put back (Streamlit sends them apart)."""
    from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df

    specs = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        data = {d.name: convert_arrow_bytes_to_pandas_df(d.data.data).to_dict("records") for d in el.proto.datasets}
        specs.append(spec | {"datasets": data})
    return specs


# ---------------------------------------------------------------- pages on real results


def test_overview_shows_every_e2_claim_with_a_verdict(monkeypatch, results):
    at = render(monkeypatch, results)
    text = " ".join(m.value for m in at.markdown)
    for claim in "abcd":
        assert f"E2 ({claim}) · parity" in text
    assert "smoke preset, 2 seeds per mode" in text
    assert ("holds" in text or "does NOT hold" in text) and ("not run yet" in text)  # E2 verdicts; E3/E4/E1 not run
    for command in ("loopscope run e3 --preset cpu", "loopscope run e4 --preset cpu", "loopscope ouro --model"):
        assert command in text
    links = at.get("page_link")
    assert len(links) == 4 + 3 + 1  # the cards', the not-run-yet cards', the headline figure's


def test_accuracy_page_draws_curves_and_delta_with_downloads(monkeypatch, results):
    at = render(monkeypatch, results, "accuracy")
    accuracy, delta, paired = charts_on(at)
    names = [layer.get("name") for layer in accuracy["layer"]]  # 2 seeds a point: below charts.MIN_BAND_SEEDS,
    assert "mean" in names and "ci-band" not in names  # so no band (an empty one made Vega warn of infinite extent)
    assert "magnitude-bands" in [layer.get("name") for layer in delta["layer"]]
    assert {"seeds", "mean", "ci-band", "zero", "budget"} <= {layer.get("name") for layer in paired["layer"]}
    assert len(at.download_button) == 9  # PNG, SVG, CSV for each figure
    assert any("95% bootstrap CI over seeds" in c.value and "Chance level 0.5" in c.value for c in at.caption)


def test_deep_link_restores_widgets(monkeypatch, results):
    at = render(monkeypatch, results, "accuracy", task="parity", difficulty="5", modes=["none", "norm->none"])
    assert at.selectbox(key="difficulty").value == "5"
    assert at.pills(key="modes").value == ["none", "norm->none"]
    at.toggle(key="seeds").set_value(True).run()
    assert not at.exception


@pytest.mark.parametrize(("page", "figures"), [("norms", 2), ("runs", 4)])
def test_norms_and_runs_pages_draw(monkeypatch, results, page, figures):
    """The Runs page: two runs side by side (curves, losses) and one run (curves, loss)."""
    at = render(monkeypatch, results, page)
    assert len(charts_on(at)) == figures
    assert len(at.dataframe) >= 1


@pytest.mark.parametrize("page", ["refit", "stacked"])
def test_missing_experiments_say_how_to_make_them(monkeypatch, results, page):
    at = render(monkeypatch, results, page)
    assert "Not run yet" in at.info[0].value
    assert f"loopscope run {'e3' if page == 'refit' else 'e4'} --preset cpu" in at.code[0].value


def test_ouro_page_is_a_labelled_placeholder(monkeypatch, results):
    at = render(monkeypatch, results, "ouro")
    assert "Demonstration placeholder" in at.warning[0].value
    assert "is a measurement" in at.warning[0].value
    assert "loopscope ouro --model ByteDance/Ouro-1.4B" in at.code[0].value
    assert len(charts_on(at)) == 1


def test_refit_page_draws_recovery_with_the_paper_levels(monkeypatch, all_tables):
    at = render(monkeypatch, all_tables, "refit")
    (spec,) = charts_on(at)
    levels = [layer for layer in spec["layer"] if layer.get("name") == "reference-level"]
    assert levels and at.selectbox(key="n").value == 3  # defaults to n = T
    ends = at.dataframe[0].value  # where each target ends: every target once, at its last step
    assert list(ends["refit_target"]) == ["head", "head+last"] and set(ends["refit_steps"]) == {100}
    assert ends["plateau"].dtype == bool
    assert at.selectbox(key="difficulty").options == ["in-range mean", *map(str, range(1, 7))]  # no "0"
    at.selectbox(key="metric").set_value("accuracy").run()
    (spec,) = charts_on(at)
    levels = [layer for layer in spec["layer"] if layer.get("name") == "reference-level"]
    level_rows = spec["datasets"][levels[0]["data"]["name"]]
    assert [r["label"].split(":")[0] for r in level_rows] == ["original, norm mode"]  # a level, not a curve
    assert "original" not in set(at.dataframe[0].value["refit_target"])
    at.selectbox(key="difficulty").set_value("beyond-range mean").run()  # accuracy has every level
    assert not at.exception and len(charts_on(at)) == 1


def test_stacked_page_switches_the_x_axis(monkeypatch, all_tables):
    at = render(monkeypatch, all_tables, "stacked")
    assert len(charts_on(at)) == 3  # curves, Cliff's delta, the paired view
    at.segmented_control(key="axis").set_value("ratio").run()
    assert not at.exception
    spec = charts_on(at)[0]
    assert spec["layer"][0]["encoding"]["x"]["field"] == "overshoot_ratio"
    budget = next(layer for layer in spec["layer"] if layer.get("name") == "budget")
    assert spec["datasets"][budget["data"]["name"]][0]["x"] == 1.0


def test_ouro_page_with_a_table_labels_the_demonstration(monkeypatch, all_tables):
    at = render(monkeypatch, all_tables, "ouro")
    assert "Demonstration, not the released weights" in at.info[0].value
    assert "15,904 parameters" in at.info[0].value
    assert "probed where one loop step is not enough: parity 12 bits (on prompts held out of training)." in (
        at.info[0].value
    )
    assert "identity passed" in at.success[0].value
    assert len(charts_on(at)) == 3
    held = [
        c.value
        for c in at.caption
        if "Items: the probe's prompts, held out of the demonstration's training." in c.value
    ]
    assert len(held) == 3 and not any("records no `split`" in c.value for c in at.caption)  # one per figure


def test_overview_gives_no_verdict_the_engine_does_not(monkeypatch, all_tables):
    at = render(monkeypatch, all_tables)
    text = " ".join(m.value for m in at.markdown)
    paper_part = text.split("**E5**")[0]  # E5 (beyond the paper, run by name) has its own not-run card after them
    assert "not run yet" not in paper_part and "no verdict yet" in paper_part  # E1's demo: no verdicts
    for title in ("E3 · readout refit (a) · parity", "E4 · looped vs stacked (equal n) · parity",
                  "E4 · looped vs stacked (matched) · parity"):  # fmt: skip
        assert title in text, title


# ---------------------------------------------------------------- empty and damaged folders


@pytest.mark.parametrize("page", PAGES)
def test_empty_folder_says_what_to_do(monkeypatch, tmp_path, page):
    at = render(monkeypatch, tmp_path / "nothing", page)
    said = " ".join(x.value for x in [*at.info, *at.warning, *at.code])
    assert "loopscope" in said


@pytest.mark.parametrize("page", PAGES)
def test_damaged_files_are_reported_not_raised(monkeypatch, damaged, page):
    at = render(monkeypatch, damaged, page)
    said = " ".join(x.value for x in [*at.error, *at.warning, *at.info])
    if page in ("overview", "accuracy", "norms"):
        assert "e2-smoke.parquet` could not be read" in said
    if page == "runs":
        assert "checksum" in said
        assert at.dataframe[0].value.shape[0] == len(Store(damaged).run_keys()) - 1


def test_a_rewritten_table_is_read_again(monkeypatch, results, tmp_path):
    """The caches are keyed on the files' size and mtime: a changed file is never served stale."""
    root = tmp_path / "copy"
    shutil.copytree(results, root)
    assert not render(monkeypatch, root, "accuracy").error
    (root / "e2-smoke.parquet").write_bytes(b"truncated")
    at = render(monkeypatch, root, "accuracy")
    assert "could not be read" in at.error[0].value


# ---------------------------------------------------------------- the Run page and live jobs (engine.runtime.jobs)


@pytest.fixture
def writable(monkeypatch):
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the workers these tests start


def test_run_page_submits_a_training_that_then_appears_among_the_runs(monkeypatch, tmp_path, writable):
    root = tmp_path / "results"
    at = render(monkeypatch, root, "run")
    at.number_input(key="run_steps").set_value(20)
    at.text_input(key="run_seeds").set_value("1")
    at.button(key="submit").click().run()
    assert "submitted" in at.success[0].value
    (job,) = jobs.list_jobs(root)
    assert jobs.wait(job.job_id, root, timeout_s=120).state == "done"
    at.run()
    assert "**done**" in " ".join(m.value for m in at.markdown)
    (link,) = [link for link in at.get("page_link") if link.proto.label.startswith("Run ")]
    store = jobs.workbench(root)  # a job's runs: in the workbench
    (key,) = [k for k in store.run_keys() if store.manifest(k)["seed"] == 0]  # seeds "1" = one seed, seed 0
    assert parse_qs(link.proto.query_string) == {"run": [f"workbench/{key}"]} and link.proto.page == "runs"
    at.query_params["run"] = f"workbench/{key}"  # follow the deep link
    at.switch_page("app_pages/runs.py").run()
    assert at.dataframe[0].value.shape[0] == 2  # seed 1 trains in its group (seeds 0, 1), and both are stored
    assert at.selectbox(key="run").value == f"workbench/{key}"  # the link opened the job's own run


def test_runs_page_evaluates_a_run_at_more_loop_counts(monkeypatch, results, tmp_path, writable):
    root = tmp_path / "copy"
    shutil.copytree(results, root, ignore=shutil.ignore_patterns("jobs"))  # other tests' jobs stay behind
    at = render(monkeypatch, root, "runs")
    key = at.selectbox(key="run").value
    at.number_input(key="more_loops").set_value(12)
    table = (root / "e2-smoke.parquet").read_bytes()
    at.button(key="more_submit").click().run()
    assert "submitted" in at.success[0].value
    (job,) = jobs.list_jobs(root)
    done = jobs.wait(job.job_id, root, timeout_s=120)
    assert done.state == "done", done.message
    assert Store(root).load_rows(key)["eval_loops"].max() < 12 and (root / "e2-smoke.parquet").read_bytes() == table
    bench = jobs.workbench(root)  # the rows went to the workbench's copy of the run and of its table
    assert bench.load_rows(key)["eval_loops"].max() == 12, (done, key)
    copy = pd.read_parquet(bench.root / "e2-smoke.parquet")
    assert copy.loc[copy["run_key"] == key, "eval_loops"].max() == 12  # the compare box reads this table
    render(monkeypatch, root, "accuracy", vs_root=str(bench.root), vs="smoke")
    at = render(monkeypatch, root, "runs", run=f"workbench/{key}")  # the added rows' provenance on the run's page
    assert at.selectbox(key="run").value == f"workbench/{key}"
    manifest = bench.manifest(key)
    trained = manifest["config"]["model"]["boundary"]  # more loop counts in the trained mode
    assert [c.value for c in at.caption if c.value.startswith("rows added ")] == [
        f"rows added {manifest['rows_added'][0]['created']}: `{trained}` (e2), commit "
        f"`{manifest['git_commit']}`{' (dirty)' if manifest['git_dirty'] else ''}"
    ]


def test_read_only_hides_every_trigger(monkeypatch, results):
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "1")
    at = render(monkeypatch, results, "run")
    assert "Read-only" in at.info[0].value
    assert not [b for b in at.button if b.key in ("submit", "more_submit")]
    at = render(monkeypatch, results, "runs")
    assert not [b for b in at.button if b.key == "more_submit"]


def test_the_community_cloud_entry_file_runs_the_dashboard_read_only(monkeypatch, results):
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "")
    monkeypatch.delenv("LOOPSCOPE_READ_ONLY")  # recorded, so teardown removes what streamlit_app.py sets
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(results))
    at = AppTest.from_file(str(Path(APP).parents[1] / "streamlit_app.py"), default_timeout=60).run()
    assert not at.exception and not at.error
    assert len(at.get("page_link")) == 4 + 3 + 1  # the overview's links resolve from the repository root too
    assert os.environ["LOOPSCOPE_READ_ONLY"] == "1"
    assert any("Read-only" in c.value for c in at.sidebar.caption)


def write_job(root: Path, jid: str, state: str, spec: dict, message: str, log: str | None = None) -> None:
    """A job file as a worker leaves it (engine.runtime.jobs), written directly: no worker needed."""
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    record = {"job_id": jid, "state": state, "what": "a job", "spec": spec, "message": message, "updated": 1.0}
    (root / "jobs" / f"{jid}.json").write_text(json.dumps(record))
    if log is not None:
        (root / "jobs" / f"{jid}.log").write_text(log)


def test_run_page_shows_the_end_of_a_failed_jobs_log(monkeypatch, tmp_path, writable):
    log = "".join(f"log line {i}\n" for i in range(1, 41)) + "RuntimeError: out of memory\n"
    write_job(tmp_path, "00000000000000f1", "failed", {}, "failed: RuntimeError: out of memory", log)
    at = render(monkeypatch, tmp_path, "run")
    (code,) = [c for c in at.code if "log line" in c.value]
    assert code.value.endswith("RuntimeError: out of memory") and "log line 40" in code.value
    assert "log line 5\n" not in code.value  # the end of the log, not all of it
    assert any("jobs/00000000000000f1.log" in c.value for c in at.caption)


def test_a_finished_experiment_job_links_to_its_runs_and_its_page(monkeypatch, results, tmp_path, writable):
    root = tmp_path / "copy"
    shutil.copytree(results, root, ignore=shutil.ignore_patterns("jobs"))
    shutil.copytree(results, jobs.workbench(root).root, ignore=shutil.ignore_patterns("jobs"))  # what the job wrote
    spec = {"kind": "experiment", "experiment": "e2", "preset": "smoke", "seeds": [0, 1], "tasks": ["parity"]}
    write_job(root, "00000000000000d0", "done", spec | {"device": "auto"}, "done: workbench/e2-smoke.parquet written.")
    at = render(monkeypatch, root, "run")
    links = {link.proto.label: link.proto for link in at.get("page_link")}
    runs = links["e2's runs in the workbench"]
    assert parse_qs(runs.query_string) == {"studies": ["workbench"], "experiments": ["e2"]} and runs.page == "runs"
    beside = links["Accuracy vs depth: the workbench's e2-smoke beside the study"]
    assert beside.page == "accuracy" and parse_qs(beside.query_string)["vs"] == ["smoke"]
    at.query_params.update(parse_qs(runs.query_string))
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception and at.dataframe[0].value.shape[0] == len(jobs.workbench(root).run_keys())


def test_run_page_reports_a_corrupt_job_file(monkeypatch, tmp_path, writable):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "0123456789abcdef.json").write_text('{"state": ')
    at = render(monkeypatch, tmp_path, "run")
    assert "is not a job file" in at.warning[0].value


# ---------------------------------------------------------------- chart specs


def spec_layers(chart) -> tuple[dict, dict]:
    spec = chart.to_dict()
    return {layer.get("name"): layer for layer in spec["layer"]}, spec.get("datasets", {})


def layer_data(layer: dict, datasets: dict) -> list[dict]:
    return datasets[layer["data"]["name"]]


@pytest.fixture(scope="module")
def stats_frame():
    return pd.DataFrame(
        {
            "series": ["norm", "norm", "none", "none"],
            "eval_loops": [1, 2, 1, 2],
            "mean": [0.5, 0.9, 0.6, 0.95],
            "ci_low": [0.4, 0.8, 0.5, 0.9],
            "ci_high": [0.6, 1.0, 0.7, 1.0],
            "n": [2, 2, 2, 2],
            "ci_method": ["BCa"] * 4,
        }
    )


def test_curves_have_ci_band_budget_at_T_and_chance(stats_frame):
    banded = stats_frame.assign(n=charts.MIN_BAND_SEEDS) if "n" in stats_frame else stats_frame  # enough seeds
    chart = charts.curves(banded, "eval_loops", charts.N_TITLE, "accuracy", budgets=charts.budget_rules(3), chance=0.5)
    layers, datasets = spec_layers(chart)
    band = layers["ci-band"]
    assert band["mark"]["type"] == "area"
    assert band["encoding"]["y"]["field"] == "ci_low" and band["encoding"]["y2"]["field"] == "ci_high"
    assert layer_data(layers["budget"], datasets)[0]["x"] == 3
    assert layers["budget"]["mark"]["type"] == "rule"
    assert layer_data(layers["chance"], datasets)[0]["y"] == 0.5
    assert "seeds" not in layers
    colors = layers["mean"]["encoding"]["color"]["scale"]
    assert dict(zip(colors["domain"], colors["range"], strict=True)) == {"norm": "#0072B2", "none": "#D55E00"}
    assert "(loop steps)" in layers["ci-band"]["encoding"]["x"]["title"]


def test_curves_draw_seeds_and_references_when_given(stats_frame):
    seeds = pd.DataFrame({"series": ["norm"] * 2, "seed": [0, 0], "eval_loops": [1, 2], "value": [0.5, 0.9]})
    refs = pd.DataFrame({"x": [4.0, None], "y": [0.0, 0.5], "label": ["paper", "paper level"]})
    chart = charts.curves(stats_frame, "eval_loops", "n", "acc", seeds=seeds, references=refs)
    layers, datasets = spec_layers(chart)
    assert layers["seeds"]["encoding"]["detail"]["field"] == "seed"
    assert layer_data(layers["reference"], datasets) == [{"x": 4.0, "y": 0.0, "label": "paper"}]
    assert layers["reference-level"]["mark"]["type"] == "rule"


def test_delta_chart_shades_the_magnitude_thresholds():
    summary = pd.DataFrame(
        {"eval_loops": [1, 2], "delta": [0.0, 0.9], "delta_ci_low": [-0.2, 0.5], "delta_ci_high": [0.2, 1.0]}
        | {"magnitude": ["negligible", "large"], "p_value": [1.0, 0.01]}
    )
    layers, datasets = spec_layers(charts.delta_chart(summary, "eval_loops", "n", charts.budget_rules(4)))
    bounds = {abs(row["y2"]) for row in layer_data(layers["magnitude-bands"], datasets)}
    assert bounds == {0.147, 0.33, 0.474, 1.0}
    assert layer_data(layers["budget"], datasets)[0]["x"] == 4
    assert layers["delta-ci"]["encoding"]["y2"]["field"] == "delta_ci_high"


def test_series_colours_are_okabe_ito():
    scale = charts.color_scale(["stacked, norm", "looped, none", "looped, norm"]).to_dict()
    assert scale["domain"] == ["looped, norm", "looped, none", "stacked, norm"]
    assert scale["range"] == ["#0072B2", "#D55E00", "#009E73"]
    assert charts.color_of("norm->none") == "#CC79A7"


def test_exports_are_png_and_svg(stats_frame):
    chart = charts.curves(stats_frame, "eval_loops", "n", "acc", budgets=charts.budget_rules(2))
    assert charts.to_png(chart).startswith(b"\x89PNG")
    assert b"<svg" in charts.to_svg(chart)[:200]


def test_caption_states_seeds_ci_method_and_chance():
    text = charts.caption([0, 1, 1], ["BCa", "BCa", "degenerate"])
    assert "n = 2 seeds" in text and "95% bootstrap CI" in text and "BCa 2, degenerate 1" in text
    assert "Chance level 0.5" in text
    text = charts.caption(2, ["BCa"], None, most=16, per="point")  # points over different seeds (E5's rescale)
    assert "n = 2–16 seeds per point" in text and "Chance" not in text
    assert "n = 4 seeds per series" in charts.caption(4, ["BCa"], most=4)


def test_loss_curve_steps_follow_the_manifest_stride():
    from dashboard.data import loss_curve

    curve = loss_curve(json.loads('{"steps": 300, "loss_curve": [3.0, 2.0, 1.0]}'))
    assert curve["step"].tolist() == [1, 4, 7]


SHIPPED = Path(__file__).resolve().parents[1] / "cached_results"


@pytest.mark.skipif(not (SHIPPED / "e2-cpu-1layer.parquet").exists(), reason="no shipped E2 results in this checkout")
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_the_shipped_results(monkeypatch, page):
    at = render(monkeypatch, SHIPPED, page)
    assert not at.exception
    if page == "overview":  # every E2 claim of both tasks has a card with a verdict
        text = " ".join(m.value for m in at.markdown)
        assert text.count("preset, 16 seeds per mode") >= 8


# ---------------------------------------------------------------- the shipped results: what each page draws

ANNOTATIONS = {"budget", "budget-label", "chance", "chance-label", "reference", "reference-level", "magnitude-bands"}


def measured_values(spec: dict) -> list:
    """The y values a figure draws from measurements: the y/y2 fields of its named layers other than the
    annotations (budget and chance rules, the paper's reference marks, the magnitude bands)."""
    values = []
    for layer in spec.get("layer", [spec]):
        if layer.get("name") in ANNOTATIONS or (layer is not spec and "name" not in layer):
            continue  # an annotation, or an unnamed label or zero rule: drawn whatever the data
        data = layer.get("data") or spec.get("data") or {}
        records = spec["datasets"].get(data.get("name"), data.get("values", []))
        encoding = layer.get("encoding", {})
        fields = [encoding[c]["field"] for c in ("y", "y2") if "field" in (encoding.get(c) or {})]
        values += [r.get(f) for r in records for f in fields]
    return values


def finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.skipif(not (SHIPPED / "e2-cpu-1layer.parquet").exists(), reason="no shipped results in this checkout")
@pytest.mark.parametrize("page", PAGES)
def test_every_default_figure_draws_a_finite_value(monkeypatch, page):
    """A fresh session with default widgets: no figure is empty (all its measured values NaN or missing)."""
    at = render(monkeypatch, SHIPPED, page)
    for i, spec in enumerate(charts_on(at)):
        values = measured_values(spec)
        assert any(finite(v) for v in values), f"{page}: figure {i} draws no finite value ({len(values)} values)"


HELD = "held-out mean"  # engine.experiments.verdicts.MEAN
SHIPPED_PRESET = "cpu-1layer"  # the first study, checked against its experiments' claims (`cpu` is the default)


def shipped(experiment: str) -> pd.DataFrame:
    return pd.read_parquet(SHIPPED / f"{experiment}-{SHIPPED_PRESET}.parquet")


def layer_records(spec: dict, name: str) -> pd.DataFrame:
    (layer,) = [layer for layer in spec["layer"] if layer.get("name") == name]
    return pd.DataFrame(spec["datasets"][(layer.get("data") or spec["data"])["name"]])


def assert_same(shown: pd.DataFrame, expected: pd.DataFrame, key: str, columns: list[str]) -> None:
    """The page's table equals the engine's, row for row (matched on key), in the given columns."""
    shown, expected = shown.set_index(key).sort_index(), expected.set_index(key).sort_index()
    assert list(shown.index) == list(expected.index) and len(shown)
    pd.testing.assert_frame_equal(
        shown[columns], expected[columns], check_dtype=False, check_index_type=False, check_exact=False
    )


needs_shipped = pytest.mark.skipif(not (SHIPPED / "e4-cpu-1layer.parquet").exists(), reason="no shipped results")


@needs_shipped
def test_overview_cards_are_the_engine_claims(monkeypatch):
    """Each card's verdicts and measured texts are REGISTRY[e].claims(table, preset) on the shipped table: the first
    study judged by the same rules as the second (its in-range items standing in for held-out ones)."""
    from dashboard import results

    at = render(monkeypatch, SHIPPED, study=SHIPPED_PRESET)
    markdown = [m.value for m in at.markdown]
    titles = {"e2": "E2", "e3": "E3 · readout refit", "e4": "E4 · looped vs stacked"}
    for experiment, title in titles.items():
        found = REGISTRY[experiment].claims(shipped(experiment), SHIPPED_PRESET)
        assert len(found) >= 8
        for c in found:
            (card,) = [m for m in markdown if m.startswith(f"**{title} ({c.claim}) · {c.task}**")]
            assert c.text in card and c.criterion in card
            assert not re.search(r"\b(True|False|None|nan)\b", c.measured)  # issue 32: no Python values on a card
            assert any(f"{c.level}: {results.badge(c.outcome)} {c.measured}" in m for m in markdown), c.measured


@needs_shipped
def test_refit_default_view_draws_the_engine_summary(monkeypatch):
    """E3's default view (parity, recovery, in-range mean, n = T) is e3.summarize's, the figure the claims read."""
    at = render(monkeypatch, SHIPPED, "refit", preset=SHIPPED_PRESET)
    task, n = at.selectbox(key="task").value, at.selectbox(key="n").value
    assert (task, n, at.selectbox(key="metric").value, at.selectbox(key="difficulty").value) == (
        "parity", 4, "recovery", "in-range mean"
    )  # fmt: skip
    summary = e3.summarize(shipped("e3"), SHIPPED_PRESET)
    curve = summary[(summary["task"] == task) & (summary["eval_loops"] == n)]
    every = ["refit_steps", "mean", "ci_low", "ci_high", "n", "n_guarded", "plateau", "pooled", "same_as"]
    shown, final = at.dataframe[0].value, e3.final(curve)
    columns = [c for c in every if c in shown]
    for c in set(every) - set(columns):  # only a column of blanks is left out (pooled, same_as)
        assert c in ("pooled", "same_as") and not (final[c].notna() & (final[c].astype(str) != "")).any(), c
    assert_same(shown, final, "refit_target", columns)
    head = at.dataframe[0].value.set_index("refit_target").loc["head"]
    assert f"recovery {head['mean']:.3f} [{head['ci_low']:.3f}, {head['ci_high']:.3f}]" in next(
        c.measured for c in e3.claims(shipped("e3"), SHIPPED_PRESET) if (c.task, c.claim, c.level) == (task, "a", HELD)
    )  # the overview card's figure
    drawn = layer_records(charts_on(at)[0], "mean").rename(columns={"series": "refit_target"})
    expected = curve.assign(key=curve["refit_target"] + "@" + curve["refit_steps"].astype(str))
    assert_same(drawn.assign(key=drawn["refit_target"] + "@" + drawn["refit_steps"].astype(str)), expected, "key",
                ["mean"])  # fmt: skip


@needs_shipped
def test_stacked_gap_table_is_the_engine_comparison(monkeypatch):
    """E4's default view (all difficulties, equal n, norm) is e4.summarize's; mode none at matched n/T pairs the
    stacked model run as norm->none with the looped none models, as E4 does."""
    at = render(monkeypatch, SHIPPED, "stacked", preset=SHIPPED_PRESET)
    assert at.selectbox(key="difficulty").value == "all difficulties mean"
    summary = e4.summarize(shipped("e4"), SHIPPED_PRESET)
    columns = ["mean_a", "mean_b", "gap", "delta", "delta_ci_low", "delta_ci_high", "magnitude", "p_value", "n_a"]
    for axis, mode in (("n", "norm"), ("ratio", "none"), ("difference", "none")):
        if (axis, mode) != ("n", "norm"):
            at.segmented_control(key="axis").set_value(axis)
            at.segmented_control(key="mode").set_value(mode).run()
            assert not at.exception
        task = at.selectbox(key="task").value
        x = charts.X_AXES[axis][0]
        expected = summary[(summary["axis"] == axis) & (summary["task"] == task) & (summary["mode"] == mode)]
        assert_same(at.dataframe[0].value, expected.rename(columns={"x": x}), x, columns)
        curves = layer_records(charts_on(at)[0], "mean").pivot(index=x, columns="series", values="mean")
        both = curves.loc[expected["x"]]
        assert both[f"looped, {mode}"].to_numpy() == pytest.approx(expected["mean_b"].to_numpy())
        assert both[f"stacked, {mode}"].to_numpy() == pytest.approx(expected["mean_a"].to_numpy())


@needs_shipped
def test_accuracy_and_norms_pages_draw_the_e2_summary(monkeypatch):
    """The accuracy page's default curves and Cliff's delta are e2.summarize's in-range figures; the norms page's
    norm growth of norm->none at n = T is the figure of claim (d): one definition (verdicts.norm_ratios: per seed,
    the norm per step averaged over the chosen difficulties, max/min over steps 1..T), the worst seed on the card."""
    from dashboard import results
    from engine.experiments import verdicts

    rows = shipped("e2")
    summary = e2.summarize(rows, SHIPPED_PRESET)
    at = render(monkeypatch, SHIPPED, "accuracy", preset=SHIPPED_PRESET)
    task = at.selectbox(key="task").value
    assert at.selectbox(key="difficulty").value == "in-range mean"
    expected = summary[(summary["task"] == task) & (summary["range"] == "in-range")].set_index("eval_loops")
    curve, delta, _ = charts_on(at)  # and the paired view
    means = layer_records(curve, "mean").pivot(index="eval_loops", columns="series", values="mean")
    assert means["norm"].to_numpy() == pytest.approx(expected["mean_a"].to_numpy())
    assert means["none"].to_numpy() == pytest.approx(expected["mean_b"].to_numpy())
    deltas = layer_records(delta, "delta").set_index("eval_loops")
    assert deltas["delta"].to_numpy() == pytest.approx(expected["delta"].to_numpy())
    # the norms page at its defaults: the largest study (`cpu`, held-out items), the held-out mean, as the card
    at = render(monkeypatch, SHIPPED, "norms")
    task, study = at.selectbox(key="task").value, at.selectbox(key="preset").value
    assert at.selectbox(key="difficulty").value == verdicts.MEAN and study == "cpu"
    growth = at.dataframe[0].value.set_index(["mode", "steps"])
    T = preset(study, task).model.trained_loops
    assert {f"1..{T} (T)", f"1..{3 * T}"} <= set(growth.loc["norm->none"].index)  # at n = T and at the largest n
    row = growth.loc[("norm->none", f"1..{T} (T)")]
    table = pd.read_parquet(SHIPPED / f"e2-{study}.parquet")  # independently of the dashboard's code:
    cut = table[(table["task"] == task) & (table["split"] == "heldout") & (table["boundary"] == "norm->none")]
    cut = cut[(cut["metric"] == "norm_post") & (cut["eval_loops"] <= T)]
    per_step = cut.groupby(["seed", "eval_loops"])["value"].mean().groupby("seed")
    ratios = per_step.max() / per_step.min()
    assert row["worst seed max/min"] == pytest.approx(ratios.max()) and row["worst seed"] == ratios.idxmax()
    assert row["median max/min"] == pytest.approx(ratios.median())
    assert row["mean max/min"] == pytest.approx(ratios.mean())
    assert row["within 3×"] == f"{int((ratios <= 3).sum())} of {len(ratios)}"
    (card, *_) = [
        c
        for c in results.claims("e2", study)["claims"]
        if (c["task"], c["claim"], c["level"]) == (task, "d", verdicts.MEAN)
    ]
    assert f"norm ratio {ratios.max():.2f}x at the worst seed (seed {ratios.idxmax()})" in card["measured"]


# ---------------------------------------------------------------- issue #16: a loss curve that ends at exactly 0


def drawn_svg_text(chart) -> tuple[list[str], list[str]]:
    """The text labels and the line's path data of a chart rendered to SVG (vl_convert, as the downloads do)."""
    svg = charts.to_svg(chart).decode()
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    paths = re.findall(r'<path[^>]*aria-roledescription="line mark"[^>]*d="([^"]*)"', svg)
    paths += re.findall(r'<path[^>]*d="([^"]*)"[^>]*aria-roledescription="line mark"', svg)
    return texts, paths


@pytest.mark.parametrize("losses", [[0.7, 0.01, 1e-6, 0.0], [0.0, 0.0, 0.0], [0.7, 0.2, 0.05]])
def test_a_loss_curve_ending_at_zero_draws_finite_points_with_axis_titles(losses):
    """A log scale cannot place 0: the old chart drew an empty line along the top edge and no y ticks."""
    curve = pd.DataFrame({"step": range(1, 1 + len(losses)), "loss": losses})
    texts, paths = drawn_svg_text(charts.loss_chart(curve))
    expected_scale = "log" if min(losses) > 0 else "linear"
    assert charts.loss_scale(curve) == expected_scale
    assert "training step" in texts
    assert f"training loss (cross-entropy, nats; {expected_scale} scale)" in texts
    y_ticks = texts[texts.index("training step") + 1 : -1]
    assert y_ticks, "the y axis has no tick labels"
    (path,) = paths
    numbers = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", path)]
    assert len(numbers) >= 2 * len(losses) and all(math.isfinite(v) for v in numbers)
    assert "NaN" not in path


def test_small_losses_are_shown_in_scientific_notation():
    assert charts.loss_text(0.0) == "0 exactly"
    assert charts.loss_text(3.2e-6) == "3.20e-06"
    assert charts.loss_text(0.6931) == "0.6931"
    assert charts.loss_text(None) == "?"


def test_runs_page_with_a_zero_final_loss_says_linear_scale(monkeypatch, results, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(results, root, ignore=shutil.ignore_patterns("jobs"))
    for key in Store(root).run_keys():  # every run: whichever the page picks first ends at exactly 0
        path = root / "runs" / key / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["loss_curve"] = [*manifest["loss_curve"][:-1], 0.0]
        manifest["final_loss"] = 0.0
        path.write_text(json.dumps(manifest))
    at = render(monkeypatch, root, "runs")
    assert not at.error
    assert [m.value for m in at.metric if m.label == "final loss"] == ["0 exactly"]
    assert any("one seed; linear scale (a loss of exactly 0" in c.value for c in at.caption)
    loss = next(spec for spec in charts_on(at) if spec.get("name") == "loss")
    assert loss["encoding"]["y"]["scale"]["type"] == "linear"
    assert loss["encoding"]["y"]["title"].endswith("linear scale)")


# ---------------------------------------------------------------- the second design: held-out items, paired views


def relabel_heldout(src: Path, dst: Path) -> Path:
    """A copy of smoke results whose upper in-range difficulties (parity m = 3, 4; chain k = 2; E3's in-range
    mean) are labelled `heldout`: smoke holds nothing out, and this gives the second design's row shape, to
    drive the held-out levels, the verdict rules' cards and the paired views on real measurements."""
    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("jobs", "locks"))
    for path in dst.glob("e[234]-smoke.parquet"):
        rows = pd.read_parquet(path)
        upper = rows["difficulty"] >= rows["task"].map({"parity": 3, "chain": 2})
        rows.loc[(rows["split"] == "seen") & (upper | (rows["difficulty"] == 0)), "split"] = "heldout"
        rows.to_parquet(path)
    return dst


@pytest.fixture(scope="module")
def heldout(results, tmp_path_factory):
    """E2 and E4 at the smoke preset (parity, seeds 0-1; E4 trains the stacked twins), relabelled."""
    e4.run("smoke", [0, 1], Store(results), tasks=("parity",), progress=False)
    return relabel_heldout(results, tmp_path_factory.mktemp("heldout"))


def smoke_rows(root: Path, experiment: str) -> pd.DataFrame:
    return pd.read_parquet(root / f"{experiment}-smoke.parquet")


def test_held_out_levels_lead_and_every_accuracy_caption_names_the_split(monkeypatch, heldout, results):
    at = render(monkeypatch, heldout, "accuracy")
    assert at.selectbox(key="difficulty").value == "held-out mean"
    assert at.selectbox(key="difficulty").options[:3] == ["held-out mean", "hardest held-out", "in-range mean"]
    figures = [c.value for c in at.caption if "95%" in c.value and not c.value.startswith("Paired:")]
    assert len(figures) == 3 and all("Items (`split`): held-out (m = 3, 4)." in c for c in figures)
    at.selectbox(key="difficulty").set_value("in-range mean").run()
    assert "held-out (m = 3, 4); seen in training (m = 1, 2)" in at.caption[1].value
    at = render(monkeypatch, results, "accuracy")  # nothing held out: seen and beyond, said as such
    assert at.selectbox(key="difficulty").value == "in-range mean"
    assert "Items (`split`): seen in training (m = 1–4)." in at.caption[1].value
    at = render(monkeypatch, heldout, "stacked", difficulty="hardest held-out")
    assert "Items (`split`): held-out (m = 4)." in at.caption[1].value


def test_refit_captions_name_the_split(monkeypatch, all_tables):
    at = render(monkeypatch, all_tables, "refit")
    assert any("Items (`split`): " in c.value for c in at.caption)
    n = layer_records(charts_on(at)[0], "mean")["n"]  # seeds per point vary where some seeds are guarded
    many = f"{n.min()}–{n.max()} seeds" if n.min() != n.max() else f"{n.min()} seed"
    assert any(f"Mean over n = {many}" in c.value and "per point" in c.value for c in at.caption)
    at.selectbox(key="metric").set_value("accuracy").run()
    assert any("Items (`split`): seen in training (m = 1–4)." in c.value for c in at.caption)


@pytest.mark.parametrize("level", ["held-out mean", "hardest held-out"])
def test_the_paired_view_is_the_verdict_rules_paired_analysis(monkeypatch, heldout, level):
    """The accuracy page's paired figure and table are engine.experiments.verdicts.paired_modes at the level."""
    from engine.experiments import verdicts

    at = render(monkeypatch, heldout, "accuracy", difficulty=level)
    expected = verdicts.paired_modes(smoke_rows(heldout, "e2"))
    expected = expected[(expected["task"] == "parity") & (expected["level"] == level)].set_index("eval_loops")
    paired = charts_on(at)[2]
    drawn = layer_records(paired, "mean").set_index("eval_loops").sort_index()
    assert drawn["mean_diff"].to_numpy() == pytest.approx(expected["mean_diff"].to_numpy())
    assert layer_records(paired, "seeds")["seed"].nunique() == 2  # one thin line per seed
    table = at.dataframe[0].value.set_index("eval_loops").sort_index()
    for column in ("wilcoxon_p", "wilcoxon_p_holm", "cliffs_delta", "mann_whitney_p", "ci_low", "ci_high"):
        assert table[column].to_numpy() == pytest.approx(expected[column].to_numpy(), nan_ok=True), column
    assert list(table["side"]) == list(expected["side"])


@pytest.mark.parametrize(("axis", "family"), [("n", "equal"), ("ratio", "matched")])
def test_the_e4_paired_view_is_the_verdict_rules_e4_table(monkeypatch, heldout, axis, family):
    """Looped − stacked of the same seed, with the README's Holm families (n = 2..3T; o = 1, 2, 3)."""
    from engine.experiments import verdicts

    at = render(monkeypatch, heldout, "stacked", difficulty="held-out mean", axis=axis, mode="norm")
    x = charts.X_AXES[axis][0]
    expected = verdicts.e4_table(smoke_rows(heldout, "e4"))
    expected = expected[(expected["level"] == verdicts.MEAN) & (expected["family"] == family)].set_index("x")
    shown = at.dataframe[1].value.set_index(x).loc[expected.index]
    assert shown["mean_diff"].to_numpy() == pytest.approx(expected["gap"].to_numpy())
    assert shown["wilcoxon_p_holm"].to_numpy() == pytest.approx(expected["wilcoxon_p_holm"].to_numpy(), nan_ok=True)
    lines = layer_records(charts_on(at)[2], "seeds")
    assert lines["seed"].nunique() == 2 and {"diff", x} <= set(lines.columns)


def test_overview_cards_follow_the_verdict_rules_with_both_analyses(monkeypatch, heldout):
    from dashboard import results as found_by

    at = render(monkeypatch, heldout)
    markdown = [m.value for m in at.markdown]
    titles = {"e2": "E2", "e4": "E4 · looped vs stacked"}
    for experiment, title in titles.items():
        _, found = found_by.claims_of(experiment, smoke_rows(heldout, experiment), "smoke")
        cards = found_by.rule_cards(experiment, found)
        assert len(cards) >= 2
        for card in cards:
            (head,) = [m for m in markdown if m.startswith(f"**{title} ({card['claim']}) · {card['task']}**")]
            mean = {a: f["levels"]["held-out mean"][0] for a, f in card["analyses"].items()}
            if mean.get("paper") != mean.get("paired") or card["analyses"]["paper"] != card["analyses"]["paired"]:
                assert f"paper's: {mean['paper']}]" in head and f"paired: {mean['paired']}]" in head, head
            for analysis in card["analyses"].values():
                for level, (outcome, measured) in analysis["levels"].items():
                    assert any(f"{level}: " in m and measured in m and f"[{outcome}]" in m for m in markdown)


@pytest.fixture(scope="module")
def two_studies(heldout, results, tmp_path_factory):
    """One folder holding both designs: `cpu` (held-out rows) and `cpu-1layer` (no `split`, as shipped)."""
    root = tmp_path_factory.mktemp("studies")
    shutil.copyfile(heldout / "e2-smoke.parquet", root / "e2-cpu.parquet")
    smoke_rows(results, "e2").drop(columns="split").to_parquet(root / "e2-cpu-1layer.parquet")
    return root


def test_the_second_study_is_the_default_and_the_first_selectable(monkeypatch, two_studies):
    at = render(monkeypatch, two_studies)
    assert at.selectbox(key="study").value == "cpu" and any("The second CPU study" in c.value for c in at.caption)
    at = render(monkeypatch, two_studies, "accuracy")
    assert at.selectbox(key="preset").value == "cpu" and at.selectbox(key="difficulty").value == "held-out mean"
    at.selectbox(key="preset").set_value("cpu-1layer").run()
    assert not at.exception and "records no `split`" in at.caption[1].value


def test_compare_two_result_sets_by_deep_link(monkeypatch, heldout, results):
    """Another folder's table overlaid (deep link: vs_root, vs), with the difference of the means per n."""
    at = render(monkeypatch, heldout, "accuracy", task="parity", vs_root=str(results), vs="smoke")
    assert at.text_input(key="vs_root").value == str(results) and at.selectbox(key="vs").value == "smoke"
    specs = charts_on(at)
    assert len(specs) == 5
    overlay = layer_records(specs[3], "mean")
    label = f"smoke @ {results.name}"
    assert {("norm", "smoke"), ("norm", label)} <= set(zip(overlay["series"], overlay["set"], strict=True))
    diff = layer_records(specs[4], "difference").set_index(["series", "eval_loops"])["diff"]
    mean = overlay.set_index(["series", "set", "eval_loops"])["mean"]
    assert diff.loc[("norm", 3)] == pytest.approx(mean.loc[("norm", "smoke", 3)] - mean.loc[("norm", label, 3)])
    at.selectbox(key="vs").set_value("nothing").run()
    assert len(charts_on(at)) == 3
    at = render(monkeypatch, heldout, "norms", vs_root=str(results), vs="smoke")
    assert len(charts_on(at)) == 4
    at = render(monkeypatch, heldout, "stacked", vs_root=str(results), vs="smoke")
    assert len(charts_on(at)) == 5


def test_a_read_only_copy_compares_only_with_listed_folders(monkeypatch, heldout, results):
    monkeypatch.setenv("LOOPSCOPE_READ_ONLY", "1")
    monkeypatch.delenv("LOOPSCOPE_COMPARE", raising=False)
    at = render(monkeypatch, heldout, "accuracy", vs_root=str(results), vs="smoke")
    assert len(charts_on(at)) == 3  # a typed path is not opened
    monkeypatch.setenv("LOOPSCOPE_COMPARE", str(results))
    at = render(monkeypatch, heldout, "accuracy", vs_root=str(results), vs="smoke")
    assert len(charts_on(at)) == 5


def test_the_first_page_imports_nothing_heavy_and_keeps_its_verdicts_on_disk(monkeypatch, heldout, tmp_path):
    import subprocess
    import sys

    probe = "import sys, dashboard.results, dashboard.ui, engine.runtime.settings; print([m for m in sys.modules if "
    probe += "m.split('.')[0] in "
    probe += "('torch', 'scipy', 'altair', 'pandas', 'pyarrow') or m == 'engine.experiments'])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"  # the first page's imports: Streamlit, dashboard.results, the settings

    import streamlit as st

    from dashboard import results as found_by

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path))
    computed = []
    compute = found_by._compute_claims
    monkeypatch.setattr(found_by, "_compute_claims", lambda *a: computed.append(a) or compute(*a))
    st.cache_data.clear()  # what other tests of this process computed
    first = found_by.claims("e2", "smoke", heldout)
    assert first["rules"] == "verdicts" and len(computed) == 1 and len(list(tmp_path.glob("claims-*.json"))) == 1
    st.cache_data.clear()  # a new process: nothing in memory, the verdicts on disk
    assert found_by.claims("e2", "smoke", heldout) == json.loads(json.dumps(first)) and len(computed) == 1
    copy = tmp_path / "copy"
    shutil.copytree(heldout, copy)
    os.utime(copy / "e2-smoke.parquet", ns=(1, 1))  # the same bytes elsewhere: the verdicts are keyed on them
    found_by.claims("e2", "smoke", copy)
    assert len(computed) == 1
    table = pd.read_parquet(copy / "e2-smoke.parquet")
    table.iloc[:-1].to_parquet(copy / "e2-smoke.parquet")  # other bytes: computed again, never served stale
    found_by.claims("e2", "smoke", copy)
    assert len(computed) == 2
    # `loopscope dashboard` warms the cache beside the server: every table's verdicts, a first visit computes none
    for name in copy.glob("e*-*.parquet"):  # every table other bytes again
        pd.read_parquet(name).iloc[:-2].to_parquet(name)
    tables = len(list(copy.glob("e*-*.parquet")))
    assert found_by.warm(copy) == tables and len(computed) == 2 + tables
    st.cache_data.clear()
    found_by.claims("e2", "smoke", copy)
    assert len(computed) == 2 + tables


def test_shipped_verdicts_are_read_for_these_bytes_only(monkeypatch, heldout, tmp_path):
    """`python -m dashboard.results ROOT --ship` writes ROOT/verdicts.json; a server on a fresh copy of the folder
    (new mtimes, no verdict cache) reads it instead of computing, and ignores an entry whose table changed."""
    import streamlit as st

    from dashboard import results as found_by

    copy = tmp_path / "copy"
    shutil.copytree(heldout, copy)
    shipped = found_by.ship(copy)
    assert set(json.loads(shipped.read_text())["tables"]) == {p.name for p in copy.glob("e*-*.parquet")}
    fresh = tmp_path / "fresh"
    shutil.copytree(copy, fresh)  # a clone: new mtimes
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "empty-cache"))
    computed = []
    compute = found_by._compute_claims
    monkeypatch.setattr(found_by, "_compute_claims", lambda *a: computed.append(a) or compute(*a))
    st.cache_data.clear()
    got = found_by.claims("e2", "smoke", fresh)
    assert got["rules"] == "verdicts" and got["claims"] and computed == []
    rows = pd.read_parquet(fresh / "e2-smoke.parquet")
    rows.assign(value=1.0 - rows["value"]).to_parquet(fresh / "e2-smoke.parquet")  # other bytes: computed again
    st.cache_data.clear()
    changed = found_by.claims("e2", "smoke", fresh)
    assert len(computed) == 1 and changed["claims"] != got["claims"]


def test_the_shipped_results_carry_current_verdicts():
    """cached_results/verdicts.json matches every shipped table and today's RULES_VERSION (else the first page
    computes them: rerun `python -m dashboard.results cached_results --ship`), and says what a computation says."""
    from dashboard import results as found_by

    root = Path(__file__).resolve().parents[1] / "cached_results"
    tables = json.loads((root / found_by.SHIPPED).read_text())["tables"]
    assert set(tables) == {p.name for p in root.glob("e*-*.parquet")}
    stale = [
        n
        for n, e in tables.items()
        if e["rules"] != found_by.RULES_VERSION or e["sha256"] != found_by._sha256(root / n)
    ]
    assert not stale, f"stale shipped verdicts for {stale}: run `python -m dashboard.results cached_results --ship`"
    computed = found_by._compute_claims(root / "e4-cpu.parquet", "e4", "cpu")
    assert tables["e4-cpu.parquet"]["found"] == json.loads(json.dumps(computed, default=lambda v: v.item()))


# ---------------------------------------------------------------- issue 33 item 5: a repeat view is cheap


def test_a_chart_is_built_once_per_set_of_input_values():
    """caching.memoized (the chart builders): equal inputs (other objects, same values) give the very chart built
    before; any other value, dtype, column or row gives a new one; an argument it cannot key on builds afresh."""
    stats = pd.DataFrame({"series": ["norm", "none"], "eval_loops": [1, 1], "mean": [0.5, 0.6], "ci_low": [0.4, 0.5],
                          "ci_high": [0.6, 0.7], "n": [4, 4], "ci_method": ["bca", "bca"]})  # fmt: skip
    first = charts.curves(stats, "eval_loops", charts.N_TITLE, "accuracy", budgets=charts.budget_rules(4))
    again = charts.curves(stats.copy(), "eval_loops", charts.N_TITLE, "accuracy", budgets=charts.budget_rules(4))
    assert again is first
    y, budget = "accuracy", charts.budget_rules(4)
    for other in (
        charts.curves(stats.assign(mean=[0.5, 0.61]), "eval_loops", charts.N_TITLE, y, budgets=budget),
        charts.curves(stats, "eval_loops", charts.N_TITLE, y, budgets=charts.budget_rules(5)),
        charts.curves(stats, "eval_loops", charts.N_TITLE, "accuracy (fraction)", budgets=budget),
        charts.curves(stats, "eval_loops", charts.N_TITLE, y, budgets=charts.budget_rules(4.0)),
        charts.curves(stats.astype({"n": float}), "eval_loops", charts.N_TITLE, y, budgets=budget),
        charts.curves(stats, "eval_loops", charts.N_TITLE, y),
    ):
        assert other is not first
    assert charts.curves(stats.assign(mean=[0.5, 0.61]), "eval_loops", charts.N_TITLE, "accuracy",
                         budgets=charts.budget_rules(4)).to_dict() != first.to_dict()  # fmt: skip
    odd = stats.assign(ci_method=[["a"], ["b"]])  # lists in cells: pandas cannot hash them
    assert charts.curves(odd, "eval_loops", "n", "y") is not charts.curves(odd, "eval_loops", "n", "y")


def test_a_figure_sends_what_st_altair_chart_sends_and_a_rerun_sends_the_same(monkeypatch, results):
    """ui.figure draws the kept Vega-Lite spec with st.vega_lite_chart: the element (spec and Arrow datasets) is the
    one st.altair_chart makes of the same chart; a second run of a page reuses the charts and sends the same."""

    def both():
        import altair as alt
        import pandas as pd
        import streamlit as st

        from dashboard import ui

        frame = pd.DataFrame({"x": [1, 2, 3], "y": [0.2, 0.5, 0.4]})
        chart = alt.Chart(frame).mark_line().encode(x="x:Q", y="y:Q").properties(name="line")
        st.altair_chart(chart, width="stretch")
        ui.figure(chart, frame, "line", "A line.")

    at = AppTest.from_function(both).run()
    direct, kept = at.get("vega_lite_chart")
    assert direct.proto.spec == kept.proto.spec and direct.proto.datasets == kept.proto.datasets
    assert direct.proto.theme == kept.proto.theme

    def sent(at: AppTest) -> list:
        return [(el.proto.spec, [(d.name, d.data.data) for d in el.proto.datasets]) for el in at.get("vega_lite_chart")]

    for page in ("accuracy", "norms"):
        first = render(monkeypatch, results, page, seeds="true")
        again = render(monkeypatch, results, page, seeds="true")
        assert sent(first) and sent(again) == sent(first)


def test_no_full_garbage_collection_after_every_run(monkeypatch, results):
    """Streamlit's post-run gc.collect(2) walked every object of the process (torch, pandas, Altair), about 0.2 s of
    each page view: the app turns it off."""
    import streamlit as st

    render(monkeypatch, results)
    assert st.config.get_option("runner.postScriptGC") is False


def test_what_a_page_derives_from_a_table_is_computed_again_when_the_table_changes(tmp_path, results):
    """caching.derived keeps a page's frames under the table's key (path, size, mtime) and the choices: a rewritten
    table has another key, so nothing stale is shown; no key, no keeping."""
    from dashboard import data

    shutil.copy(results / "e2-smoke.parquet", tmp_path / "e2-smoke.parquet")
    before = data.table("e2", "smoke", tmp_path)
    calls = []

    def count(rows):
        calls.append(1)
        return int(rows["value"].sum() * 1000)

    first = caching.derived((*before.key, "sum"), lambda: count(before.rows))
    assert caching.derived((*before.key, "sum"), lambda: count(before.rows)) == first and len(calls) == 1
    rows = pd.read_parquet(tmp_path / "e2-smoke.parquet")
    rows.assign(value=rows["value"] + 1.0).to_parquet(tmp_path / "e2-smoke.parquet")
    after = data.table("e2", "smoke", tmp_path)
    assert after.key != before.key
    assert caching.derived((*after.key, "sum"), lambda: count(after.rows)) != first and len(calls) == 2
    caching.derived(None, lambda: count(after.rows))
    caching.derived(None, lambda: count(after.rows))
    assert len(calls) == 4


def test_visitors_who_ask_at_once_wait_for_one_computation():
    """caching.Kept: eight threads asking for one key while it is computed get its one value, computed once; a
    computation that fails is tried again by the next caller."""
    import threading
    import time

    kept, calls = caching.Kept(4), []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return object()

    got = []
    threads = [threading.Thread(target=lambda: got.append(kept.get("k", slow))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 8 and all(g is got[0] for g in got)

    def fails():
        raise ValueError("no")

    with pytest.raises(ValueError):
        kept.get("bad", fails)
    assert kept.get("bad", lambda: 3) == 3
    for i in range(5):  # the last 4 keys kept
        kept.get(i, lambda i=i: i)
    assert "k" not in kept.values and list(kept.values) == [1, 2, 3, 4]
