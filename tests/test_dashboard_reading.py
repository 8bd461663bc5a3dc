"""The dashboard as a researcher reads it (issue 43): the overview opens on the verdict matrix, one row per claim with
parity beside chain, the same numbers as the engine's verdicts, the report and the README's headline table; every
page opens on parity; a link's parameter that names nothing is said, not dropped; the figures keep their furniture
off the data. On the shipped results (the verdicts are computed once per session into a temporary cache)."""

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow  # AppTest renders of the shipped results: tens of seconds on 2 cores

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "cached_results"
APP = ROOT / "dashboard" / "app.py"
needs_shipped = pytest.mark.skipif(not (SHIPPED / "e2-cpu.parquet").exists(), reason="no shipped results")


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path_factory.getbasetemp() / "verdict-cache"))


def render(monkeypatch, root: Path, page: str = "overview", **query) -> AppTest:
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update(query)
    at.run()
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def numbers(text: str) -> list[str]:
    return re.findall(r"[+-]?\d+\.\d+", text)


def near(number: str, among: list[str]) -> bool:
    """`number` (as the README or a cell prints it, to its own decimals) is one of `among`, rounded alike."""
    places = len(number.split(".")[1])
    return any(round(abs(float(n)), places) == abs(float(number)) for n in among)


@needs_shipped
@pytest.mark.parametrize("study", ["cpu", "cpu-1layer"])
def test_each_matrix_cell_is_the_judges_outcome_and_number(study):
    """Every badge is an outcome the engine's claims give at the held-out mean for that claim and task, and every
    number in a cell is in the claim's own `measured` text: the matrix computes nothing of its own."""
    from dashboard import matrix, results

    found = matrix.rows(study, SHIPPED)
    assert [r["label"][:6] for r in found][:4] == ["E2 (a)", "E2 (b)", "E2 (c)", "E2 (d)"]
    for row in found:
        if row["note"]:
            assert study not in results.presets(row["experiment"], SHIPPED)
            continue
        claims = matrix._of_row(results.claims(row["experiment"], study, SHIPPED)["claims"], row["claim"])
        for task, entries in row["cells"].items():
            mine = [c for c in claims if c["task"] == task]
            at_mean = [c for c in mine if c["level"] == results.LEVELS[0]] or mine
            assert entries, (row["label"], task)
            assert {e["outcome"] for e in entries} <= {c["outcome"] for c in at_mean}
            measured = " ".join(c["measured"] for c in at_mean)
            for e in entries:
                for n in numbers(e["number"]):
                    assert n in measured, (row["label"], task, n, measured)


@needs_shipped
def test_the_readme_headline_table_shows_the_matrix_numbers():
    """The README's headline table (the `cpu` study) and the matrix agree, number for number, claim by claim
    (decimal numbers; the hardest-level asides in parentheses are the cards')."""
    from dashboard import matrix

    readme = (ROOT / "README.md").read_text()
    cells = {r["label"][:6]: r for r in matrix.rows("cpu", SHIPPED)}
    keys = {"E2 (a)": "E2 (a)", "E2 (b)": "E2 (b)", "E2 (c)": "E2 (c)", "E2 (d)": "E2 (d)", "E3 (a)": "E3 (a)",
            "E3 (b)": "E3 (b)", "E4 loo": "E4 loo", "1. tra": "E5 1 ·", "2. tra": "E5 2 ·", "3. the": "E5 3 ·",
            "4. a z": "E5 4 ·"}  # fmt: skip
    checked = 0
    for line in readme.splitlines():
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or parts[0][:6] not in keys:
            continue
        row = cells[keys[parts[0][:6]]]
        shown = row["paper"] + " " + " ".join(e["number"] for es in row["cells"].values() for e in es or [])
        for text in parts[1:]:
            text = re.sub(r"\(hardest k:[^)]*\)", "", text)
            for n in numbers(text):
                if not near(n, numbers(shown)):
                    raise AssertionError(f"README {parts[0]!r}: {n} is not on the matrix ({shown})")
                checked += 1
    assert checked >= 15


