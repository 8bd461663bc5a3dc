"""`loopscope report`: one self-contained HTML page of the shipped results, opened from disk in Chromium with
networking off: every figure (inline SVG) draws with a nonzero size, and every claim of the engine has a card."""

from pathlib import Path

import pandas as pd
import pytest

from dashboard import results
from dashboard.report import chosen_tables, own_studies
from dashboard.results import catalog
from engine.cli import main
from engine.experiments import REGISTRY

SHIPPED = Path(__file__).resolve().parents[1] / "cached_results"
CHROMIUM = Path("/usr/bin/chromium")
PRESET = "cpu-1layer"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SHIPPED / "e2-cpu-1layer.parquet").exists(), reason="no shipped results"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert main(["report", "--out", str(out), "--results", str(SHIPPED), "--preset", PRESET]) == 0
    return out / "index.html"


def expected_cards() -> int:
    """The cards the report shows for the engine's claims (REGISTRY[e].claims) of each table it shows, at PRESET
    where it has a table (E1's at its first): one per (task, claim), E5's too, both levels in one card (none for a
    study whose recipe probe is open: its verdicts are withheld)."""
    count = 0
    shown = [(e, p, SHIPPED) for e, p in chosen_tables(SHIPPED, PRESET).items()]
    shown += [(e, s, results.study_root(SHIPPED, s)) for s in own_studies(SHIPPED, PRESET)
              for e, p in catalog(SHIPPED).items() if s in p]  # fmt: skip
    for experiment, preset_name, folder in shown:
        if experiment == "e5" and results.probe_open(preset_name, SHIPPED):  # withheld while its probe is open
            continue
        if experiment in REGISTRY:
            rows = pd.read_parquet(folder / f"{experiment}-{preset_name}.parquet")
            found = REGISTRY[experiment].claims(rows, preset_name)
            count += len({(c.task, c.claim) for c in found})  # E5's too: both levels in one card
    return count


def test_the_report_is_one_self_contained_file(report):
    text = report.read_text()
    assert list(report.parent.iterdir()) == [report]
    for outside in ("<script", "<link", "src=", "@import", "url("):
        assert outside not in text, outside
    assert text.count('class="card claim') == expected_cards() >= 12
    assert "Provenance" in text and "loopscope run e2 --preset cpu-1layer" in text
    assert "could not" not in text


def test_the_report_renders_offline_in_chromium(report):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed")
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium")
    requested = []
    with sync_api.sync_playwright() as p:
        args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1300, "height": 1000})
            context.route("**/*", lambda route: (requested.append(route.request.url), route.continue_()))
            page = context.new_page()
            page.goto(report.as_uri())
            boxes = page.eval_on_selector_all(
                "figure svg", "els => els.map(e => [e.getBoundingClientRect().width, e.getBoundingClientRect().height])"
            )
            marks = page.eval_on_selector_all("figure svg", "els => els.map(e => e.querySelectorAll('path').length)")
            cards = page.locator(".card.claim").count()
            titles = page.locator("figure h3").all_inner_texts()
        finally:
            browser.close()
    assert [u for u in requested if not u.startswith("file://")] == []  # nothing but the file itself
    assert len(boxes) == len(titles) >= 10
    for title, (width, height), paths in zip(titles, boxes, marks, strict=True):
        assert width > 100 and height > 100 and paths > 3, (title, width, height, paths)
    assert cards == expected_cards()
    for prefix in ("E1 ·", "E2 ·", "E3 ·", "E4 ·"):
        assert any(t.startswith(prefix) for t in titles), prefix


def test_the_overview_offers_the_same_report(monkeypatch, report, tmp_path):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(SHIPPED))
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path))
    app = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
    at = AppTest.from_file(app, default_timeout=120)
    at.query_params["study"] = PRESET
    at.run()
    assert not at.exception
    (button,) = [b for b in at.get("download_button") if b.proto.label == "Download report"]
    from dashboard import report as module

    offered = module.html_bytes(PRESET)  # what the button's callable returns for the chosen study (on click)
    drop_date = lambda t: t.split("written", 1)[0] + t.split("UTC.", 1)[1]  # noqa: E731  (the time it was written)
    assert drop_date(offered.decode()) == drop_date(report.read_text())


