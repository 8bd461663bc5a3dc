"""Serve the dashboard: `streamlit run dashboard/app.py [STREAMLIT OPTIONS]` without Streamlit's public
`/_stcore/metrics` route (it lists the server's cached functions and sessions to anyone; Streamlit has no option to
turn it off). `loopscope dashboard` and the Docker image start the server through this module:

    python -m dashboard.serve --server.address=127.0.0.1 --server.port=8501
"""

from __future__ import annotations

import importlib
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


def wait_until_healthy(url: str, running: Callable[[], bool], timeout: float) -> bool:
    """Poll `url`/_stcore/health until it answers (True), or the server stops `running` or `timeout` seconds pass
    (False): how the tests and tests/loadcheck.py know a server they started is up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
            return True
        except OSError:
            if not running() or time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def no_metrics_route() -> None:
    """Drop /_stcore/metrics from the routes the server builds (Starlette server, Streamlit >= 1.5x), or answer
    it with 404 (the older Tornado server). SystemExit where neither is found: never serve it unknowingly."""
    try:
        starlette_app = importlib.import_module("streamlit.web.server.starlette.starlette_app")
    except ImportError:
        starlette_app = None
    if starlette_app is not None and hasattr(starlette_app, "create_metrics_routes"):
        starlette_app.create_metrics_routes = lambda runtime, base_url: []
        return
    server = importlib.import_module("streamlit.web.server.server")
    if hasattr(server, "StatsRequestHandler"):
        import tornado.web

        class NotServed(tornado.web.RequestHandler):
            def initialize(self, *args, **kwargs) -> None:
                pass

            def get(self, *args) -> None:
                raise tornado.web.HTTPError(404)

        server.StatsRequestHandler = NotServed
        return
    import streamlit

    raise SystemExit(
        f"dashboard.serve: Streamlit {streamlit.__version__} builds its routes in a way this module does not know, so "
        "/_stcore/metrics cannot be turned off; run `streamlit run dashboard/app.py` behind a proxy that blocks it."
    )


def main(argv: list[str]) -> int:
    no_metrics_route()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(APP), *argv]
    return cli.main()  # click: exits itself


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
