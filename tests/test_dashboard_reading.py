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
def test_the_ladder_studys_first_screen_says_its_decisive_outcomes(monkeypatch):
    """Issue 60, item 4: `?study=cpu-ladder` opened on nine rows of "not part of the study" and never said "flat" or
    "no collapse". Now its own rows come first, with the ladder rules' trend (at T and 3T) and collapse (E2 (d)'s
    criteria per rung) and the rescale's outcome; the rows it did not run are one folded row after them; its figure
    (the surgery's damage per rung, the E5 page's) is beside the matrix."""
    at = render(monkeypatch, SHIPPED, study="cpu-ladder")
    body = next(h.proto.body for h in at.get("html") if 'class="verdicts"' in h.proto.body)
    text = re.sub(r"<[^>]+>", " ", body.replace("&#x27;", "'"))
    assert "not part of" in text and body.count("not part of") == 1  # one folded row
    elsewhere = text.index("not part of")
    for said in ("the damage's trend with scale", "flat", "b = +0.012 per decade", "no collapse", "8 of 8 rungs",
                 "agreement", "recovers 0.797 … 0.998"):  # fmt: skip
        assert said in text and text.index(said) < elsewhere, said
    assert "E2 (a), (b), (c); E3" in text and "E2 (a), (b), (c), (d)" not in text  # (d) is the collapse row's
    assert "<th>chain" not in body  # a study of parity alone
    from tests.test_dashboard import charts_on

    (ladder,) = [c for c in charts_on(at) if "paper" in {lay.get("name") for lay in c["layer"]}]
    assert {lay.get("name") for lay in ladder["layer"]} >= {"ci", "mean", "paper-label"}


@needs_shipped
def test_the_train_x_run_studys_contrast_is_on_its_matrix_and_undecided(monkeypatch):
    """`?study=cpu-agree`: its decisive contrast (accuracy and margin at n = T) and the outcome they share are rows
    of its matrix, undecided while fewer than 16 seed pairs are stored (the rule's own outcome), before the folded
    row of what it did not run."""
    at = render(monkeypatch, SHIPPED, study="cpu-agree")
    body = next(h.proto.body for h in at.get("html") if 'class="verdicts"' in h.proto.body)
    text = re.sub(r"<[^>]+>", " ", body)
    elsewhere = text.index("not part of")
    for said in ("train × run contrast", "agreement or state-norm growth", "undecided", "norm→none loses",
                 "of 16 seed pairs so far"):  # fmt: skip
        assert said in text and text.index(said) < elsewhere, said
    assert "holds" not in text[:elsewhere]


@needs_shipped
def test_the_e5_page_says_what_g_r_and_m_are_where_its_verdicts_use_them(monkeypatch):
    """Issue 60, item 7: the E5 first screen's verdicts say "G significant …" with G, R and M undefined there."""
    at = render(monkeypatch, SHIPPED, "agreement")
    assert any(m.value.startswith("**train x run**") and " G " in m.value for m in at.markdown)
    words = [c.value for c in at.caption if "**G**, the agreement effect" in c.value]
    assert words and "**R**, the run-mode effect" in words[0] and "**M**, the train-mode effect" in words[0]


