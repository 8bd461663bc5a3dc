"""Issue 32 in Chromium, on the shipped results: every page loads with every host but the dashboard's own blocked
(no request leaves the server), a shared link whose parameters no longer match says which one was ignored and what
is shown instead, and the changed views are kept as screenshots ($LOOPSCOPE_SCREENSHOTS, else a test folder)."""

import os
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM, run_ended, streamlit_server

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "cached_results"
PAGES = ("", "accuracy", "norms", "refit", "stacked", "ouro", "runs", "run", "agreement")

playwright_api = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SHIPPED / "e5-cpu.parquet").exists(), reason="no shipped second study"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from streamlit_server(SHIPPED, tmp_path_factory)


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium")
    with playwright_api.sync_playwright() as p:
        args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=args)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("LOOPSCOPE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def offline_page(browser, outside: list[str]):
    """A page on which every request to a host other than the dashboard's is recorded and refused."""
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.set_default_timeout(300_000)

    def route(r):
        url = r.request.url
        if url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")):
            r.continue_()
        else:
            outside.append(url)
            r.abort()

    page.route("**/*", route)
    return page


def test_every_page_makes_no_request_beyond_its_own_server(server, browser):
    outside: list[str] = []
    page = offline_page(browser, outside)
    for path in PAGES:
        page.goto(f"{server}/{path}")
        page.get_by_test_id("stHeading").first.wait_for()
        run_ended(page)
        page.wait_for_timeout(1500)  # late requests (the tab icon, fonts) have had their chance
        assert page.get_by_test_id("stException").count() == 0, path
    assert outside == []
    page.close()


BAD_LINKS = {  # a link that no longer matches: each parameter named on the page, with what is shown instead
    "accuracy?task=Parity&difficulty=99&metric=bogus": ["`task=Parity`", "`difficulty=99`", "`metric=bogus`"],
    "refit?n=abc&preset=x": ["`n=abc`", "`preset=x`"],
    "runs?run=0000000000000000": ["`run=0000000000000000`"],
}


@pytest.mark.parametrize("link", list(BAD_LINKS))
def test_a_stale_link_says_which_parameter_was_ignored_and_what_is_shown(server, browser, link):
    page = offline_page(browser, [])
    page.goto(f"{server}/{link}")
    page.get_by_test_id("stHeading").first.wait_for()
    for parameter in BAD_LINKS[link]:  # each widget's notice appears as the run reaches it
        page.get_by_test_id("stAlert").filter(has_text=parameter.strip("`")).first.wait_for()
    run_ended(page)
    notices = " ".join(page.get_by_test_id("stAlert").all_inner_texts())
    for parameter in BAD_LINKS[link]:
        assert parameter.strip("`") in notices and "ignored" in notices and "is shown instead" in notices, notices
    page.close()


def element_shot(page, locator, path: Path) -> None:
    locator.scroll_into_view_if_needed()
    page.wait_for_timeout(800)
    locator.screenshot(path=str(path))
    assert path.stat().st_size > 1_000


def test_screenshots_of_the_changed_views(server, browser, shots):
    page = offline_page(browser, [])
    page.goto(f"{server}/norms?task=parity")
    page.get_by_text("State-norm growth, one definition").wait_for()
    run_ended(page)
    table = page.get_by_test_id("stDataFrame").first
    table.scroll_into_view_if_needed()
    table.wait_for(state="visible")
    element_shot(page, table, shots / "norms-parity-ratio-table.png")
    page.close()
    page = offline_page(browser, [])  # a fresh tab per view: a page switch leaves the old page's elements stale
    page.goto(f"{server}/agreement?task=parity")
    page.get_by_role("heading", name="4 · The rescale surgery").wait_for()
    charts = page.get_by_test_id("stVegaLiteChart")
    charts.nth(3).wait_for()
    run_ended(page)
    element_shot(page, charts.nth(1), shots / "agreement-parity-part2.png")
    element_shot(page, charts.nth(3), shots / "agreement-parity-rescale.png")
    page.close()
    page = offline_page(browser, [])
    page.goto(f"{server}/accuracy?task=Parity&difficulty=99")
    page.get_by_test_id("stAlert").first.wait_for()
    run_ended(page)
    page.screenshot(path=str(shots / "accuracy-stale-link.png"))
    page.close()
