"""Serve the dashboard: `streamlit run dashboard/app.py [STREAMLIT OPTIONS]` without Streamlit's public
`/_stcore/metrics` route (it lists the server's cached functions and sessions to anyone; Streamlit has no option to
turn it off), and with the app's root named to the page (backend_base_script), so a deep link's first load probes
no `/<page>/_stcore/health`. `loopscope dashboard` and the Docker image start the server through this module:

    python -m dashboard.serve --server.address=127.0.0.1 --server.port=8501
"""

from __future__ import annotations

import importlib
import json
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


class BackendBase:
    """Streamlit's static files (an ASGI app), with one script added to the page they serve at a page's URL
    (`/accuracy`, the app's index.html): `window.__streamlit.BACKEND_BASE_URL`, the app's root, resolved in the
    browser from its own address and the page's depth below the server's root (so it holds behind a proxy that adds
    a prefix, and with server.baseUrlPath). Without it Streamlit's front end does not know where the app's root is:
    it asks `/<page>/_stcore/health` and `/<page>/_stcore/host-config` first, which Streamlit answers 404 on purpose
    (a page's URL is no root: answering there would make the front end open its socket and page links under it),
    then the parent, and the browser's console shows the two 404s. The script holds no text from the request."""

    SCRIPT = (
        "<script>window.__streamlit = Object.assign({}, window.__streamlit, "
        "{BACKEND_BASE_URL: new URL(%s, window.location.href).href})</script>"
    )

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        root, path = scope.get("root_path", ""), scope.get("path", "")
        route = path[len(root) :] if path.startswith(root) else path
        depth = len([part for part in route.split("/") if part])
        if scope["type"] != "http" or scope["method"] != "GET" or depth == 0:  # the root needs no help
            await self.app(scope, receive, send)
            return
        script = (self.SCRIPT % json.dumps("./" + "../" * (depth - 1))).encode()
        start: dict | None = None
        body: list[bytes] = []

        async def add_script(message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                if b"text/html" in headers.get(b"content-type", b""):
                    start = message  # held until the body is complete
                    return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            html = b"".join(body).replace(b"<head>", b"<head>" + script, 1)
            dropped = (b"content-length", b"etag", b"last-modified")  # the file's: no 304 for the page without it
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in dropped]
            await send({**start, "headers": [*headers, (b"content-length", str(len(html)).encode())]})
            await send({"type": "http.response.body", "body": html})

        await self.app(scope, receive, add_script)


def backend_base_script() -> bool:
    """Wrap the static files' routes of Streamlit's Starlette server in BackendBase; False (nothing changed) where
    this Streamlit builds them otherwise: deep links then log the two 404s, nothing worse."""
    try:
        starlette_app = importlib.import_module("streamlit.web.server.starlette.starlette_app")
    except ImportError:
        return False
    make = getattr(starlette_app, "create_streamlit_static_assets_routes", None)
    if make is None:
        return False

    def routes(base_url: str | None) -> list:
        made = make(base_url=base_url)
        for route in made:
            route.app = BackendBase(route.app)  # a Mount: its path, name and matching stay Streamlit's
        return made

    starlette_app.create_streamlit_static_assets_routes = routes
    return True


def main(argv: list[str]) -> int:
    no_metrics_route()
    backend_base_script()
    from streamlit.web import cli

    sys.argv = ["streamlit", "run", str(APP), *argv]
    return cli.main()  # click: exits itself


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
