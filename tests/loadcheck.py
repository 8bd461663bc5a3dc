"""How many visitors the dashboard holds: N browser sessions at once, each opening the overview and then the
accuracy page, against a fresh `loopscope dashboard` on 127.0.0.1 (read-only, as a hosted copy is).

    python tests/loadcheck.py [--sessions 4,8,16] [--results cached_results] [--timeout 80] [--json OUT]
    python tests/loadcheck.py --floor      # the same sessions against tests/load_floor.py, a 2-page bare Streamlit app
    python tests/loadcheck.py --url URL    # against a dashboard already running elsewhere (browsers on this machine)
    python tests/loadcheck.py --no-browser # the server alone: each visitor a protocol client, as if its browser were
                                          # on the visitor's own machine

Per N it reports, over the sessions: time to the overview's verdict matrix (its "card": `table.verdicts`) and to the
accuracy page's first drawn chart (p50, p95, max; from the session's start, so queueing counts), how many sessions
drew their chart within --timeout, the server's CPU seconds and its peak RSS (the Streamlit process; not the
verdicts' warm-up beside it). Before the load it measures the server CPU of one accuracy-page view: cold (the
server's first), repeated by the same visitor (a new tab) and by a new one (a new browser context), then that
visitor's overview twice (its first view by this visitor, and a repeat). Each N gets a fresh server. The browser's
CPU is that of Chromium's processes (and Playwright's driver), the server's left out.

`--floor` serves tests/load_floor.py instead (nothing of loopscope: Streamlit's front end and one small chart), so the
table says what any Streamlit app costs per visitor on this machine, the floor under the dashboard's numbers. `--url`
drives a dashboard that is already running (server CPU and RSS then unknown): with the server on one machine and
the browsers on another, the visitors' CPUs are theirs, as a hosted dashboard's are. `--no-browser` measures that
case on one machine: each session speaks Streamlit's own protocol (a websocket, the messages a browser sends: run
the overview, then the accuracy page, as a click in the sidebar does) and times the messages that carry the
overview's verdict matrix and the accuracy page's first chart; what the visitor's browser then spends drawing
them (about 1.5-2 s of its CPU per page here, dev/LOG.md) is not in these times.

Bounded: at most 32 sessions, every wait has a timeout, the server listens on 127.0.0.1 only and is stopped at the
end; one Chromium (/usr/bin/chromium, or $CHROMIUM) holds all sessions, as one machine of visitors would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dashboard.serve import wait_until_healthy  # noqa: E402

MAX_SESSIONS = 32
MATRIX_HTML = 'class="verdicts"'  # the overview's first element a visitor reads (dashboard.matrix.matrix_html)
MATRIX = "table.verdicts"
CHART_DRAWN = (
    "() => [...document.querySelectorAll('[data-testid=stVegaLiteChart]')].some(c => [...c.querySelectorAll("
    "'canvas, svg.marks')].some(e => e.getBoundingClientRect().width > 100 && e.getBoundingClientRect().height > 50))"
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(pid: int) -> list[int]:
    """pid and its descendants (the loopscope command, the Streamlit server, the warm-up)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += parents.get(p, [])
    return found


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (and of their reaped children); the server's own is what a
    view costs (the verdicts' warm-up, a separate process at lower priority, is left out)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / CLK_TCK


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all processes, every core), from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / CLK_TCK  # all but idle and iowait


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class Server:
    """`loopscope dashboard` on 127.0.0.1, read-only, with its own verdict cache (cold, as a fresh host's); with
    `floor`, tests/load_floor.py served by `streamlit run` with the same settings."""

    def __init__(self, results: Path, cache: Path, floor: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.floor = floor
        env = dict(os.environ, LOOPSCOPE_READ_ONLY="1", LOOPSCOPE_CACHE=str(cache), LOOPSCOPE_REMOTE_JOBS="")
        if floor:
            command = [sys.executable, "-m", "streamlit", "run", str(REPO / "tests" / "load_floor.py"),
                       "--server.address", "127.0.0.1", "--server.port", str(self.port), "--server.headless", "true",
                       "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"]  # fmt: skip
        else:
            command = [sys.executable, "-m", "engine", "dashboard", "--host", "127.0.0.1", "--port", str(self.port),
                       "--results", str(results)]  # fmt: skip
        self.log = open(cache / "server.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        if not wait_until_healthy(self.url, lambda: self.proc.poll() is None, 90):
            raise SystemExit(f"load-check: the dashboard did not start; see {self.log.name}")
        self.peak_rss = 0.0

    def pids(self) -> list[int]:
        return tree(self.proc.pid)

    def server_pid(self) -> int:
        """The Streamlit server itself (dashboard.serve), not the verdicts' warm-up beside it."""
        if self.floor:
            return self.proc.pid
        for pid in self.pids():
            try:
                if b"dashboard.serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        raise SystemExit("load-check: no dashboard.serve process under the loopscope command")

    def cpu(self) -> float:
        return cpu_s([self.server_pid()])

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, rss_mb([self.server_pid()]))

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


class Remote:
    """A dashboard already running at `url` (perhaps on another machine): its CPU and memory are not measured."""

    def __init__(self, url: str):
        self.url, self.peak_rss = url.rstrip("/"), None

    def pids(self) -> list[int]:
        return []

    def cpu(self) -> None:
        return None

    def sample(self) -> None:
        pass

    def stop(self) -> None:
        pass


async def session(browser, url: str, timeout_s: float) -> dict:
    """One visitor: the overview until its verdict matrix, then the accuracy page until its first chart."""
    context = await browser.new_context(viewport={"width": 1400, "height": 1400})
    page = await context.new_page()
    start, out = time.monotonic(), {"card_s": None, "chart_s": None}

    def left_ms() -> float:  # one deadline for the whole session
        return max(1.0, timeout_s - (time.monotonic() - start)) * 1000

    try:
        await page.goto(url, timeout=left_ms())
        await page.locator(MATRIX).first.wait_for(timeout=left_ms())
        out["card_s"] = time.monotonic() - start
        await page.goto(f"{url}/accuracy", timeout=left_ms())
        await page.wait_for_function(CHART_DRAWN, timeout=left_ms(), polling=100)
        if time.monotonic() - start <= timeout_s + 1:  # polling granularity
            out["chart_s"] = time.monotonic() - start
    except Exception as e:  # a timeout: the session did not get there in time
        out["error"] = type(e).__name__
    finally:
        await context.close()
    return out


async def protocol_session(url: str, timeout_s: float) -> dict:
    """One visitor without a browser: Streamlit's websocket, the overview run, then the accuracy page run on the same
    connection; the time each first card / chart message arrives (from the session's start)."""
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    start, out = time.monotonic(), {"card_s": None, "chart_s": None}

    async def visit() -> None:
        stream = url.replace("http", "ws", 1) + "/_stcore/stream"
        async with websockets.connect(stream, subprotocols=["streamlit"], max_size=None) as ws:
            for page, field in (("", "card_s"), ("accuracy", "chart_s")):
                message = BackMsg()
                message.rerun_script.page_name = page
                await ws.send(message.SerializeToString())
                while True:
                    forward = ForwardMsg.FromString(await ws.recv())
                    kind = forward.WhichOneof("type")
                    if kind == "script_finished":
                        break
                    if kind == "delta" and forward.delta.WhichOneof("type") == "new_element":
                        element = forward.delta.new_element
                        found = element.WhichOneof("type")
                        first = MATRIX_HTML in element.html.body if field == "card_s" else found == "vega_lite_chart"
                        if first and out[field] is None:
                            out[field] = time.monotonic() - start

    try:
        await asyncio.wait_for(visit(), timeout_s)
    except Exception as e:  # a timeout or a closed connection: the session did not get there in time
        out["error"] = type(e).__name__
    return out


async def one_view(context, url: str, server: Server, timeout_s: float, path: str = "accuracy") -> float:
    """Server CPU seconds spent on one view of a page in a new tab of this browser context (the accuracy page: its
    first chart drawn; the overview (path ""): its verdict matrix; its run ended, then 2 s for the rest)."""
    page = await context.new_page()
    before = server.cpu()
    await page.goto(f"{url}/{path}", timeout=timeout_s * 1000)
    if path:
        await page.wait_for_function(CHART_DRAWN, timeout=timeout_s * 1000, polling=100)
    else:
        await page.locator(MATRIX).first.wait_for(timeout=timeout_s * 1000)
    await page.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=30_000)
    await asyncio.sleep(2)
    used = server.cpu() - before
    await page.close()
    await asyncio.sleep(1)
    return used