@needs_shipped
def test_the_overview_opens_on_the_matrix_with_the_cards_on_expand(monkeypatch):
    at = render(monkeypatch, SHIPPED)
    body = [h.proto.body for h in at.get("html") if 'class="verdicts"' in h.proto.body][0]  # then cpu-ladder's
    assert body.index("E2 (a)") < body.index("E3 (a)") < body.index("E4 looping") < body.index("E5 4")
    assert 'href="accuracy?preset=cpu&amp;task=parity&amp;difficulty=held-out+mean"' in body  # each cell a link
    assert 'href="norms?preset=cpu&amp;task=parity' in body  # claim (d): the norm page
    assert "paper&#x27;s</span>" in body or "paper's</span>" in body  # E2 (b) parity: the analyses apart
    labels = [e.label for e in at.get("expander")]
    assert any(label.startswith("E2 · ") and label.endswith("every card") for label in labels)
    markdown = [m.value for m in at.markdown]
    head = next(m for m in markdown if m.startswith("**E2 (d) · parity**"))
    assert "both: does NOT hold" in head  # the one badge of a claim judged alike by both analyses


@needs_shipped
def test_another_studys_cards_are_never_shown_as_this_ones(monkeypatch):
    """The first study ran no E5: its overview says so instead of ending on the `cpu` study's E5 cards."""
    at = render(monkeypatch, SHIPPED, study="cpu-1layer")
    markdown = [m.value for m in at.markdown]
    assert not [m for m in markdown if m.startswith("**E5 ·")]
    assert any("E5 is not part of the `cpu-1layer` study" in c.value for c in at.caption)
    body = next(h.proto.body for h in at.get("html") if 'class="verdicts"' in h.proto.body)
    assert "not part of the `cpu-1layer` study" in body.replace("<code>", "`").replace("</code>", "`")


@needs_shipped
@pytest.mark.parametrize("page", ["accuracy", "norms", "refit", "agreement"])
def test_every_page_opens_on_parity(monkeypatch, page):
    at = render(monkeypatch, SHIPPED, page)
    assert at.selectbox(key="task").value == "parity"


@needs_shipped
def test_a_link_parameter_that_names_nothing_is_said(monkeypatch):
    at = render(monkeypatch, SHIPPED, "accuracy", n="abc")
    assert any("n=abc names nothing on this page" in w.value for w in at.warning), [w.value for w in at.warning]


@needs_shipped
def test_a_link_to_a_study_a_page_lacks_is_said(monkeypatch, tmp_path):
    """One study has the page's table: no selector, so the link's study is named in a notice, not dropped."""
    (tmp_path / "e2-cpu.parquet").write_bytes((SHIPPED / "e2-cpu.parquet").read_bytes())
    at = render(monkeypatch, tmp_path, "accuracy", preset="cpu-1layer")
    assert any("preset=cpu\\-1layer" in w.value and "**cpu** is shown" in w.value for w in at.warning)


def spec_of(chart) -> dict:
    return json.loads(chart.to_json())


def layer(spec: dict, name: str) -> dict:
    (found,) = [lay for lay in spec["layer"] if lay.get("name") == name]
    return found


def test_chart_furniture_stays_off_the_data():
    """The budget label sits at the foot of the plot (accuracy near 1.0 runs at the top), the chance rule carries no
    text, and Cliff's δ keeps room for a point and its CI at ±1 and at the first and last n."""
    import pandas as pd

    from dashboard import charts

    stats = pd.DataFrame({"series": ["norm"] * 3, "eval_loops": [1, 2, 3], "mean": [0.5, 1.0, 1.0],
                          "ci_low": [0.4, 1.0, 1.0], "ci_high": [0.6, 1.0, 1.0], "n": [4] * 3,
                          "ci_method": ["bca"] * 3})  # fmt: skip
    spec = spec_of(charts.curves(stats, "eval_loops", "n", "accuracy", budgets=charts.budget_rules(2), chance=0.5))
    label = layer(spec, "budget-label")
    y_px = spec["datasets"][label["data"]["name"]][0]["y_px"]
    assert y_px > charts.HEIGHT / 2 and label["mark"]["baseline"] == "bottom"
    assert "chance-label" not in {lay.get("name") for lay in spec["layer"]}
    summary = pd.DataFrame({"eval_loops": [1, 12], "delta": [1.0, -1.0], "delta_ci_low": [1.0, -1.0],
                            "delta_ci_high": [1.0, -1.0], "magnitude": ["large"] * 2,
                            "p_value": [0.01] * 2})  # fmt: skip
    spec = spec_of(charts.delta_chart(summary, "eval_loops", "n"))
    x = layer(spec, "delta")["encoding"]["x"]["scale"]["domain"]
    assert x[0] < 1 and x[1] > 12
    y = spec["layer"][0]["encoding"]["y"]["scale"]["domain"]
    assert y[0] < -1 and y[1] > 1