def test_the_matrix_folds_what_a_study_did_not_run_and_reads_the_ladder_rules():
    """matrix.apart / folded / with_ladder / compact on hand-made rows and rules."""
    from dashboard import matrix

    rules = [{"claim": "ladder trend at n=4", "outcome": "flat", "measured": "b = +0.012 per decade [-0.040, +0.059] "
              "over 8 rungs"}, {"claim": "ladder trend at n=12", "outcome": "grows", "measured": "b = +0.100 per "
              "decade [+0.060, +0.140] over 8 rungs"},
             {"claim": "collapse 15,904 params (cpu)", "outcome": "no collapse", "measured": ""},
             {"claim": "collapse 19,024,384 params (cpu)", "outcome": "collapses", "measured": ""}]  # fmt: skip
    rows = [{"experiment": "e2", "claim": c, "label": f"E2 ({c})", "paper": "", "cells": {}, "note": "not part of the "
             "`x` study"} for c in "abcd"] + [{"experiment": "e5", "claim": "ladder", "label": "E5 3", "paper": "",
             "cells": {"parity": [], "chain": None}, "note": ""}]  # fmt: skip
    own, elsewhere = matrix.apart(rows)
    assert [r["claim"] for r in own] == ["ladder"] and len(elsewhere) == 4
    own, elsewhere = matrix.with_ladder(own, elsewhere, rules)
    assert [r["claim"] for r in own] == ["ladder", "ladder trend", "ladder collapse"]
    assert [r["claim"] for r in elsewhere] == ["a", "b", "c"]  # E2 (d): the collapse row applies its criteria
    trend, collapse = own[1]["cells"]["parity"], own[2]["cells"]["parity"]
    assert [(e["prefix"], e["outcome"]) for e in trend] == [("at T", "flat"), ("at 3T", "grows")]
    assert [(e["outcome"], e["number"]) for e in collapse] == [("collapses", "1 of 2 rungs (19,024,384 params)"),
                                                               ("no collapse", "1 of 2 rungs")]  # fmt: skip
    (one,) = matrix.folded(elsewhere, "x")
    assert one["label"] == "E2 (a), (b), (c)" and one["note"].startswith("not part of the `x` study")
    rungs = [{"prefix": f"{p} params", "outcome": "agreement", "number": f"recovers {v}", "hardest": ""}
             for p, v in (("1", "0.9"), ("2", "0.8"), ("3", "0.95"), ("4", "0.99"))]  # fmt: skip
    (entry,) = matrix.compact({"cells": {"parity": rungs}})["cells"]["parity"]
    assert entry == {"prefix": "4 of 4 rungs", "outcome": "agreement", "number": "recovers 0.8 … 0.99", "hardest": ""}
    mixed = [*rungs[:3], rungs[3] | {"outcome": "normalisation"}]
    assert matrix.compact({"cells": {"parity": mixed}})["cells"]["parity"] == mixed
    assert matrix.tasks_run(own) == ("parity",)
    assert "<th>chain" not in matrix.matrix_html(own, "x", tasks=("parity",))


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
    """The budget label sits above the plot's frame, off every curve (at the foot it crossed the state norm and E4's
    δ at o = 1; issue 60), the chance rule carries no text, and Cliff's δ keeps room for a point and its CI at ±1
    and at the first and last n."""
    import pandas as pd

    from dashboard import charts

    stats = pd.DataFrame({"series": ["norm"] * 3, "eval_loops": [1, 2, 3], "mean": [0.5, 1.0, 1.0],
                          "ci_low": [0.4, 1.0, 1.0], "ci_high": [0.6, 1.0, 1.0], "n": [4] * 3,
                          "ci_method": ["bca"] * 3})  # fmt: skip
    spec = spec_of(charts.curves(stats, "eval_loops", "n", "accuracy", budgets=charts.budget_rules(2), chance=0.5))
    label = layer(spec, "budget-label")
    y_px = spec["datasets"][label["data"]["name"]][0]["y_px"]
    assert y_px < 0 and label["mark"]["baseline"] == "bottom"  # its foot above the frame's top: off the plot
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


