"""Screenshots: every page and the report at 1400x900 (full page), on the shipped results.

    .venv/bin/python dev/checks/shoot.py OUTDIR [URL]   # URL: a running server (else one is started)

Prints each page's height in px (the main block's scrollHeight) and the report's build seconds."""

import os
import subprocess
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from dashboard.serve import wait_until_healthy  # noqa: E402

PAGES = [
    "",
    "accuracy",
    "norms",
    "refit",
    "stacked",
    "ouro",
    "runs",
    "run",
    "agreement",
    "?study=cpu-1layer",
    "agreement?preset=cpu-ladder",
    "stacked?axis=ratio",
    "accuracy?vs=cpu-1layer",
]


def main(out: Path, url: str | None) -> None:
    pages = os.environ["SHOTS"].split(",") if os.environ.get("SHOTS") else PAGES  # SHOTS=accuracy,norms: only those
    out.mkdir(parents=True, exist_ok=True)
    proc = None
    if url is None:
        url = "http://127.0.0.1:8543"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                str(ROOT / "dashboard/app.py"),
                "--server.headless",
                "true",
                "--server.port",
                "8543",
                "--server.address",
                "127.0.0.1",
                "--browser.gatherUsageStats",
                "false",
            ],
            cwd=ROOT,
            stdout=open(out / "server.log", "w"),
            stderr=subprocess.STDOUT,
        )
        assert wait_until_healthy(url, lambda: proc.poll() is None, 120)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium",
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            for path in pages:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.set_default_timeout(300_000)
                page.goto(f"{url}/{path}" if path != "overview" else url)
                page.wait_for_selector("[data-testid=stMain] h1")
                page.wait_for_timeout(1500)
                page.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')")
                page.wait_for_timeout(3000)
                name = path.replace("?", "_").replace("=", "-").replace("&", "_").strip("_") or "overview"
                page.screenshot(path=str(out / f"{name}-first-screen.png"))
                height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
                page.set_viewport_size({"width": 1400, "height": min(max(height, 900) + 50, 16_000)})
                page.wait_for_timeout(1500)
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
                print(f"{name}: {height} px", flush=True)
                page.close()
            if os.environ.get("SHOTS") and "report" not in pages:
                return
            start = time.monotonic()
            report = out / "report"
            subprocess.run([sys.executable, "-m", "engine", "report", "--out", str(report)], cwd=ROOT, check=True)
            print(f"report build: {time.monotonic() - start:.1f} s", flush=True)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto((report / "index.html").resolve().as_uri())
            page.wait_for_timeout(2000)
            page.screenshot(path=str(out / "report-first-screen.png"))
            page.screenshot(path=str(out / "report.png"), full_page=True)
            print(f"report: {page.evaluate('document.body.scrollHeight')} px", flush=True)
            browser.close()
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=20)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