def test_a_second_design_table_gets_the_verdict_rules_cards_and_the_paired_figure(tmp_path_factory):
    """Held-out rows: cards from engine.experiments.verdicts (both analyses, both levels), as the overview's."""
    from dashboard import report as static
    from dashboard import results
    from tests.test_dashboard import relabel_heldout, smoke_results

    root = relabel_heldout(smoke_results(tmp_path_factory), tmp_path_factory.mktemp("heldout-report"))
    for extra in [*root.glob("e[34]-*.parquet"), *root.glob("e1-*")]:
        extra.unlink()  # E2 alone: its cards are counted below
    text = static.html(root)
    cards = results.rule_cards("e2", results.claims_of("e2", pd.read_parquet(root / "e2-smoke.parquet"), "smoke")[1])
    assert text.count('class="card claim rule"') == len(cards) >= 4
    assert "Paired analysis (per-seed differences, Wilcoxon, Holm)" in text and "hardest held-out: " in text
    assert "E2 · parity: paired per seed, none − norm" in text
    assert "Items: held-out items, difficulties 3, 4." in text


# ---------------------------------------------------------------- issue 60, item 5: one study a report, laid out as the
# pages; E5 cards by task; figures by task; E3's diamonds on the rescale figure


def headings(text: str, level: int) -> list[str]:
    import html
    import re

    return [html.unescape(re.sub(r"<[^>]+>", "", h)) for h in re.findall(rf"<h{level}[^>]*>(.*?)</h{level}>", text)]


@pytest.mark.parametrize("study", ["cpu-ladder", "cpu-agree", "cpu-1layer"])
def test_a_preset_reports_its_own_study_only(study):
    """`loopscope report --preset cpu-ladder` headed "study cpu-ladder" but showed the `cpu` study's matrix and E2-E4
    cards, and every study of its own folder after it: each table a --preset report reads is the study's own (E1's,
    named by its model, excepted), and no other study gets a section."""
    chosen = chosen_tables(SHIPPED, study)
    assert chosen and {p for e, p in chosen.items() if e != "e1"} == {study}
    assert own_studies(SHIPPED, study) == []


def test_the_ladder_report_is_its_own_with_its_rules_on_the_first_screen(monkeypatch):
    """The ladder's report: its matrix (E5 only), no E2-E4 card of another study, and its rules (trend, collapse per
    rung, the reading with the rescale verdicts) and its damage figure in the Overview, before the first page's
    part; the rules' heading says "both devices" only where the ladder spans two devices (here it does not)."""
    from dashboard import report as static

    read = []
    real = pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda path, *a, **k: read.append(Path(path)) or real(path, *a, **k))
    monkeypatch.setattr(static, "_svg", lambda chart: "<svg></svg>")
    text = static.html(SHIPPED, "cpu-ladder")
    assert {p.name for p in read} <= {"e5-cpu-ladder.parquet", "e5-cpu.parquet", "e1-demo.parquet"}  # cpu: partner
    assert 'class="card claim rule"' not in text  # no E2-E4 card: the ladder runs none of them
    assert "e2-cpu.parquet" not in text and "study-cpu-agree" not in text
    overview = text.split("<h2")[1]  # from "Overview" to the first page's heading
    assert overview.startswith(">Overview</h2>")
    assert "ladder trend at n=4" in overview and "collapse 19,024,384 params" in overview
    assert "What it says about the paper's collapse." in overview
    assert "E5 · parity: the surgery's damage against scale" in overview.replace("&#x27;", "'")
    assert "cpu-ladder · the GPU study's rules over the ladder" in headings(text, 3)
    assert "both devices" not in text
    partner = results.ladder_partner("cpu-ladder", SHIPPED)  # None: the probe adopted another recipe than `cpu`'s
    assert ("Rungs from the <code>cpu</code> study&#x27;s table" in text) == (partner == "cpu")
    assert ("trained its lower rungs itself" in overview) == (partner is None)


