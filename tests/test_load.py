"""Load (issue 33 item 5): four read-only browser sessions at once each reach the overview's first card and the
accuracy page's first chart (dev/load-check.py, the same code that measures N = 4, 8, 16 for the README), and
Altair's schema table is built once per process, not in every encode()."""

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))


def load_check():
    spec = importlib.util.spec_from_file_location("load_check", REPO / "dev" / "load-check.py")
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


def test_the_load_check_refuses_what_it_does_not_bound(capsys):
    module = load_check()
    for argv in (["--sessions", "33"], ["--sessions", "0"], ["--timeout", "601"], ["--results", "/no/such/folder"]):
        with pytest.raises(SystemExit) as stop:
            module.main(argv)
        assert stop.value.code == 2, argv


def test_altair_builds_its_schema_table_once_per_process(monkeypatch):
    import altair as alt
    from altair.utils import schemapi

    from dashboard import ui

    ui.keep_altair_schema_table()
    calls = []
    original = schemapi._FromDict.hash_schema.__func__
    monkeypatch.setattr(schemapi._FromDict, "hash_schema", classmethod(lambda cls, *a, **k: calls.append(1) or
                                                                         original(cls, *a, **k)))  # fmt: skip

    def chart():
        return alt.Chart().mark_line().encode(x="n:Q", y=alt.Y("accuracy:Q", title="accuracy"), color="boundary:N")

    chart()  # the table is built at most once, here
    calls.clear()
    assert chart().to_dict(validate=False)["encoding"]["y"]["title"] == "accuracy"
    assert not calls  # without the kept table: some 570 schemas hashed for each encoded channel