async def views_cpu(browser, server: Server, timeout_s: float) -> dict:
    """One accuracy-page view cold (the server's first), then repeated by a new visitor (a new browser context:
    it fetches Streamlit's front end too) and by the same visitor (a new tab: its front end cached)."""
    first = await browser.new_context(viewport={"width": 1400, "height": 1400})
    cold = await one_view(first, server.url, server, timeout_s)
    same = await one_view(first, server.url, server, timeout_s)
    await first.close()
    second = await browser.new_context(viewport={"width": 1400, "height": 1400})
    new = await one_view(second, server.url, server, timeout_s)
    overview = [await one_view(second, server.url, server, timeout_s, path="") for _ in range(2)]
    await second.close()
    return {"view_cpu_cold_s": cold, "view_cpu_repeat_new_visitor_s": new, "view_cpu_repeat_same_visitor_s": same,
            "overview_cpu_first_s": overview[0], "overview_cpu_repeat_s": overview[1]}  # fmt: skip


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Window:
    """The measured window of a load: the server's CPU (None for a Remote), the wall and the whole machine's busy CPU
    from its start to record()."""

    def __init__(self, server):
        self.server, self.cpu0, self.t0, self.busy0 = server, server.cpu(), time.monotonic(), machine_busy_s()

    def record(self) -> dict:
        cpu = None if self.cpu0 is None else self.server.cpu() - self.cpu0
        return {
            "server_cpu_s": cpu,
            "wall_s": time.monotonic() - self.t0,
            "machine_busy_cpu_s": machine_busy_s() - self.busy0,
        }