def test_the_compare_view_tells_the_two_sets_apart_in_its_legend():
    import pandas as pd

    from dashboard import charts

    both = pd.DataFrame({"series": ["norm · a", "norm · b"], "eval_loops": [1, 1], "mean": [0.5, 0.6],
                         "ci_low": [0.4, 0.5], "ci_high": [0.6, 0.7], "n": [4, 4], "ci_method": ["bca"] * 2,
                         "set": ["a", "b"]})  # fmt: skip
    spec = spec_of(charts.curves(both, "eval_loops", "n", "y", dash="set", dash_title="result set"))
    dash = layer(spec, "mean")["encoding"]["strokeDash"]
    assert dash.get("legend") is not None and dash.get("title") == "result set"


@needs_shipped
def test_e4_at_matched_overshoot_draws_only_the_overshoots_the_looped_model_reaches(monkeypatch):
    at = render(monkeypatch, SHIPPED, "stacked", axis="ratio")
    from tests.test_dashboard import charts_on

    spec = charts_on(at)[0]
    mean = layer(spec, "mean")
    drawn = spec["datasets"][mean["data"]["name"]] if "data" in mean else spec["datasets"][spec["data"]["name"]]
    assert max(r["overshoot_ratio"] for r in drawn) <= 3


@needs_shipped
def test_a_loss_of_exactly_zero_says_so_and_a_groups_wall_time_is_shown_once():
    from dashboard import charts, data
    from engine.core.store import Store

    assert charts.loss_text(0.0) == "0 exactly"
    walls = {}
    for key in Store(SHIPPED).run_keys()[:40]:
        record, _ = data._run_record(str(SHIPPED), key, data.files_state(SHIPPED / "runs" / key))
        m = json.loads((SHIPPED / "runs" / key / "manifest.json").read_text())
        walls.setdefault((m.get("wall_time_s"), tuple(m.get("group") or [])), []).append(record["group wall (s)"])
    assert walls and all(sum(w is not None for w in shown) <= 1 for shown in walls.values())


def test_report_pairs_parity_with_chain():
    from dashboard import report

    cells = report.paired_cells({("a", "chain"): "C", ("b", "parity"): "P", ("a", "parity"): "A"})
    assert cells == ["A", "C", "P", "<div></div>"]  # one row per claim: parity, chain; a missing task left blank


@needs_shipped
def test_the_report_labels_the_demonstration_and_draws_claim_d_on_norm_and_token():
    import pandas as pd

    from dashboard import report

    figures = report.e1_figures(pd.read_parquet(SHIPPED / "e1-demo.parquet"), "demo")
    assert figures and all("demonstration, not the released weights" in title for title, _, _ in figures)
    assert all("Demonstration, not the released weights" in caption for _, _, caption in figures)
    spec = spec_of(figures[0][1])
    assert spec["datasets"][layer(spec, "reference")["data"]["name"]][0]["y"] == 0.0  # the paper's 0.000 at T
    titles = [t for t, _, _ in report.e2_figures(pd.read_parquet(SHIPPED / "e2-cpu.parquet"), "cpu")]
    assert "E2 (d) · parity: state norm per step" in titles and "E2 (d) · parity: top-token share per step" in titles


def mark_type(lay: dict) -> str:
    return lay["mark"] if isinstance(lay["mark"], str) else lay["mark"]["type"]


def rows_of(spec: dict, lay: dict) -> list[dict]:
    """The rows a layer draws (its own dataset, else the chart's)."""
    return spec["datasets"][(lay.get("data") or spec["data"])["name"]]