def test_the_compare_view_has_one_colour_a_mode_and_one_dash_a_set(monkeypatch):
    """Issue 60, item 6: the compare view's series legend listed `norm · a` and `norm · b` with identical swatches and
    its dash legend was cut off. Now the colour names the mode (each once), the dash the set (each its own dash, the
    legend stacked and unclipped)."""
    import pandas as pd

    from dashboard import views

    stats = pd.DataFrame({"series": ["norm", "none"], "eval_loops": [1, 1], "mean": [0.5, 0.6], "ci_low": [0.4, 0.5],
                          "ci_high": [0.6, 0.7], "n": [4, 4], "ci_method": ["bca"] * 2})  # fmt: skip
    seeds = pd.DataFrame({"series": ["norm"], "seed": [0], "eval_loops": [1], "value": [0.5]})
    shown = {}

    def figure(chart, data, name, caption, title=None):
        shown.setdefault("spec", spec_of(chart))

    monkeypatch.setattr(views.ui, "figure", figure)
    views.compare_section({"cpu": (stats, seeds), "cpu-1layer": (stats, seeds)}, "eval_loops", "n", "y", "x", "")
    mean = layer(shown["spec"], "mean")["encoding"]
    colours = mean["color"]["scale"]["domain"]
    assert sorted(colours) == ["none", "norm"]  # one entry a mode, not one a (mode, set)
    dash = mean["strokeDash"]
    assert dash["scale"]["domain"] == ["cpu", "cpu-1layer"]
    assert len({json.dumps(d) for d in dash["scale"]["range"]}) == 2  # two different dashes in the swatches
    assert dash["legend"]["direction"] == "vertical" and dash["legend"]["labelLimit"] == 0


def test_the_budget_label_is_off_the_delta_and_paired_charts():
    """ "n = T" sat on E4's δ point at o = 1 (the foot of the plot, where δ = −1 is drawn): above the frame now."""
    import pandas as pd

    from dashboard import charts

    summary = pd.DataFrame({"overshoot_ratio": [1.0, 2.0], "delta": [-1.0, -1.0], "delta_ci_low": [-1.0, -1.0],
                            "delta_ci_high": [-1.0, -1.0], "magnitude": ["large"] * 2,
                            "p_value": [0.01] * 2})  # fmt: skip
    budgets = charts.budget_rules(1.0, "n = T")
    for chart in (charts.delta_chart(summary, "overshoot_ratio", "o", budgets),
                  charts.paired_chart(summary.assign(mean_diff=-1.0, ci_low=-1.0, ci_high=-1.0),
                                      pd.DataFrame({"seed": [0], "overshoot_ratio": [1.0], "diff": [-1.0]}),
                                      "overshoot_ratio", "o", "d", budgets)):  # fmt: skip
        spec = spec_of(chart)
        label = layer(spec, "budget-label")
        assert all(r["y_px"] < 0 for r in spec["datasets"][label["data"]["name"]])
        assert label["mark"]["baseline"] == "bottom"


def test_no_empty_band_layer():
    """A curve whose every point averages fewer than MIN_BAND_SEEDS seeds (E1's probe, one model) has no band layer:
    an empty one made Vega warn "Infinite extent for field ci_low" in the browser (Ouro page)."""
    import pandas as pd

    from dashboard import charts

    stats = pd.DataFrame({"series": ["norm"] * 2, "eval_loops": [1, 2], "mean": [0.5, 0.6], "ci_low": [0.5, 0.6],
                          "ci_high": [0.5, 0.6], "n": [1, 1], "ci_method": ["degenerate"] * 2})  # fmt: skip
    spec = spec_of(charts.curves(stats, "eval_loops", "n", "accuracy (fraction)"))
    names = [lay.get("name") for lay in spec["layer"]]
    assert "ci-band" not in names and layer(spec, "mean")["encoding"]["y"]["title"] == "accuracy (fraction)"


def ladder_points(steps=("4000",)):
    import pandas as pd

    rows = []
    for params, steps_ in zip((15_904, 1_627_392, 19_024_384), [*steps, *[steps[-1]] * 3], strict=False):
        rows += [{"series": "n = 12 (3T)", "params": params, "steps": steps_, "mean": -0.1, "ci_low": -0.4,
                  "ci_high": 0.1, "n": 4},
                 {"series": "n = 4 (T)", "params": params, "steps": steps_, "mean": 0.3, "ci_low": 0.17,
                  "ci_high": 0.45, "n": 4}]  # fmt: skip
    return pd.DataFrame(rows)