async def run_sessions(server, sessions) -> list[dict]:
    """The sessions at once, sampling the server's RSS until every one has ended; their results."""
    tasks = [asyncio.create_task(s) for s in sessions]
    while not all(t.done() for t in tasks):
        server.sample()
        await asyncio.sleep(0.5)
    return [t.result() for t in tasks]


async def in_browsers(n: int, server, timeout_s: float, views: bool) -> tuple[list[dict], dict]:
    """N browser sessions at once in one Chromium (after the single views, if asked); the browser's CPU is that of
    this process's descendants but the server's."""
    from playwright.async_api import async_playwright

    def browser_cpu() -> float:  # Chromium and Playwright's driver
        return cpu_s([p for p in tree(os.getpid()) if p != os.getpid() and p not in server.pids()])

    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    async with async_playwright() as p:
        args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        browser = await p.chromium.launch(executable_path=chromium, args=args)
        record = await views_cpu(browser, server, timeout_s) if views else {}  # before the load: cold, then repeated
        window, browser0 = Window(server), browser_cpu()
        found = await run_sessions(server, [session(browser, server.url, timeout_s) for _ in range(n)])
        record["browser_cpu_s"] = browser_cpu() - browser0
        await browser.close()
    return found, record | window.record()


async def measure(n: int, results: Path, timeout_s: float, views: bool, floor: bool = False, url: str = "",
                  browsers: bool = True) -> dict:  # fmt: skip
    """One row of the table: N sessions at once against a fresh server (or `url`), in browsers or as protocol
    clients (browser CPU 0)."""
    with tempfile.TemporaryDirectory(prefix="loopscope-load-") as tmp:
        server = Remote(url) if url else Server(results, Path(tmp), floor)
        try:
            if browsers:
                found, record = await in_browsers(n, server, timeout_s, views)
            else:
                window = Window(server)
                found = await run_sessions(server, [protocol_session(server.url, timeout_s) for _ in range(n)])
                record = {"browser_cpu_s": 0.0} | window.record()
            server.sample()
        finally:
            server.stop()
    return summary(n, found, record, server)


