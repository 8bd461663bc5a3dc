"""Load (issue 33 item 5): four read-only browser sessions at once each reach the overview's first card and the
accuracy page's first chart (tests/loadcheck.py, the same code that measures N = 4, 8, 16 for the README).
Altair's schema table, built once per process: tests/test_caching.py."""

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the whole module: see docs/development.md, Tests

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))


def load_check():
    spec = importlib.util.spec_from_file_location("load_check", REPO / "tests" / "loadcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no {CHROMIUM} (apt-get install -y chromium)")
def test_four_sessions_at_once_each_draw_their_first_chart():
    pytest.importorskip("playwright")
    record = asyncio.run(load_check().measure(4, REPO / "cached_results", timeout_s=50, views=False))
    print(f"\nN = 4: {record}")
    assert record["cards"] == 4 and record["charts"] == 4, record
    assert record["chart_max_s"] <= 50 and record["peak_rss_mb"] > 0


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no {CHROMIUM} (apt-get install -y chromium)")
def test_the_floor_is_the_same_session_against_a_bare_streamlit_app():
    """--floor: tests/load_floor.py answers the session the load check drives (a verdict matrix, then a chart on
    /accuracy), and the browser's CPU is counted without the server's."""
    pytest.importorskip("playwright")
    record = asyncio.run(load_check().measure(1, REPO / "cached_results", timeout_s=50, views=False, floor=True))
    assert record["cards"] == 1 and record["charts"] == 1, record
    assert record["server_cpu_s"] > 0 and record["browser_cpu_s"] > 0
    assert record["server_cpu_s"] + record["browser_cpu_s"] <= record["machine_busy_cpu_s"] + 1.0


def test_without_browsers_each_session_gets_the_card_and_the_chart_messages():
    """--no-browser: protocol clients (Streamlit's websocket) stand in for browsers on other machines; each gets the
    overview's verdict matrix and then the accuracy page's chart, on a server whose CPU is still measured."""
    record = asyncio.run(load_check().measure(2, REPO / "cached_results", timeout_s=60, views=False, browsers=False))
    assert record["cards"] == 2 and record["charts"] == 2, record
    assert record["card_max_s"] < record["chart_max_s"] <= 60 and record["server_cpu_s"] > 0
    assert record["browser_cpu_s"] == 0.0 and not record["errors"]


def test_every_page_asks_the_browser_for_no_motion(monkeypatch):
    """Animations repaint at 60 frames a second while a page waits for the server, in every visitor's browser: the
    app's first element turns them off (measured: dev/LOG.md, the load entries)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("LOOPSCOPE_RESULTS", str(REPO / "cached_results"))
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=60).run()
    assert any("animation: none" in el.proto.body and "transition: none" in el.proto.body for el in at.get("html"))


def test_the_load_check_refuses_what_it_does_not_bound(capsys):
    module = load_check()
    for argv in (["--sessions", "33"], ["--sessions", "0"], ["--timeout", "601"], ["--results", "/no/such/folder"],
                 ["--floor", "--url", "http://127.0.0.1:1"], ["--url", "127.0.0.1:8501"]):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            module.main(argv)
        assert stop.value.code == 2, argv