@needs_shipped
def test_e3s_reference_levels_are_named_in_the_legend_not_on_the_curves(monkeypatch):
    """E3's black rules (the paper's full recovery at 1.0, a third, none) are named in a legend under the plot: no
    text on the plot, where the refit curves reaching full recovery ran over "paper: head + last layer"."""
    from tests.test_dashboard import charts_on

    at = render(monkeypatch, SHIPPED, "refit")
    assert at.selectbox(key="metric").value == "recovery"
    spec = charts_on(at)[0]
    texts = [lay for lay in spec["layer"] if mark_type(lay) == "text"]
    assert not [lay for lay in texts if any("paper:" in str(r.get("label")) for r in rows_of(spec, lay))]
    dash = layer(spec, "reference-level")["encoding"]["strokeDash"]
    assert dash["field"] == "label" and dash["legend"] is not None
    assert "paper: head + last layer, full recovery" in dash["scale"]["domain"]
    assert any("Black rules, named in the legend" in c.value for c in at.caption)


@needs_shipped
def test_the_ladders_y_domain_holds_every_ci_bound(monkeypatch, tmp_path):
    """E5's ladder (and the rescale recovery per rung): every CI bound inside the y domain, with room (a bound on the
    frame reads as cut), every rung and the paper's rule inside the x domain; the PNG export draws the same spec."""
    import shutil

    from dashboard import charts
    from tests.test_dashboard import charts_on

    root = tmp_path / "results"  # the `cpu` page with the 19M rung beside its own, as while the CPU ladder's probe
    shutil.copytree(SHIPPED, root, ignore=shutil.ignore_patterns("runs", "refits", "jobs", "locks"))  # read R1
    probe = json.loads((root / "cpu-ladder" / "recipe-probe.json").read_text())
    (root / "cpu-ladder" / "recipe-probe.json").write_text(json.dumps(probe | dict(adopted="R1", below_bar=False)))
    at = render(monkeypatch, root, "agreement", preset="cpu", level="hardest held-out")
    ladders = [spec for spec in charts_on(at) if "ci" in {lay.get("name") for lay in spec["layer"]}]
    assert len(ladders) == 2  # the surgery's damage per rung, the rescale's recovery per rung
    for spec in ladders:
        drawn = rows_of(spec, layer(spec, "ci"))
        low, high = min(r["ci_low"] for r in drawn), max(r["ci_high"] for r in drawn)
        domains = [
            lay["encoding"]["y"]["scale"]["domain"] for lay in spec["layer"] if "field" in lay["encoding"].get("y", {})
        ]
        assert len(domains) == len(spec["layer"]) - 2 and all(d == domains[0] for d in domains)  # less the paper's two
        y0, y1 = domains[0]
        assert y0 < min(low, 0) and y1 > high, (domains[0], low, high)
        x0, x1 = layer(spec, "ci")["encoding"]["x"]["scale"]["domain"]
        assert x0 < min(r["params"] for r in drawn) and x1 > max(r["params"] for r in drawn)
    assert max(r["ci_high"] for r in rows_of(ladders[0], layer(ladders[0], "ci"))) > 0.5  # the case that was cut
    import pandas as pd

    points = pd.DataFrame({"series": ["n = 4 (T)"] * 2, "params": [1e4, 1e6], "steps": ["2000"] * 2,
                           "mean": [0.55, 0.2], "ci_low": [0.4, -0.1], "ci_high": [0.71, 0.3],
                           "n": [4, 4]})  # fmt: skip
    exported = spec_of(charts.titled(charts.ladder_chart(points, 19e6), "title"))
    y0, y1 = layer(exported, "ci")["encoding"]["y"]["scale"]["domain"]
    assert y0 < -0.1 and y1 > 0.71


