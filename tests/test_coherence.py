"""Issue 32: every number shown means one thing. On the shipped second study (`cpu`): the norms page and claim (d)'s
card read one norm-ratio definition; every figure of every page and of the report plots the verdicts' inputs at the
level it names; E5's part-2 chart tells its distributions apart and its refit labels do not overprint; cards print
no Python values; the post-hoc statistics (E4's TOST, E3's plateau status, the ladder on common seeds, E5's exact
zeros) are there and equal an independent computation. Browser-only checks are in tests/test_browser_coherence.py."""

import ast
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from engine.experiments import REGISTRY, verdicts

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "cached_results"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SHIPPED / "e5-cpu.parquet").exists(), reason="no shipped second study"),
]


@pytest.fixture(scope="module")
def e2() -> pd.DataFrame:
    return pd.read_parquet(SHIPPED / "e2-cpu.parquet")


@pytest.fixture(scope="module")
def e5_rows() -> pd.DataFrame:
    return pd.read_parquet(SHIPPED / "e5-cpu.parquet")


def shipped_claims(table: str) -> list[dict]:
    return json.loads((SHIPPED / "verdicts.json").read_text())["tables"][table]["found"]["claims"]


def held_out_mean(rows: pd.DataFrame, metric: str, by: list[str]) -> pd.DataFrame:
    """Independently of the dashboard: per seed the metric averaged over the held-out in-range difficulties, then
    the mean over seeds (the verdict rules' level (i))."""
    held = rows[(rows["split"] == "heldout") & (rows["metric"] == metric)]
    per_seed = held.groupby([*by, "seed"])["value"].mean()
    return per_seed.groupby(by).mean().rename("expected").reset_index()


# ---------------------------------------------------------------- item 1: the norm ratio


def test_claim_d_card_and_the_norms_page_give_one_norm_ratio(e2):
    from dashboard import data, views

    rows = e2.assign(range=np.where(e2["split"] == "beyond", "beyond", "in-range"))
    for task in ("parity", "chain"):
        card = next(
            c
            for c in shipped_claims("e2-cpu.parquet")
            if (c["task"], c["claim"], c["level"]) == (task, "d", verdicts.MEAN)
        )
        part = rows[(rows["task"] == task) & data.level_mask(rows, verdicts.MEAN)]
        table = views.norm_growth_table(part, ["norm->none"])
        at_t = table[table["steps"] == "1..4 (T)"].iloc[0]
        # independently: per seed, the held-out mean norm per step, max/min over steps 1..T
        cut = part[(part["boundary"] == "norm->none") & (part["metric"] == "norm_post") & (part["eval_loops"] <= 4)]
        per_step = cut.groupby(["seed", "eval_loops"])["value"].mean().groupby("seed")
        ratios = per_step.max() / per_step.min()
        assert at_t["worst seed max/min"] == pytest.approx(ratios.max())
        assert at_t["median max/min"] == pytest.approx(ratios.median())
        assert at_t["within 3×"] == f"{int((ratios <= 3).sum())} of {len(ratios)}"
        # the card says the same numbers, and says which statistic each is
        assert f"norm ratio {ratios.max():.2f}x at the worst seed" in card["measured"]
        assert f"median {ratios.median():.2f}x" in card["measured"]
    parity = next(
        c
        for c in shipped_claims("e2-cpu.parquet")
        if (c["task"], c["claim"], c["level"]) == ("parity", "d", verdicts.MEAN)
    )
    assert "4.06x at the worst seed" in parity["measured"] and "9 of 16 within 3x" in parity["measured"]


# ---------------------------------------------------------------- item 2: E5's charts


def svg_of(chart) -> str:
    from dashboard import charts

    return charts.to_svg(chart).decode()


def e5_slice(e5_rows, task="parity"):
    from engine.experiments import e5

    summary = e5.summarize(e5_rows, "cpu")
    s = summary[(summary["task"] == task) & (summary["level"] == verdicts.MEAN)]
    return e5.own_scale(s), int(s["trained_loops"].iloc[0])


def test_e5_part_2_draws_each_distribution_and_mode_as_its_own_line(e5_rows):
    from dashboard import charts

    at_scale, T = e5_slice(e5_rows)
    acc = at_scale[(at_scale["part"] == "accuracy") & at_scale["quantity"].isin(["norm", "none"])]
    chart, _ = charts.e5_range(acc.sort_values("eval_loops"), T)
    svg = svg_of(chart)
    lines = re.findall(r'<path[^>]*aria-roledescription="line mark"[^>]*>', svg)
    styles = {(re.search(r'stroke="([^"]+)"', p).group(1), (re.search(r'stroke-dasharray="([^"]+)"', p) or [0, ""])[1])
              for p in lines}  # fmt: skip
    assert len(styles) == 6  # three distributions x two modes
    assert len({color for color, _ in styles}) == 3 and len({dash for _, dash in styles}) == 2


