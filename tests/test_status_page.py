"""The status page (``beatless status ... --serve PORT``): its server with a fake report,
then the page in a real Chromium, following two real nodes until they are killed."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fleet import environment
from stores import ManualClock

from beatless.cli._status import READ_EVERY_S, READ_SHARE, SharedReport
from beatless.errors import ConfigError, StoreUnavailable
from beatless.ops._page import HEIGHT, LEFT, MARGIN, MARK_RADIUS, WIDTH, make_server
from beatless.schedule.firing import iso

NOW_MS = 1_790_000_000_000
CHROMIUM = Path("/usr/bin/chromium")
EVIL = "<script>alert('x')</script>\"&"


def sample_status(name: str = "tick", node: str = "n0") -> dict[str, Any]:
    """A report as :func:`beatless.ops.status.report` writes it: one node, one entry, and
    firings one, thirty and sixty minutes ago."""
    firings = [
        _firing(NOW_MS - 3_600_000, node, "won", 2),
        _firing(NOW_MS - 1_800_000, node, "takeover", 10_000),
        _firing(NOW_MS - 60_000, node, "missed", 0),
    ]
    return {
        "namespace": "page-test",
        "at": iso(NOW_MS),
        "nodes": [
            {
                "node": node,
                "host": "host-a",
                "pid": 4242,
                "version": "0.1.0",
                "framework": "celery",
                "fingerprint": "abc123",
                "tzdata": "2025b",
                "clock_offset_ms": -3,
                "last_wake": iso(NOW_MS - 400),
                "last_seen_s": 1.2,
                "healthy": True,
                "health": "ok",
                "counters": {"won": 3},
            }
        ],
        "entries": [
            {
                "entry": name,
                "address": f"page-test/{name}",
                "trigger": "every 1s",
                "fan_out": None,
                "last": firings[-1],
                "recent": firings,
                "timeline": firings,
                "next": [
                    {"occurrence": iso(NOW_MS + 1_000), "offset_ms": 250, "release": iso(NOW_MS)}
                ],
                "paused": False,
                "control": None,
                "counts": {"won": 1, "takeover": 1, "missed": 1},
                "missed": 1,
                "missed_last": iso(NOW_MS - 60_000),
            }
        ],
        "problems": [f"entry {name}: 1 missed firing(s) in the last hour"],
        "audit": [],
    }


def _firing(occurrence_ms: int, node: str, outcome: str, lateness_ms: int) -> dict[str, Any]:
    return {
        "id": f"id-{occurrence_ms}",
        "occurrence_ms": occurrence_ms,
        "tenant": None,
        "occurrence": iso(occurrence_ms),
        "release": iso(occurrence_ms),
        "node": node,
        "outcome": outcome,
        "lateness_ms": lateness_ms,
        "manual": False,
    }


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[], dict[str, Any]]], str]]:
    """Starts a page server on a free port for a report callable; its base URL."""
    servers = []

    def start(report: Callable[[], dict[str, Any]]) -> str:
        server = make_server(report, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, dict[str, str], str]:
    """Status, headers and body of a GET of ``url`` (http://host:port/path), whatever the
    status."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=10)
    try:
        connection.request("GET", parts.path)
        answer = connection.getresponse()
        return answer.status, dict(answer.headers), answer.read().decode()
    finally:
        connection.close()


class Elements(HTMLParser):
    """Every start tag of a page with its attributes, as a browser's parser sees them."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def having(self, attribute: str) -> list[dict[str, str | None]]:
        return [attrs for _, attrs in self.tags if attribute in attrs]


def test_status_json_is_the_report_read_on_each_request(serve: Any) -> None:
    calls = []

    def report() -> dict[str, Any]:
        calls.append(1)
        return sample_status()

    base = serve(report)
    for _ in range(2):
        code, headers, body = get(f"{base}/status.json")
        assert code == 200
        assert headers["Content-Type"].startswith("application/json")
        assert json.loads(body) == sample_status()
    assert len(calls) == 2


def test_the_page_reads_the_store_once_per_two_seconds_however_many_pages_ask(
    serve: Any,
) -> None:
    """Ten pages open, each asking for the page and its JSON: one report read; two
    seconds later, one more."""
    clock, calls = ManualClock(), []
    start = clock.now_ms()

    def report() -> dict[str, Any]:
        calls.append(clock.now_ms())
        return sample_status()

    base = serve(SharedReport(report, clock))
    for _ in range(10):
        assert get(f"{base}/")[0] == 200
        assert json.loads(get(f"{base}/status.json")[2]) == sample_status()
    clock.advance(round(READ_EVERY_S * 1_000) - 10)
    get(f"{base}/status.json")
    assert len(calls) == 1
    clock.advance(10)
    get(f"{base}/status.json")
    assert calls == [start, start + round(READ_EVERY_S * 1_000)]


def test_a_report_slow_to_read_is_kept_five_times_as_long_and_a_failed_one_not_at_all() -> None:
    clock, calls = ManualClock(), []

    def report() -> dict[str, Any]:
        calls.append(clock.now_ms())
        if len(calls) == 2:
            raise StoreUnavailable("redis store at 127.0.0.1:6379: connection refused")
        clock.advance(8_000)  # a big schedule's report
        return sample_status(node=f"n{len(calls)}")

    shared = SharedReport(report, clock)
    assert shared()["nodes"][0]["node"] == "n1"
    clock.advance(round(8_000 / READ_SHARE) - 10)
    assert shared()["nodes"][0]["node"] == "n1"  # kept 40 s, not 2
    clock.advance(10)
    with pytest.raises(StoreUnavailable):
        shared()
    assert shared()["nodes"][0]["node"] == "n3"  # the failure was not kept
    assert len(calls) == 3


def test_the_page_says_how_often_the_store_is_read_when_a_report_is_kept_longer(
    serve: Any,
) -> None:
    """A report read in 0.1 s: the page says it is refreshed every 2 s. One that took 8 s
    is kept 40 s, and the page says so rather than "every 2 s"."""
    for took_ms, said in ((100, "refreshed every 2 s"), (8_000, "read from the store every 40 s")):
        clock = ManualClock()

        def report(_took: int = took_ms, _clock: ManualClock = clock) -> dict[str, Any]:
            _clock.advance(_took)
            return sample_status()

        page = get(serve(SharedReport(report, clock)) + "/")[2]
        (line,) = re.findall(r'<div class="at">(.*?)</div>', page)
        assert said in line
        assert ("every 2 s" in line) == (took_ms == 100)


def test_page_shows_nodes_entries_firings_and_problems_with_nothing_external(
    serve: Any,
) -> None:
    code, headers, page = get(serve(sample_status) + "/")
    assert code == 200
    assert headers["Content-Type"].startswith("text/html")
    elements = Elements(page)
    assert [a["data-node"] for a in elements.having("data-node")] == ["n0"]
    assert [a["data-entry"] for a in elements.having("data-entry")] == ["tick"]
    firings = [a for t, a in elements.tags if t == "circle" and a.get("class") == "firing"]
    assert [f["data-outcome"] for f in firings] == ["won", "takeover", "missed"]
    assert [a["data-offset-ms"] for a in elements.having("data-offset-ms")] == ["250"]
    problems = next(a for _, a in elements.tags if a.get("id") == "problems")
    assert problems["data-count"] == "1"
    assert "entry tick: 1 missed firing(s)" in page
    assert 'data-refresh-ms="2000"' in page
    # Nothing is loaded from elsewhere, and the policy would refuse it if it were.
    assert not re.search(r"https?:|//[a-z]", page.replace("// A tooltip", ""))
    assert all(
        v.startswith("data:") for _, a in elements.tags for v in [a.get("src"), a.get("href")] if v
    )
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "http" not in headers["Content-Security-Policy"]


def test_timeline_places_a_firing_by_its_time_and_its_lateness() -> None:
    from beatless.ops._page import render_page

    circles = [a for t, a in Elements(render_page(sample_status())).tags if t == "circle"]
    hour_ago, half_hour_ago, minute_ago = (c for c in circles if c.get("class") == "firing")
    plot = WIDTH - MARGIN - LEFT
    assert float(hour_ago["cx"] or 0) == pytest.approx(LEFT)
    assert float(half_hour_ago["cx"] or 0) == pytest.approx(LEFT + plot / 2, abs=0.1)
    assert float(minute_ago["cx"] or 0) == pytest.approx(LEFT + plot * 59 / 60, abs=0.1)
    # 10 s late is drawn higher (smaller y) than 2 ms late; 0 ms sits at the bottom.
    assert float(half_hour_ago["cy"] or 0) < float(hour_ago["cy"] or 0)
    assert float(minute_ago["cy"] or 0) == pytest.approx(MARGIN + HEIGHT - MARK_RADIUS)


def test_store_unavailable_answers_503_and_the_page_shows_the_error(serve: Any) -> None:
    def report() -> dict[str, Any]:
        raise StoreUnavailable("redis://localhost:6379/0: Connection refused")

    base = serve(report)
    code, _, body = get(f"{base}/status.json")
    assert code == 503
    assert "Connection refused" in json.loads(body)["error"]
    code, _, page = get(f"{base}/")
    assert code == 503
    assert 'id="store-error"' in page
    assert "Connection refused" in page
    assert 'id="refresh-error"' in page  # the page keeps its refresh script


def test_unknown_paths_are_not_found(serve: Any) -> None:
    base = serve(sample_status)
    for path in ("/favicon.ico", "/status", "/../etc/passwd"):
        assert get(base + path)[0] == 404


def test_a_taken_port_is_refused_with_its_number(serve: Any) -> None:
    taken = int(serve(sample_status).rsplit(":", 1)[1])
    with pytest.raises(ConfigError, match=f"port {taken}: .*give another --serve PORT"):
        make_server(sample_status, "127.0.0.1", taken)


def test_store_text_is_escaped_in_the_page(serve: Any) -> None:
    status = sample_status(name=EVIL, node=EVIL)
    status["problems"] = [f"node {EVIL}: its scheduler loop is not running"]
    code, _, page = get(serve(lambda: status) + "/")
    assert code == 200
    assert EVIL not in page
    assert "&lt;script&gt;alert(" in page
    elements = Elements(page)
    assert [t for t, _ in elements.tags].count("script") == 1  # the page's own
    assert [a["data-entry"] for a in elements.having("data-entry")] == [EVIL]
    assert [a["data-node"] for a in elements.having("data-node")] == [EVIL]


def get_as(url: str, host: str) -> tuple[int, str]:
    """Status and body of a GET of ``url`` sent with ``Host: host``, as a browser sends
    it for a page whose name resolves to this server."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=10)
    try:
        connection.putrequest("GET", parts.path, skip_host=True)
        connection.putheader("Host", host)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def test_a_foreign_host_name_gets_421_and_no_data(serve: Any) -> None:
    calls = []

    def report() -> dict[str, Any]:
        calls.append(1)
        return sample_status()

    base = serve(report)
    port = base.rsplit(":", 1)[1]
    for host in (f"rebind.attacker.example:{port}", "rebind.attacker.example", "localhost.evil"):
        for path in ("/status.json", "/", "/nothing"):
            code, body = get_as(base + path, host)
            assert code == 421, (host, path)
            assert "page-test" not in body
            assert "tick" not in body
    assert calls == []
    for host in (f"localhost:{port}", "LOCALHOST.", f"127.0.0.1:{port}", "[::1]:80", "10.1.2.3"):
        code, body = get_as(f"{base}/status.json", host)
        assert code == 200, host
        assert json.loads(body)["namespace"] == "page-test"


def test_allow_host_adds_a_name_the_page_answers_to(tmp_path: Path) -> None:
    log = tmp_path / "page.log"
    server = beatless(
        *("status", "--store", f"sqlite:///{tmp_path / 'claims.db'}", "--namespace", "ns"),
        *("--serve", "0", "--allow-host", "status.example.com", "--allow-host", "beat.lan"),
        log=log,
    )
    try:
        base = page_url(log, server)
        port = base.rstrip("/").rsplit(":", 1)[1]
        for host in (f"status.example.com:{port}", "Beat.LAN"):
            code, body = get_as(f"{base}status.json", host)
            assert code == 200, host
            assert json.loads(body)["namespace"] == "ns"
        assert get_as(f"{base}status.json", "status.example.com.evil")[0] == 421
    finally:
        kill([server])


def test_an_allow_host_that_is_not_a_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="--allow-host 'http://x/'"):
        make_server(sample_status, "127.0.0.1", 0, ["http://x/"])