@needs_shipped
def test_the_norm_ratio_table_shows_every_column_in_its_half_of_the_page(monkeypatch):
    """The state-norm growth table and the top-token table sit in half-page columns: at 1400 px about 460 px (both
    scrolled sideways before, 651 and 689 px wide in Chromium). Every column has a width and together they fit
    (views.HALF_PAGE_PX), so none is cut or hidden behind a horizontal scroll."""
    from dashboard import views

    at = render(monkeypatch, SHIPPED, "norms")
    (ratios,) = [d for d in at.dataframe if "worst seed max/min" in d.value.columns]
    (tokens,) = [d for d in at.dataframe if "norm->none" in d.value.columns]  # the top tokens: a column per mode
    for table in (ratios, tokens):
        config = json.loads(table.proto.columns)
        widths = {c: config.get(c, {}).get("width") for c in table.value.columns}
        assert all(isinstance(w, int) for w in widths.values()), widths
        assert sum(widths.values()) <= views.HALF_PAGE_PX < 460, widths
    labels = [json.loads(ratios.proto.columns)[c]["label"] for c in ratios.value.columns]
    assert max(len(label) for label in labels) <= 8, labels  # short headings: the caption says what they are
    assert list(tokens.value["n"]) == list(range(1, 13))  # a row per step n: 12 steps never widen the table


@needs_shipped
def test_streamlits_untitled_chart_png_is_hidden(monkeypatch):
    """Streamlit's chart toolbar offers an untitled "Download as PNG" beside each figure's titled export: the app's
    style block hides it, by the label Streamlit's installed frontend gives that button."""
    import streamlit

    at = render(monkeypatch, SHIPPED, "runs")
    styles = " ".join(h.proto.body for h in at.get("html") if "<style>" in h.proto.body)
    hide = re.search(r'\[data-testid=stElementToolbar\] button\[aria-label\^="([^"]+)"\] \{ display: none', styles)
    assert hide, styles
    bundle = Path(streamlit.__file__).parent / "static" / "static" / "js"
    chart = " ".join(p.read_text(errors="ignore") for p in bundle.glob("ArrowVegaLiteChart.*.js"))
    toolbar = " ".join(p.read_text(errors="ignore") for p in bundle.glob("Toolbar.*.js"))
    assert f"label:`{hide.group(1)}`" in chart and "stElementToolbar`" in toolbar


def test_a_probe_record_from_before_its_ranges_still_holds_its_rung_back(tmp_path):
    """A record written before the probe stored `seeds` and `mean_range` (2026-12-06): its scores, no range (the
    dashboard does not recompute the rule's), and its open probe still keeps the rung out."""
    from dashboard import results

    probe = json.loads((SHIPPED / "cpu-ladder" / "recipe-probe.json").read_text())
    del probe["seeds"]
    for c in probe["candidates"].values():
        del c["mean_range"]
    probe["adopted"] = None
    (tmp_path / "cpu-ladder").mkdir()
    (tmp_path / "cpu-ladder" / "recipe-probe.json").write_text(json.dumps(probe))
    rows = results.probe_rows("cpu-ladder", tmp_path)
    assert [r["candidate"] for r in rows] == list(probe["candidates"])
    assert {r["mean over seeds 0–3"] for r in rows} == {"—"}
    assert results.probe_open("cpu-ladder", tmp_path).startswith("The `cpu-ladder` study's recipe probe has adopted no")


