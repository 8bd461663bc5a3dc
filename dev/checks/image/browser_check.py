"""Chromium against the loopscope container (dev/checks/image-check.sh): cold start to first render, the overview,
one deep link and the read-only Run page.

    python dev/checks/image/browser_check.py URL [--shots DIR] -- COMMAND...

The browser is launched first; then COMMAND (the `docker run -d ...` that starts the container) runs, and the
clock starts with it: health is polled until /_stcore/health answers, then the overview is opened. Prints one
line per check with its time; exits non-zero at the first failure.
"""

import argparse
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
DEEP_LINK = "/accuracy?task=chain&difficulty=6&seeds=true"


def say(what: str, t0: float | None = None) -> None:
    clock = f" ({time.monotonic() - t0:.1f} s after docker run)" if t0 is not None else ""
    print(f"browser: {what}{clock}", flush=True)


def no_error_on(page, where: str) -> None:
    """The app draws errors as stException / 'could not be drawn' messages, never as a crash."""
    if page.get_by_test_id("stException").count():
        raise AssertionError(f"{where}: an exception is shown: {page.get_by_test_id('stException').first.inner_text()}")
    if page.get_by_text("could not be drawn").count():
        raise AssertionError(f"{where}: {page.get_by_text('could not be drawn').first.inner_text()}")


def wait_healthy(url: str, t0: float, proc_check, limit: float = 300) -> None:
    while True:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            pass
        proc_check()
        if time.monotonic() - t0 > limit:
            raise TimeoutError(f"{url}/_stcore/health did not answer within {limit:.0f} s")
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--shots", type=Path, help="keep screenshots here (default: none kept)")
    parser.add_argument("--alive", help="shell command that fails once the container has exited")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    opts, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    url = opts.url.rstrip("/")

    def alive() -> None:
        if opts.alive and subprocess.run(opts.alive, shell=True).returncode != 0:
            raise RuntimeError("the container exited before it became healthy (its log is printed below)")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(120_000)
        say("chromium launched")

        t0 = time.monotonic()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        say("container started", t0)
        wait_healthy(url, t0, alive)
        t_health = time.monotonic() - t0
        say("/_stcore/health answers ok", t0)

        # cold: the first page of a fresh container (Python imports, first data load, first cache fill)
        page.goto(f"{url}/")
        page.get_by_role("heading", name="loopscope: does depth stay reusable?").wait_for()
        t_title = time.monotonic() - t0
        say("overview: title drawn (first render)", t0)
        page.get_by_role("heading", name=re.compile(r"^E3 · readout refit")).wait_for()
        page.get_by_text("Paper:").first.wait_for()
        page.get_by_text(re.compile(r"^E2 \(")).first.wait_for()
        page.wait_for_timeout(500)
        no_error_on(page, "overview")
        t_full = time.monotonic() - t0
        say(f"overview: all cards drawn ({page.get_by_text('Paper:').count()} claim cards)", t0)
        if opts.shots:
            page.screenshot(path=str(opts.shots / "overview.png"), full_page=True)

        # warm: the same page again in a new tab (the server's caches are filled now)
        t1 = time.monotonic()
        page2 = browser.new_page(viewport={"width": 1400, "height": 1600})
        page2.set_default_timeout(60_000)
        page2.goto(f"{url}/")
        page2.get_by_role("heading", name=re.compile(r"^E3 · readout refit")).wait_for()
        t_warm = time.monotonic() - t1
        page2.close()
        say(f"overview again, warm: all cards drawn in {t_warm:.1f} s")

        # one deep link: the view in the URL is restored
        t1 = time.monotonic()
        page.goto(f"{url}{DEEP_LINK}")
        page.get_by_role("heading", name="Accuracy vs depth").wait_for()
        page.get_by_test_id("stVegaLiteChart").first.wait_for()
        page.get_by_role("heading", name=re.compile(r"^chain: accuracy per n \(hops k = 6")).wait_for()
        task = page.get_by_role("combobox", name=re.compile(r"^task")).input_value()
        difficulty = page.get_by_role("combobox", name=re.compile(r"^difficulty")).input_value()
        seeds = page.get_by_test_id("stCheckbox").filter(has_text="per-seed lines").locator("input").is_checked()
        assert (task, difficulty, seeds) == ("chain", "6", True), (task, difficulty, seeds)
        page.wait_for_timeout(500)
        no_error_on(page, "deep link")
        t_deep = time.monotonic() - t1
        say(f"deep link {DEEP_LINK}: task=chain, difficulty=6, per-seed lines restored, chart drawn in {t_deep:.1f} s")
        if opts.shots:
            page.screenshot(path=str(opts.shots / "deep-link.png"), full_page=True)

        # read-only: the Run page says so and offers no Submit
        page.goto(f"{url}/run")
        page.get_by_role("heading", name="Run", exact=True).wait_for()
        page.get_by_text("Read-only.").first.wait_for()
        page.get_by_role("heading", name="Jobs").wait_for()
        submit = page.get_by_role("button", name="Submit").count()
        assert submit == 0, f"{submit} Submit button(s) on a read-only Run page"
        page.get_by_text("Read-only: this copy shows results and runs nothing.").first.wait_for()
        no_error_on(page, "run page")
        say("run page: 'Read-only.' shown, no Submit button, sidebar says read-only")
        if opts.shots:
            page.screenshot(path=str(opts.shots / "run.png"), full_page=True)
        browser.close()

    print(f"timing: docker run -> /_stcore/health ok: {t_health:.1f} s", flush=True)
    print(f"timing: docker run -> overview first render (title): {t_title:.1f} s", flush=True)
    print(f"timing: docker run -> overview fully drawn: {t_full:.1f} s", flush=True)
    print(f"timing: overview fully drawn, warm: {t_warm:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