def test_the_papers_size_is_marked_beside_the_ladder_not_through_its_top_rung():
    """Issue 60, item 4: the paper's 19M was a dashed rule through the 19M rung's points and intervals. It is a marker
    and its label in a band at the top of the plot that no point or interval reaches."""
    from dashboard import charts

    spec = spec_of(charts.ladder_chart(ladder_points(), 19e6))
    y0, y1 = layer(spec, "ci")["encoding"]["y"]["scale"]["domain"]
    top = max(r["ci_high"] for r in rows_of(spec, layer(spec, "ci")))
    top_px = charts.HEIGHT * (y1 - top) / (y1 - y0)  # the highest interval's end, in px from the frame's top
    for name in ("paper", "paper-label"):
        mark = layer(spec, name)
        assert mark["mark"]["type"] != "rule" and "value" in mark["encoding"]["y"]
        assert 0 < mark["encoding"]["y"]["value"] < top_px - 6  # above every interval, by more than half a marker


def test_the_ladder_has_no_one_entry_legend_and_lists_t_before_3t():
    """ "● 4000", a legend of one entry, goes; the loop counts are listed n = T, then 3T (was 3T first)."""
    from dashboard import charts

    spec = spec_of(charts.ladder_chart(ladder_points(), 19e6))
    mean = layer(spec, "mean")["encoding"]
    assert mean["shape"].get("legend", "absent") is None  # one training length: no legend
    assert mean["color"]["scale"]["domain"] == ["n = 4 (T)", "n = 12 (3T)"]
    assert mean["color"]["legend"] is not None
    two = spec_of(charts.ladder_chart(ladder_points(("2000", "4000")), 19e6))
    assert layer(two, "mean")["encoding"]["shape"]["legend"] is not None  # two training lengths: their legend
    one_n = ladder_points()
    spec = spec_of(charts.ladder_chart(one_n[one_n["series"] == "n = 4 (T)"], 19e6))
    assert layer(spec, "mean")["encoding"]["color"].get("legend", "absent") is None


def test_e3s_refits_sit_beside_the_rescale_curve_not_on_its_axis():
    """Issue 60, item 6: part 4's E3 markers sat on the y axis (x = T, the domain's first value) with their labels over
    the curve. The axis now starts REFIT_MARGIN steps before T (its ticks at T on), the markers at T inside the plot,
    their labels to their left, in the margin no curve enters."""
    import pandas as pd

    from dashboard import charts

    rescale = pd.DataFrame({"eval_loops": [4, 5, 6], "mean": [0.87, 0.8, 0.6], "ci_low": [0.8, 0.7, 0.3],
                            "ci_high": [0.93, 0.9, 0.8], "n": [9] * 3, "ci_method": ["bca"] * 3})  # fmt: skip
    refits = pd.DataFrame({"x": [4.0] * 2, "y": [0.37, 1.0], "label": ["E3 head", "E3 head+last"]})
    spec = spec_of(charts.e5_rescale(rescale, 4, refits)[0])
    x = layer(spec, "mean")["encoding"]["x"]
    assert x["scale"]["domain"][0] < 4 - 1 and x["axis"]["values"][0] == 4
    labels = [lay for lay in spec["layer"] if str(lay.get("name", "")).startswith("reference-label-")]
    assert len(labels) == 2 and all(lay["mark"]["align"] == "right" and lay["mark"]["dx"] < 0 for lay in labels)
    alone = spec_of(charts.e5_rescale(rescale, 4)[0])
    assert layer(alone, "mean")["encoding"]["x"]["scale"]["domain"][0] == 3.5  # without refits: half a step


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
    assert "the recipe probe, seed by seed" in chosen  # the rules sit in the study's own overview (study_html)
    assert "cpu-ladder · the GPU study's rules over the ladder" in "".join(report.rules_html(root, "cpu-ladder"))
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
    assert "trained its lower rungs itself" in report.html(root)


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