def test_an_open_recipe_probe_keeps_its_rung_out_of_the_ladder_and_its_rules(monkeypatch, tmp_path):
    """The CPU ladder's study before its recipe probe adopts a recipe: its own 19M rows are a rejected candidate's
    probe runs. The E5 page and the report say so, draw the ladder without them and show no verdict of the rules;
    once a recipe is adopted, the rules' table is back."""
    import shutil

    from dashboard import report
    from tests.test_dashboard import charts_on, render

    root = tmp_path / "results"
    shutil.copytree(SHIPPED, root, ignore=shutil.ignore_patterns("runs", "refits", "jobs", "locks"))
    shutil.copytree(SHIPPED / "cpu-ladder" / "runs", root / "cpu-ladder" / "runs")  # weightless: the probe's losses
    probe = json.loads((root / "cpu-ladder" / "recipe-probe.json").read_text())
    probe |= dict(adopted=None, below_bar=False)  # the shipped record as it stood before the probe adopted a recipe
    (root / "cpu-ladder" / "recipe-probe.json").write_text(json.dumps(probe))
    at = render(monkeypatch, root, "agreement", preset="cpu-ladder")
    assert any("adopted no recipe yet" in w.value for w in at.warning)
    assert not [d for d in at.dataframe if "claim" in d.value.columns]  # no rules table
    assert not [m for m in at.markdown if "19,024,384 params" in m.value]  # no verdict from the probe's runs
    from dashboard import matrix, results

    assert results.claims("e5", "cpu-ladder", root)["claims"] == []
    e5_rows = [r for r in matrix.rows("cpu-ladder", root) if r["experiment"] == "e5"]
    assert [r["claim"] for r in e5_rows] == ["ladder", "rescale"]  # the parts it runs, not 1-2
    assert all(r["note"].startswith("waits for the recipe probe") for r in e5_rows)

    def params_drawn(at) -> set:
        return {row.get("params") for spec in charts_on(at) for rows in (spec.get("datasets") or {}).values()
                for row in rows}  # fmt: skip

    def steps_drawn(at, params: int) -> set:  # training lengths drawn at a rung: 2,000 the `cpu` study's, 4,000 own
        return {row.get("steps") for spec in charts_on(at) for rows in (spec.get("datasets") or {}).values()
                for row in rows if row.get("params") == params}  # fmt: skip

    drawn = params_drawn(at)
    assert 412_288 in drawn and 19_024_384 not in drawn  # the CPU study's rungs, not the probe's
    html = "".join(report.ladder_rules_html(root, "cpu-ladder"))
    assert "adopted no recipe yet" in html and "<table" not in html
    seen = results.probe_rows("cpu-ladder", root)  # the probe itself, seed by seed, on the page and in the report
    assert [r["candidate"] for r in seen] == list(probe["candidates"]) and at.expander
    r1 = probe["candidates"]["R1"]["scores"]
    assert [seen[0][f"seed {s}"] for s in range(4)] == [f"{x:.4f}" for x in r1] + ["—"] * (4 - len(r1))
    for row, c in zip(seen, probe["candidates"].values(), strict=True):  # the range the rule read, as written
        low, high = c["mean_range"]
        assert row["mean over seeds 0–3"] == (f"{low:.3f}" if low == high else f"{low:.3f}–{high:.3f} "
                                               f"({len(c['scores'])} of 4 seeds)")  # fmt: skip
    assert "the recipe probe, seed by seed" in "".join(report.probe_html(root, "cpu-ladder"))
    drawn_losses = {(row["candidate"], int(row["seed"])) for spec in charts_on(at)  # the probe's loss curves
                    for rows in (spec.get("datasets") or {}).values() for row in rows
                    if "candidate" in row}  # fmt: skip
    assert drawn_losses == {(n, s) for n, c in probe["candidates"].items() for s in range(len(c["runs"]))}
    below = all(c["outcome"] == "rejected" for c in probe["candidates"].values())
    assert ("recipe below the bar" in html) == below  # every candidate rejected: the rule's best of them is pending
    probe["adopted"] = "R1"
    (root / "cpu-ladder" / "recipe-probe.json").write_text(json.dumps(probe))
    html = "".join(report.ladder_rules_html(root, "cpu-ladder"))
    assert "<table" in html and "<strong>What it says about the paper's collapse.</strong>" in html
    monkeypatch.setattr(report, "study_html", lambda *args, **kwargs: [])  # the cards' figures are not what is read
    chosen = report.html(root, "cpu-ladder")  # `loopscope report --preset cpu-ladder`: the study chosen, not beside
    assert "the rules over both devices' ladders" in chosen and "the recipe probe, seed by seed" in chosen
    monkeypatch.undo()
    at = render(monkeypatch, root, "agreement", preset="cpu-ladder")
    assert 19_024_384 in params_drawn(at) and not at.warning
    assert [m for m in at.markdown if m.value.startswith("**What it says about the paper's collapse.**")]
    assert steps_drawn(at, 412_288) == {"2000", "4000"}  # R1 is the `cpu` study's: its rungs continue this ladder's
    assert results.claims("e5", "cpu-ladder", root)["claims"]  # adopted: the verdicts are back
    assert not [r for r in matrix.rows("cpu-ladder", root) if r["note"].startswith("waits")]
    assert not [i for i in at.info if "Recipe below the bar" in i.value]
    probe["below_bar"] = True  # adopted as the best of candidates that all missed the bar: labelled so
    (root / "cpu-ladder" / "recipe-probe.json").write_text(json.dumps(probe))
    html = "".join(report.ladder_rules_html(root, "cpu-ladder"))
    assert "<b>Recipe below the bar.</b>" in html and "<table" in html
    at = render(monkeypatch, root, "agreement", preset="cpu-ladder")
    assert [i for i in at.info if "Recipe below the bar" in i.value and "R1, for every rung" in i.value]
    assert results.probe_rows("cpu-ladder", root)[0]["outcome"].endswith("adopted as the best (recipe below the bar)")
    probe["adopted"] = "R2"  # another recipe than the `cpu` study's: its rungs no longer continue this ladder
    (root / "cpu-ladder" / "recipe-probe.json").write_text(json.dumps(probe))
    assert results.ladder_partner("cpu-ladder", root) is None and results.ladder_partner("cpu", root) is None
    at = render(monkeypatch, root, "agreement", preset="cpu-ladder")
    assert steps_drawn(at, 412_288) == {"4000"}  # this study's own rung to 412k, not the `cpu` study's
    assert [d for d in at.dataframe if "claim" in d.value.columns]
    assert "trained the rungs to 412k itself" in report.html(root)