def test_e5_rescale_refit_labels_do_not_overprint(e5_rows):
    from dashboard import charts

    at_scale, T = e5_slice(e5_rows)
    rescale = at_scale[(at_scale["part"] == "rescale") & (at_scale["train_loops"] == f"fixed:{T}")]
    labels = ["E3 head, 800 steps", "E3 head+first, 800 steps", "E3 head+last, 800 steps"]
    refits = pd.DataFrame({"x": [float(T)] * 3, "y": [0.366, 0.980, 1.016], "label": labels})
    chart, _ = charts.e5_rescale(rescale[rescale["eval_loops"] >= T].sort_values("eval_loops"), T, refits)
    svg = svg_of(chart)
    ys = {}
    for label in refits["label"]:
        match = re.search(r'<text[^>]*transform="translate\(([-\d.]+),([-\d.]+)\)"[^>]*>' + re.escape(label), svg)
        assert match, label
        ys[label] = float(match.group(2))
    close = abs(ys["E3 head+first, 800 steps"] - ys["E3 head+last, 800 steps"])
    assert close >= 11  # a line of 11 px text apart, not on top of each other


# ---------------------------------------------------------------- item 7, 8: cards, imports


def test_no_card_prints_a_python_value():
    for name, entry in json.loads((SHIPPED / "verdicts.json").read_text())["tables"].items():
        for c in entry["found"]["claims"]:
            assert not re.search(r"\b(True|False|None|nan)\b", c["measured"]), (name, c["measured"])