# -- in a real browser, with real nodes -------------------------------------------------

SCHEDULE = """
namespace = "page-e2e"

[[entry]]
name = "tick"
task = "tests.tick"
every = "1s"
max_late = "3s"

[[entry]]
name = "slow"
task = "tests.slow"
every = "5s"
jitter = "2s"
"""
WAIT_MS = 30_000
"""The longest wait for anything the page should show."""
GONE_MS = 25_000
"""A killed fleet's records run out after 15 s; the page says so within this."""


def require_browser() -> None:
    """Skip unless Chromium and playwright are installed; with
    ``BEATLESS_REQUIRE_SERVICES=1`` (as in CI) fail instead."""
    reason = None
    if not CHROMIUM.exists():
        reason = f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "playwright is not installed (pip install playwright)"
    if reason is None:
        return
    if os.environ.get("BEATLESS_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason}; BEATLESS_REQUIRE_SERVICES=1 requires it")
    pytest.skip(reason)


def beatless(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "beatless", *args], env=environment(), stdout=out, stderr=out
        )


def page_url(log: Path, process: subprocess.Popen[bytes], timeout: float = 20) -> str:
    """The address ``status --serve 0`` printed once it listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"serving (http://\S+)", log.read_text())
        if found:
            return found[1]
        if process.poll() is not None:
            break
        time.sleep(0.1)
    pytest.fail(f"status --serve never said where it listens:\n{log.read_text()}")


def kill(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)


@pytest.mark.slow
def test_page_in_chromium_follows_two_nodes_until_they_are_killed(tmp_path: Path) -> None:
    require_browser()
    from playwright.sync_api import sync_playwright

    schedule = tmp_path / "schedule.toml"
    schedule.write_text(SCHEDULE)
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    nodes_log, page_log = tmp_path / "nodes.log", tmp_path / "page.log"
    run = ("run", str(schedule), "--store", url, "--node")
    nodes = [beatless(*run, name, log=nodes_log) for name in ("n0", "n1")]
    server = beatless("status", str(schedule), "--store", url, "--serve", "0", log=page_log)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(page_url(page_log, server), timeout=WAIT_MS)
                _see_a_healthy_fleet(page)
                page.screenshot(path=tmp_path / "status-page.png", full_page=True)
                assert errors == []

                kill(nodes)
                page.wait_for_selector(
                    '#problems .problem:has-text("no live node")', timeout=GONE_MS
                )
                assert page.locator("tr.node").count() == 0
            finally:
                browser.close()
        server.send_signal(signal.SIGTERM)
        assert server.wait(10) == 0
    finally:
        kill([*nodes, server])


def _see_a_healthy_fleet(page: Any) -> None:
    """Both nodes, tick's firings on its timeline, the next firings, no problem; and
    the page refreshes itself, as the timeline gains marks without a reload."""
    for name in ("n0", "n1"):
        page.wait_for_selector(f'tr.node[data-node="{name}"]', timeout=WAIT_MS)
    tick = '[data-entry="tick"]'
    sent = f'{tick} .firing:is([data-outcome="won"], [data-outcome="takeover"])'
    page.wait_for_selector(sent, timeout=WAIT_MS)
    page.wait_for_selector('#problems[data-count="0"]', timeout=WAIT_MS)
    assert page.locator('tr.node[data-healthy="true"]').count() == 2
    assert page.locator(f"{tick} .firing").count() == page.locator(sent).count()
    assert page.locator(f"{tick} li.next").count() == 3
    offsets = page.locator('[data-entry="slow"] li.next').evaluate_all(
        "items => items.map(i => Number(i.dataset.offsetMs))"
    )
    assert len(offsets) == 3
    assert all(0 <= o < 2_000 for o in offsets)
    assert page.locator(f'{tick}[data-paused="false"] .pause-state').inner_text() == "running"
    before = page.locator(sent).count()
    page.wait_for_function(
        "n => document.querySelectorAll('[data-entry=\"tick\"] .firing').length > n",
        arg=before,
        timeout=10_000,
    )