def test_the_report_is_laid_out_as_the_pages(report):
    """The report's parts in the order of the dashboard's pages (dashboard/app.py), each headed by its page's title."""
    from dashboard.report import PAGES

    shown = headings(report.read_text(), 2)
    titles = [t for _, t in PAGES]
    pages = [h for h in shown if h in titles]
    assert pages == [t for t in titles if t in pages]
    assert pages[:6] == ["Overview", "Accuracy vs depth", "Norm trajectories", "Readout refit (E3)",
                         "Looped vs stacked (E4)", "Ouro (E1)"]  # fmt: skip
    assert shown[-2:] == ["Provenance", "Reproduce"]


def test_e5_cards_pair_tasks_and_name_the_mean_first():
    """One E5 card per claim and task, both levels inside it, the held-out mean first; parity beside chain in each
    row of the grid (the cards were paired by level: parity's hardest beside parity's mean)."""
    import re

    from dashboard import report as static

    rows = pd.read_parquet(SHIPPED / "e5-cpu.parquet", columns=["seed"])
    cards, problem = static._cards_html("e5", rows, "cpu", SHIPPED)
    assert problem is None
    titles = re.findall(r'<div class="card claim"><b>(.*?)</b>', cards)
    assert len(titles) >= 8 and len(titles) == cards.count('class="card claim"')
    cells = re.findall(r'<div class="card claim"><b>.*? · (\w+)</b>|<div></div>', cards)
    assert [c or "-" for c in cells[0::2]] == ["parity"] * (len(cells) // 2)  # left column: parity
    assert {c or "-" for c in cells[1::2]} <= {"chain", "-"}
    for card in cards.split('<div class="card claim">')[1:]:
        assert card.index("held-out mean:") < card.index("hardest held-out:")


def test_figures_group_by_task_and_the_rescale_figure_carries_e3s_diamonds(monkeypatch):
    """Each page's figures grouped by task, parity first (a two-column grid paired chain's third figure with parity's
    first); E5's rescale figure draws E3's refits at n = T, as the Agreement page does."""
    from dashboard import report as static

    monkeypatch.setattr(static, "_svg", lambda chart: "<svg></svg>")
    figures = static.e5_figures(pd.read_parquet(SHIPPED / "e5-cpu.parquet"), "cpu", root=SHIPPED)
    tasks = [static.page_of(t)[1] for t, _, _ in figures]
    assert tasks == sorted(tasks, key=["parity", "chain"].index) and set(tasks) == {"parity", "chain"}
    for task in ("parity", "chain"):
        (chart,) = [c for t, c, _ in figures if t == f"E5 · {task}: rescale surgery recovery (held-out mean)"]
        spec = chart.to_dict()
        labels = {r.get("label") for rows in spec.get("datasets", {}).values() for r in rows if "label" in r}
        assert any(str(label).startswith("E3 ") for label in labels), (task, labels)
    mixed = [("E2 · chain: a", None, ""), ("E2 · parity: b", None, ""), ("E2 · chain: c", None, ""),
             ("E2 · parity: d", None, "")]  # fmt: skip
    text = static._figures_html(mixed)
    shown = ["parity", "E2 · parity: b", "E2 · parity: d", "chain", "E2 · chain: a", "E2 · chain: c"]
    assert headings(text, 3) == shown
    assert text.count('<h3 class="task">') == 2


def test_a_study_report_reads_no_other_study(monkeypatch):
    """The overview's download (html_bytes of the chosen study) builds that study alone: the `cpu-agree` report read
    the `cpu` study's four tables and both other studies' E5 before (about 9 of the 34 s: summaries and rules)."""
    from dashboard import report as static

    read = []
    real = pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda path, *a, **k: read.append(Path(path)) or real(path, *a, **k))
    monkeypatch.setattr(static, "_svg", lambda chart: "<svg></svg>")
    text = static.html(SHIPPED, "cpu-agree")
    assert {p.name for p in read} <= {"e5-cpu-agree.parquet", "e1-demo.parquet"}
    assert "study-cpu-ladder" not in text and "The GPU study (" not in text
