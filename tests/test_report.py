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
    where it has a table, else at its largest preset (E5 exists at `cpu` only): one per (task, claim), E5's one per
    claim and level (none for a study whose recipe probe is open: its verdicts are withheld)."""
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
            count += len(found) if experiment == "e5" else len({(c.task, c.claim) for c in found})
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