def test_results_and_report_do_not_import_each_other():
    def imports(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        return found

    assert "dashboard.report" not in imports(ROOT / "dashboard" / "results.py")
    assert "dashboard.results" in imports(ROOT / "dashboard" / "report.py")  # one direction only


def test_two_seed_curves_draw_no_band():
    from dashboard import charts

    stats = pd.DataFrame({"series": ["norm"] * 3, "eval_loops": [1, 2, 3], "mean": [0.5, 0.6, 0.7],
                          "ci_low": [0.4, 0.5, 0.6], "ci_high": [0.6, 0.7, 0.8], "n": [2, 2, 5],
                          "ci_method": ["BCa"] * 3})  # fmt: skip
    band = next(layer for layer in charts.curves(stats, "eval_loops", "n", "acc").layer if layer.name == "ci-band")
    assert list(band.data["eval_loops"]) == [3]
    assert "No band where a point has fewer than 3 seeds" in charts.caption(2, ["BCa"])


# ---------------------------------------------------------------- item 10: post-hoc statistics


def test_e5_agreement_and_run_effects_are_exactly_zero_at_n_1(e5_rows):
    from engine.experiments import e5

    effects = e5.decompose(e5.seed_accuracy(e5_rows))
    at_one = effects[(effects["eval_loops"] == 1) & effects["effect"].isin(["run", "agreement"])]
    assert len(at_one) and (at_one["value"] == 0.0).all()
    summary = e5.summarize(e5_rows, "cpu")
    rows = summary[(summary["part"] == "effects") & (summary["eval_loops"] == 1)]
    rows = rows[rows["quantity"].isin(["run", "agreement"])]
    assert (rows["mean"] == 0.0).all() and (rows["wilcoxon_p"] == 1.0).all()


def test_e4_paired_vanishes_shows_a_tost_beside_it():
    rows = pd.read_parquet(SHIPPED / "e4-cpu.parquet")
    want = ("parity", "matched", "paired", verdicts.MEAN)
    found = REGISTRY["e4"].claims(rows, "cpu")
    claim = next(c.as_dict() for c in found if (c.task, c.claim, c.analysis, c.level) == want)
    assert claim["outcome"] == "vanishes"  # the committed rule's outcome stays
    # independently: per seed looped at n = T*o minus stacked at n = o, held-out mean, norm mode
    acc = rows[(rows["split"] == "heldout") & (rows["metric"] == "accuracy") & (rows["boundary"] == "norm")]
    acc = acc[acc["task"] == "parity"].groupby(["arch", "eval_loops", "seed"])["value"].mean()
    ps = []
    for o in (1, 2, 3):
        gap = (acc["looped"][4 * o] - acc["stacked"][o]).to_numpy()
        lower = sps.ttest_1samp(gap, -0.02, alternative="greater").pvalue
        upper = sps.ttest_1samp(gap, 0.02, alternative="less").pvalue
        ps.append(max(lower, upper))
    assert f"TOST equivalence within ±0.02 (paired t) p {', '.join(f'{p:.3g}' for p in ps)}" in claim["measured"]
    assert "Post hoc, not the rule" in claim["measured"] and ps[1] > 0.05 and ps[2] > 0.05


def test_e3_last_layer_claim_says_each_targets_plateau_status():
    rows = pd.read_parquet(SHIPPED / "e3-cpu.parquet")
    claim = next(c.as_dict() for c in REGISTRY["e3"].claims(rows, "cpu")
                 if (c.task, c.claim, c.level) == ("parity", "last layer", verdicts.MEAN))  # fmt: skip
    rec = rows[(rows["metric"] == "recovery") & (rows["difficulty"] == 0) & (rows["eval_loops"] == 4)]
    rec = rec[rec["task"] == "parity"]
    for target in ("head+last", "head+first"):
        curve = rec[rec["refit_target"] == target].groupby("refit_steps")["value"].mean()
        moved = curve.iloc[-1] - curve.iloc[-2]
        flat = all(abs(d) < 0.02 for d in np.diff(curve.to_numpy()[-3:]))
        state = "plateaued" if flat else "still moving"
        assert f"{target} {state} ({moved:+.3f} over the last doubling of steps)" in claim["measured"]
    assert "head+first still moving" in claim["measured"]


def test_the_ladder_shows_e2s_model_on_the_other_rungs_seeds(e5_rows):
    ladder = next(c for c in shipped_claims("e5-cpu.parquet")
                  if (c["task"], c["claim"], c["level"]) == ("parity", "ladder", verdicts.MEAN))  # fmt: skip
    acc = e5_rows[(e5_rows["split"] == "heldout") & (e5_rows["metric"] == "accuracy")]
    acc = acc[(acc["task"] == "parity") & (acc["train_loops"] == "fixed:4") & (acc["params"] == 105792)]
    acc = acc[acc["train_steps"] == acc["train_steps"].min()]
    per_seed = acc.groupby(["boundary", "eval_loops", "seed"])["value"].mean()
    for n in (4, 12):
        damage = per_seed["norm"][n] - per_seed["norm->none"][n]
        assert f"n={n} {damage[damage.index < 4].mean():+.3f}" in ladder["measured"].split("seeds 0–3 only:")[1]
    assert "+0.399" in ladder["measured"] and "+0.088" in ladder["measured"]


# ---------------------------------------------------------------- every figure at the level it names


def expected_for(experiment: str, rows: pd.DataFrame, stats: pd.DataFrame, metric: str) -> pd.Series:
    """The verdicts' inputs (per seed over the held-out in-range difficulties, then the mean over seeds) for the
    series and x of a figure's plotted table."""
    if experiment == "e2":
        want = held_out_mean(rows, metric, ["boundary", "eval_loops"])
        key = stats["series"].str.rpartition(", ")[2] if "series" in stats else stats["boundary"]
        merged = stats.assign(boundary=key).merge(want, on=["boundary", "eval_loops"])
    else:  # e4 at n: looped `mode`, stacked `mode` (norm->none for none)
        want = held_out_mean(rows, metric, ["arch", "boundary", "eval_loops"])
        arch, mode = stats["series"].str.split(", ").str[0], stats["series"].str.split(", ").str[1]
        boundary = np.where((arch == "stacked") & (mode == "none"), "norm->none", mode)
        merged = stats.assign(arch=arch, boundary=boundary).merge(want, on=["arch", "boundary", "eval_loops"])
    assert len(merged) == len(stats)
    return merged


@pytest.fixture(scope="module")
def page_figures(tmp_path_factory) -> dict[str, list[dict]]:
    """Every page's default view on the shipped results (AppTest), each figure as ui.figure received it."""
    from streamlit.testing.v1 import AppTest

    from dashboard import ui

    mp = pytest.MonkeyPatch()
    mp.setenv("LOOPSCOPE_RESULTS", str(SHIPPED))
    mp.setenv("LOOPSCOPE_CACHE", str(tmp_path_factory.mktemp("cache")))
    seen: list[dict] = []
    original = ui.figure
    mp.setattr(ui, "figure", lambda chart, table, name, caption, title=None: seen.append(
        dict(chart=chart, table=table, name=name, caption=caption, title=title)) or original(
        chart, table, name, caption, title))  # fmt: skip
    found = {}
    for page in ("accuracy", "norms", "stacked", "refit", "agreement", "ouro"):
        seen.clear()
        at = AppTest.from_file(str(ROOT / "dashboard" / "app_pages" / f"{page}.py"), default_timeout=300)
        at.query_params["task"] = "parity"
        at.run()
        assert not at.exception, (page, at.exception)
        found[page] = list(seen)
    mp.undo()
    return found


def test_every_page_figure_names_its_study_task_and_level_and_plots_the_verdict_inputs(page_figures, e2):
    e4 = pd.read_parquet(SHIPPED / "e4-cpu.parquet")
    checked = 0
    for page, figures in page_figures.items():
        assert figures, page
        for f in figures:
            assert f["title"], (page, f["name"])  # an export says what it shows: study, task, level
            if page != "ouro":
                assert "parity" in f["title"] and ("study cpu" in f["title"] or "E5" in f["title"]), f["title"]
            level_named = verdicts.MEAN in f["title"] or verdicts.MEAN in f["caption"]
            assert level_named or page == "ouro", (page, f["name"])
            table = f["table"]
            if page in ("accuracy", "norms") and "mean" in table and "eval_loops" in table and "series" in table:
                metric = (
                    "norm_post"
                    if "norm_post" in f["name"]
                    else "top_token_share"
                    if "top_token" in f["name"]
                    else "accuracy"
                )
                merged = expected_for("e2", e2[e2["task"] == "parity"], table, metric)
                np.testing.assert_allclose(merged["mean"], merged["expected"], rtol=1e-12, atol=1e-12)
                checked += 1
            if page == "stacked" and "mean" in table and "eval_loops" in table and "series" in table:
                merged = expected_for("e4", e4[e4["task"] == "parity"], table, "accuracy")
                np.testing.assert_allclose(merged["mean"], merged["expected"], rtol=1e-12, atol=1e-12)
                checked += 1
    assert checked >= 4
    # the E5 figures plot e5.summarize's rows, the table the E5 verdicts read, at the level the page names
    from engine.experiments import e5

    summary = e5.summarize(pd.read_parquet(SHIPPED / "e5-cpu.parquet"), "cpu")
    for f in page_figures["agreement"]:
        table = f["table"]
        if "part" in table:
            keys = ["part", "quantity", "train_loops", "level", "eval_loops", "params", "train_steps"]
            merged = table.merge(summary, on=[*keys, "task"], suffixes=("", "_verdict"))
            assert len(merged) == len(table) and (merged["level"] == verdicts.MEAN).all()
            np.testing.assert_allclose(merged["mean"], merged["mean_verdict"], equal_nan=True)


def test_every_report_figure_plots_the_verdict_inputs_at_the_level_it_names(e2):
    from dashboard import report

    e4 = pd.read_parquet(SHIPPED / "e4-cpu.parquet")
    figures = (
        report.e2_figures(e2, "cpu")
        + report.e4_figures(e4, "cpu")
        + report.e5_figures(pd.read_parquet(SHIPPED / "e5-cpu.parquet"), "cpu")
    )
    assert any(t.startswith("E5 ·") for t, _, _ in figures)
    for title, chart, caption in figures:
        assert "held-out" in title + caption, title
        mean = next((layer.data for layer in chart.layer if layer.name == "mean" and "series" in layer.data), None)
        if title.startswith("E2") and "accuracy per n" in title:
            merged = expected_for("e2", e2[e2["task"] == title.split()[2].rstrip(":")], mean, "accuracy")
            np.testing.assert_allclose(merged["mean"], merged["expected"], rtol=1e-12)
        if title.startswith("E4") and "mode norm" in title:
            task = title.split()[2].rstrip(":")
            ratio_1 = mean[(mean["series"] == "looped, norm") & (mean["overshoot_ratio"] == 1)]["mean"].iloc[0]
            want = held_out_mean(e4[(e4["task"] == task) & (e4["arch"] == "looped") & (e4["boundary"] == "norm")],
                                 "accuracy", ["eval_loops"]).set_index("eval_loops")["expected"][4]  # fmt: skip
            assert ratio_1 == pytest.approx(want, abs=1e-12)
    chain = next(c for t, c, _ in figures if t.startswith("E4 · chain") and "mode norm" in t)
    data = next(layer.data for layer in chain.layer if layer.name == "mean")
    assert data[(data["series"] == "looped, norm") & (data["overshoot_ratio"] == 1)]["mean"].iloc[0] == 1.0


def test_a_line_style_legend_draws_its_dashes(e5_rows):
    """The mode legend of E5 part 2 shows a solid and a dashed stroke (a filled symbol hid them: issue 32 item 2)."""
    from dashboard import charts

    at_scale, T = e5_slice(e5_rows)
    acc = at_scale[(at_scale["part"] == "accuracy") & at_scale["quantity"].isin(["norm", "none"])]
    svg = svg_of(charts.e5_range(acc.sort_values("eval_loops"), T)[0])
    stroke = re.compile(r'd="M-([\d.]+),0L\1,0"')  # a legend's stroke symbol, as long as its symbolSize makes it
    symbols = [p for p in re.findall(r"<path[^>]*>", svg) if 'stroke="#333333"' in p and stroke.search(p)]
    dashes = {re.search(r'stroke-dasharray="([^"]+)"', p).group(1) for p in symbols}
    assert len(symbols) == 2 and len(dashes) == 2, symbols
    assert not [p for p in symbols if re.search(r'fill="(?!transparent|none)', p)], symbols
