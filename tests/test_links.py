"""Links (issue 43 item 6). (a) A link's parameter that names nothing on its page (`/accuracy?n=abc`,
`/stacked?x=ratio`) is named in a notice above the page, as the text it is (dashboard/app.py, ui.as_text), as a bad
value of a known parameter is (ui._link_notice). (b) A deep link logs no 404 in the browser's console: Streamlit's
front end, not told where the app's root is, first asks `/<page>/_stcore/health` and `/<page>/_stcore/host-config`;
dashboard.serve names the root in the page it serves (serve.BackendBase), so it asks the root alone."""

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow  # AppTest renders of the shipped results, a served dashboard and Chromium

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "cached_results"
APP = ROOT / "dashboard" / "app.py"
needs_shipped = pytest.mark.skipif(not (SHIPPED / "e4-cpu.parquet").exists(), reason="no shipped results")


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path_factory.getbasetemp() / "verdict-cache"))


def warnings_on(monkeypatch, root: Path, page: str, **query) -> list[str]:
    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(root))
    at = AppTest.from_file(str(APP), default_timeout=600)
    at.query_params.update(query)
    at.run()
    at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return [w.value for w in at.warning]


# ---------------------------------------------------------------- (a) unknown parameters


@needs_shipped
@pytest.mark.parametrize(
    ("page", "query", "said"),
    [
        ("accuracy", {"n": "abc"}, "This link's n=abc names nothing on this page: ignored."),
        ("stacked", {"x": "ratio"}, "This link's x=ratio names nothing on this page: ignored."),
        # a visitor's text is shown as text: every punctuation mark escaped, so no link, emphasis or HTML, and a WORD
        # JOINER after the scheme so that no autolink reads the address (dashboard.results.JOINER)
        (
            "stacked",
            {"x": "**b**[a](http://e.x)<i>"},
            r"x=\*\*b\*\*\[a\]\(http" + "\u2060" + r"\:\/\/e\.x\)\<i\> names nothing",
        ),
        ("accuracy", {"_k_": "v"}, r"This link's \_k\_=v names nothing on this page"),
    ],
)
def test_a_link_parameter_that_names_nothing_is_named_as_text(monkeypatch, page, query, said):
    warnings = warnings_on(monkeypatch, SHIPPED, page, **query)
    assert [w for w in warnings if said in w], warnings


@needs_shipped
def test_unknown_and_bad_parameters_are_each_named_once(monkeypatch):
    """A bad value of a known parameter in its widget's notice, the unknown one in the notice above the page."""
    warnings = warnings_on(monkeypatch, SHIPPED, "stacked", axis="bogus", x="ratio")
    assert len([w for w in warnings if "axis=bogus" in w]) == 1 and "matches no x axis" in " ".join(warnings)
    assert [w for w in warnings if "axis" not in w] == ["This link's x=ratio names nothing on this page: ignored."]


@needs_shipped
def test_the_study_a_one_study_page_shows_is_not_called_unknown(monkeypatch, tmp_path):
    shutil.copyfile(SHIPPED / "e2-cpu.parquet", tmp_path / "e2-cpu.parquet")
    assert not [w for w in warnings_on(monkeypatch, tmp_path, "accuracy", preset="cpu") if "preset" in w]


# ---------------------------------------------------------------- (b) no 404 in a deep link's console


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`python -m dashboard.serve` (the project's server) over E2 at the smoke preset and the first study's shipped
    E2 table (two studies: `preset` is a selector); yields its base URL."""
    from tests.test_browser import streamlit_server
    from tests.test_dashboard import smoke_results

    results = tmp_path_factory.mktemp("links-results")
    shutil.copytree(smoke_results(tmp_path_factory), results, dirs_exist_ok=True)
    if (SHIPPED / "e2-cpu-1layer.parquet").exists():
        shutil.copyfile(SHIPPED / "e2-cpu-1layer.parquet", results / "e2-cpu-1layer.parquet")
    yield from streamlit_server(results, tmp_path_factory, serve=True)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install -y chromium)")
def test_a_deep_link_logs_no_404_and_its_page_links_stay_at_the_root(served):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed")
    from tests.test_browser import run_ended

    with sync_api.sync_playwright() as p:
        args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=args)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(300_000)
            console, failed = [], []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
            page.goto(f"{served}/accuracy?preset=smoke")
            page.get_by_role("heading", name="Accuracy vs depth", exact=True).wait_for()
            run_ended(page)
            page.wait_for_timeout(1500)  # late requests have had their chance
            assert failed == [] and not [m for m in console if "404" in m], (failed, console)
            assert page.get_by_test_id("stException").count() == 0
            page.get_by_test_id("stSidebarNav").get_by_role("link", name="Norm trajectories").click()
            page.get_by_role("heading", name="Norm trajectories", exact=True).wait_for()
            assert page.url.split("?")[0] == f"{served}/norms"  # the app's root stayed the root
            run_ended(page)
            assert failed == [] and not [m for m in console if "404" in m], (failed, console)
        finally:
            browser.close()