@needs_shipped
def test_a_verdict_opens_on_the_per_seed_values_its_rule_read(monkeypatch):
    """Issue 60, item 3: ?verdict=e4:equal n:parity opens E4's "equal n" verdict on parity with its rule, and its
    table is the shipped table's held-out accuracy per seed and n, recomputed here from the Parquet file."""
    import pandas as pd

    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(SHIPPED))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=300)
    at.query_params["verdict"] = "e4:equal n:parity"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [w for w in at.warning if "names nothing" in w.value]  # the overview's own parameter
    picked = at.selectbox(key="verdict_pick")
    assert picked.format_func(picked.value).startswith("E4 (equal n) · parity · ")
    assert any(m.value.startswith("**Claim:** looping is better than stacking") for m in at.markdown)
    shown = at.dataframe[-1].value
    rows = pd.read_parquet(SHIPPED / "e4-cpu.parquet")
    rows = rows[(rows["task"] == "parity") & (rows["metric"] == "accuracy") & (rows["split"] == "heldout")]
    level = [c for c in at.markdown if c.value.startswith("**Claim:**")][0].value
    if "hardest held-out" in level:  # the rule's level: its hardest held-out difficulty alone
        rows = rows[rows["difficulty"] == rows["difficulty"].max()]
    want = rows.groupby(["arch", "boundary", "seed", "eval_loops"])["value"].mean()
    assert set(shown["arch"]) == {"looped", "stacked"} and len(shown) == want.droplevel(-1).index.nunique()
    for _, r in shown.sample(5, random_state=0).iterrows():
        n = int(r.dropna().index[-1].removeprefix("n="))  # the row's last n
        assert r[f"n={n}"] == pytest.approx(want[(r["arch"], r["run mode"], r["seed"], n)])


@needs_shipped
def test_runs_side_by_side_default_to_a_twin_pair_and_diff_their_configs(monkeypatch):
    """Issue 60, item 3: the Runs page's compare view opens on the first run and its twin trained with the other
    boundary; its curves are each run's own rows averaged over the held-out items, and the config difference is
    the boundary alone."""
    from dashboard import data
    from tests.test_dashboard import charts_on

    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(SHIPPED))
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=300)
    at.run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    pair = at.multiselect(key="compare").value
    assert len(pair) == 2
    diff = at.dataframe[1].value
    assert list(diff["field"]) == ["model.boundary"] and set(diff.iloc[0, 1:]) == {"none", "norm"}
    drawn = [row for spec in charts_on(at) for rows in (spec.get("datasets") or {}).values() for row in rows
             if row.get("run", "").startswith(pair[0][:8]) and "eval_loops" in row]  # fmt: skip
    _, rows, _ = data.run_detail(pair[0])
    rows = rows[(rows["metric"] == "accuracy") & (rows["split"] == "heldout")]
    want = rows.groupby(["boundary", "eval_loops"])["value"].mean()
    assert drawn and len(drawn) == len(want)
    for row in drawn:
        assert row["value"] == pytest.approx(want[(row["boundary"], row["eval_loops"])])
