"""End to end in a real browser: `streamlit run` on smoke results, a deep link restores the view, a widget
change rewrites the URL, the CSV and PNG downloads arrive, and a screenshot is kept for a person to look at."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from engine.core.store import Store
from engine.experiments import e2

CHROMIUM = Path("/usr/bin/chromium")
APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
SCREENSHOT = Path("/tmp/loopscope-dashboard.png")

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="the pip package `playwright` is not installed (pip install playwright)"
)
if not CHROMIUM.exists():
    pytest.skip(
        "no /usr/bin/chromium (apt-get install -y chromium); `playwright install` cannot download here",
        allow_module_level=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`streamlit run dashboard/app.py` on 127.0.0.1 over E2 smoke results; yields its base URL."""
    root = tmp_path_factory.getbasetemp() / "loopscope-smoke"  # shared with test_dashboard: cached runs are reused
    e2.run("smoke", [0, 1], Store(root), tasks=("parity",), progress=False)
    port = free_port()
    log = open(tmp_path_factory.mktemp("streamlit") / "server.log", "w")  # noqa: SIM115 (closed below)
    command = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true"]
    command += ["--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"]
    proc = subprocess.Popen(command, env=dict(os.environ, LOOPSCOPE_RESULTS=str(root)), stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit did not start; see {log.name}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=args)
        yield chromium
        chromium.close()


def download_button(page, label: str):
    """The first figure's own download button (not the chart toolbar's "Download as PNG")."""
    return page.get_by_test_id("stDownloadButton").get_by_role("button", name=label, exact=True).first


def test_deep_link_widget_change_downloads_and_screenshot(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 1900}, accept_downloads=True)
    page.set_default_timeout(60_000)
    page.goto(f"{server}/accuracy?task=parity&difficulty=5&modes=none&modes=norm-%3Enone&seeds=true")
    page.get_by_role("heading", name="Accuracy vs depth").wait_for()
    page.get_by_test_id("stVegaLiteChart").first.wait_for()

    # the deep link restored the view
    assert page.get_by_role("combobox", name=re.compile(r"^difficulty")).input_value() == "5"
    pills = page.get_by_test_id("stButtonGroup").first.locator("button")
    pressed = {b.inner_text(): b.get_attribute("aria-pressed") for b in pills.all() if b.inner_text()}
    assert pressed == {"norm": "false", "none": "true", "norm->none": "true"}
    assert page.get_by_test_id("stCheckbox").filter(has_text="per-seed lines").locator("input").is_checked()

    # a widget change is written back into the URL, and the second panel (Cliff's delta) appears
    pills.filter(has_text=re.compile(r"^norm$")).click()
    page.wait_for_url(re.compile(r"modes=norm(&|$)"))
    page.get_by_test_id("stVegaLiteChart").nth(1).wait_for()
    page.get_by_text("Cliff's δ per n").wait_for()

    # the figure's data as CSV, and the PNG rendered on demand
    with page.expect_download() as csv:
        download_button(page, "CSV").click()
    assert csv.value.suggested_filename == "e2-smoke-parity-accuracy-5.csv"
    header = Path(csv.value.path()).read_text().splitlines()[0]
    assert {"series", "eval_loops", "mean", "ci_low", "ci_high", "n", "ci_method"} <= set(header.split(","))
    with page.expect_download() as png:
        download_button(page, "PNG").click()
    assert Path(png.value.path()).read_bytes().startswith(b"\x89PNG")

    page.wait_for_timeout(500)  # let the charts finish drawing
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    shutil.copyfile(shot, SCREENSHOT)
    assert shot.stat().st_size > 10_000
    page.close()


def test_run_page_submit_polls_progress_and_cancels(server, browser):
    """A job submitted from the Run page shows live progress (the fragment polls the job file) and cancels."""
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.set_default_timeout(60_000)
    page.goto(f"{server}/run")
    page.get_by_role("heading", name="Run", exact=True).wait_for()
    seeds = page.get_by_label("seeds", exact=True).and_(page.get_by_role("textbox"))
    seeds.fill("1")
    seeds.press("Enter")
    steps = page.get_by_label("steps", exact=True).and_(page.get_by_role("spinbutton"))
    steps.fill("5000")  # not the cached 300-step run: this one trains (and is cancelled long before the end)
    steps.press("Enter")
    page.get_by_role("button", name="Submit").click()
    page.get_by_text(re.compile(r"Job \w+ submitted")).wait_for()
    page.get_by_text(re.compile(r"step \d+ of 5000")).wait_for()  # no click needed: the page polls
    page.get_by_role("button", name="Cancel").click()
    page.get_by_text(re.compile(r"^cancelled; submit again")).wait_for()
    page.close()