def summary(n: int, found: list[dict], record: dict, server) -> dict:
    cards = [r["card_s"] for r in found if r["card_s"] is not None]
    charts = [r["chart_s"] for r in found if r["chart_s"] is not None]
    return {"sessions": n} | record | {
        "cards": len(cards), "charts": len(charts),
        "card_p50_s": quantile(cards, 0.5), "card_p95_s": quantile(cards, 0.95), "card_max_s": max(cards, default=None),
        "chart_p50_s": quantile(charts, 0.5), "chart_p95_s": quantile(charts, 0.95),
        "chart_max_s": max(charts, default=None), "peak_rss_mb": server.peak_rss,
        "errors": sorted({r["error"] for r in found if "error" in r}),
    }  # fmt: skip


def load_note() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.2f} {five:.2f} {fifteen:.2f} at the start"


def table(records: list[dict]) -> str:
    def f(x):
        return "—" if x is None else f"{x:.1f}"

    lines = ["| N | first card p50 / p95 / max (s) | first chart p50 / p95 / max (s) | charts drawn | CPU s: server / "
             "browser / whole machine (wall s) | server peak RSS (MB) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        lines.append(
            f"| {r['sessions']} | {f(r['card_p50_s'])} / {f(r['card_p95_s'])} / {f(r['card_max_s'])} | "
            f"{f(r['chart_p50_s'])} / {f(r['chart_p95_s'])} / {f(r['chart_max_s'])} | {r['charts']} of "
            f"{r['sessions']} | {f(r['server_cpu_s'])} / {f(r['browser_cpu_s'])} / {r['machine_busy_cpu_s']:.0f} "
            f"({r['wall_s']:.0f}) | {f(r['peak_rss_mb'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="4,8,16", help="comma-separated session counts (each <= 32)")
    parser.add_argument("--results", default=str(REPO / "cached_results"), help="the results folder to serve")
    parser.add_argument("--timeout", type=float, default=80.0, help="seconds a session may take (default 80)")
    parser.add_argument("--no-views", action="store_true", help="skip the cold/repeat view CPU measurement")
    parser.add_argument("--floor", action="store_true", help="serve tests/load_floor.py (bare Streamlit) instead")
    parser.add_argument("--url", default="", help="drive a dashboard already running at this address instead")
    parser.add_argument("--no-browser", action="store_true", help="sessions as protocol clients: the server alone")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.sessions.split(",")]
    except ValueError:
        parser.error(f"--sessions {args.sessions!r} is not a list of whole numbers")
    if not all(1 <= n <= MAX_SESSIONS for n in counts):
        parser.error(f"each session count must be 1..{MAX_SESSIONS}")
    if not 1 <= args.timeout <= 600:
        parser.error("--timeout must be 1..600 seconds")
    if args.url and args.floor:
        parser.error("--url and --floor exclude each other: --floor starts its own server")
    if args.url and not args.url.startswith(("http://", "https://")):
        parser.error(f"--url {args.url!r} is not an http(s) address")
    if not Path(args.results).is_dir():
        parser.error(f"no results folder {args.results}")
    note = load_note()
    views = not (args.no_views or args.url or args.floor or args.no_browser)  # loopscope's own server, in a browser
    records = [asyncio.run(measure(n, Path(args.results), args.timeout, views and i == 0, args.floor, args.url,
                                   browsers=not args.no_browser)) for i, n in enumerate(counts)]  # fmt: skip
    served = args.url or ("tests/load_floor.py (bare Streamlit)" if args.floor else "loopscope dashboard")
    served += ", no browsers (protocol clients)" if args.no_browser else ""
    print(f"load check of {served} on {note}; sessions may take {args.timeout:.0f} s")
    print(table(records))
    for r in records:
        if "view_cpu_cold_s" in r:
            print(f"server CPU per accuracy-page view: cold {r['view_cpu_cold_s']:.2f} s, repeated by the same "
                  f"visitor {r['view_cpu_repeat_same_visitor_s']:.2f} s, by a new visitor "
                  f"{r['view_cpu_repeat_new_visitor_s']:.2f} s")  # fmt: skip
            print(f"server CPU per overview view (after the accuracy page's): first {r['overview_cpu_first_s']:.2f} s, "
                  f"repeated {r['overview_cpu_repeat_s']:.2f} s")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": note, "served": served, "records": records}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
