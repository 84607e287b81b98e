"""A read-only status page for a fleet: ``beatless status ... --serve PORT``.

``/`` is one HTML page rendered here from :func:`beatless.ops.status.report`, with inline CSS
and a few lines of plain JavaScript that fetch ``/`` again every ``REFRESH_MS`` and swap
the fresh ``#status`` in, so the page never reloads and never loses its scroll.
``/status.json`` is the report itself. Both ask ``report`` on each request (the command's
keeps what it read for a while, and says for how long: ``read_every_s``); a store that
fails answers 503 (the page then shows the error, and the next refresh recovers).

The page answers only to the names it is served under: a request whose ``Host`` is not
a loopback name, an IP address, the address it listens on or a name given with
``--allow-host`` gets 421 and no data. A page on another site that rebinds its own name to
this server's address (DNS rebinding) so reaches it under that name, and is refused.

Every value that comes from the store is user text (entry, node and host names, health
messages) and is escaped here, in one place. The page loads nothing from elsewhere, and
its Content-Security-Policy allows only its own script and style, by hash, so even a
value that slipped through could not run.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import signal
import socket
import sys
import threading
from base64 import b64encode
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from hashlib import sha256
from html import escape
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import urlsplit

from beatless._version import __version__
from beatless.errors import ConfigError, StoreError
from beatless.fleet._missed import HOUR_MS
from beatless.fleet._notes import OFFSET_WARN_MS
from beatless.schedule.outcomes import DecisionOutcome

logger = logging.getLogger(__name__)

Report = Callable[[], Mapping[str, Any]]

REFRESH_MS = 2_000
WIDTH = 960
"""The timeline's width in SVG units: one hour, oldest on the left, now on the right."""
HEIGHT = 72
"""The height of the timeline's plot, where lateness is drawn."""
LEFT = 44
"""Room on the timeline's left for the lateness labels."""
MARGIN = 6
"""Room above and right of the plot, so that marks and labels at its edges show whole."""
BOTTOM = 14
"""Room under the plot for the time labels."""
LATENESS_TOP_MS = 60_000
"""Lateness is drawn on a log scale from 1 ms at the bottom to this at the top."""
LATENESS_TICKS_MS = (1, 10, 100, 1_000, 10_000)
TIME_TICK_MS = 600_000
MARK_RADIUS = 3.5
CONTROLS_SHOWN = 5
OUTCOMES = (
    DecisionOutcome.WON,
    DecisionOutcome.TAKEOVER,
    DecisionOutcome.MISSED,
    DecisionOutcome.SKIPPED_OVERLAP,
    DecisionOutcome.FORGOTTEN,
    DecisionOutcome.PAUSED,
)
"""The outcomes a history holds, in the legend's order (colours are in ``STYLE``)."""

STYLE = """
:root { font: 14px/1.4 system-ui, sans-serif; color: #1d232a; background: #f5f6f8; }
body { margin: 0 auto; padding: 1rem 1.5rem 3rem; max-width: 1100px; }
h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
h2 { font-size: 1.05rem; margin: 1.5rem 0 .5rem; }
.at, .muted { color: #667; }
code, .mono { font-family: ui-monospace, monospace; font-size: .92em; }
.alert { border-radius: 6px; padding: .6rem 1rem; margin: .8rem 0; }
.alert ul { margin: .3rem 0 0; padding-left: 1.2rem; }
#problems.bad, #store-error, #refresh-error { background: #fde8e8; border: 2px solid #d33; }
#problems.bad h2 { color: #b00; margin: 0; }
#problems.good { background: #e6f5ea; border: 1px solid #4a5; margin: .8rem 0; }
#problems li { font-weight: 600; margin: .2rem 0; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #e3e5e8; }
th { font-weight: 600; color: #445; background: #eceef1; }
.badge { display: inline-block; border-radius: 9px; padding: 0 .5rem; font-size: .85em; }
.badge.ok { background: #d7f0de; color: #17652f; }
.badge.bad, .badge.paused { background: #fcd9d9; color: #a11; font-weight: 600; }
.badge.running { background: #e3e8ef; color: #345; }
.differs, .warn { color: #b00; font-weight: 600; }
.entry { background: #fff; border: 1px solid #dde0e4; border-radius: 6px;
  padding: .6rem 1rem; margin: .8rem 0; }
.entry.is-paused { border: 2px solid #d33; }
.entry h3 { font-size: 1rem; margin: 0; display: flex; gap: .6rem; align-items: baseline; }
.entry .facts { margin: .2rem 0 .4rem; }
svg.timeline { width: 100%; height: auto; display: block; }
.timeline .plot { fill: #f8f9fb; stroke: #dde0e4; }
.timeline .grid { stroke: #e6e8eb; }
.timeline text { font-size: 9px; fill: #889; }
.firing { fill: #99a; stroke: #fff; stroke-width: .6; }
.firing[data-manual="true"] { stroke: #124; stroke-width: 1.4; }
[data-outcome="won"] { fill: #2e9d57; }
[data-outcome="takeover"] { fill: #2f6fd6; }
[data-outcome="missed"] { fill: #d32f2f; }
[data-outcome="skipped_overlap"] { fill: #e0a100; }
[data-outcome="forgotten"] { fill: #8e44ad; }
[data-outcome="paused"] { fill: #9aa3ad; }
.legend { display: flex; gap: 1rem; flex-wrap: wrap; margin: .3rem 0; color: #556; }
.legend svg { width: 10px; height: 10px; vertical-align: middle; }
.upcoming { margin: .3rem 0 0; padding-left: 1.2rem; }
"""

SCRIPT = """
(() => {
  const every = Number(document.body.dataset.refreshMs);
  const trouble = document.getElementById("refresh-error");
  async function refresh() {
    try {
      const answer = await fetch("/", { cache: "no-store" });
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = page.getElementById("status");
      // A tooltip being read stays put: its mark would vanish with the swap.
      if (fresh && !document.querySelector(".firing:hover")) {
        document.getElementById("status").replaceWith(fresh);
      }
      trouble.hidden = true;
    } catch (error) {
      trouble.textContent = "The page server did not answer (" + error.message +
        "); what is shown is from " + new Date().toLocaleTimeString() + " or before.";
      trouble.hidden = false;
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
"""


def _digest(text: str) -> str:
    return "'sha256-" + b64encode(sha256(text.encode()).digest()).decode() + "'"


POLICY = (
    f"default-src 'none'; script-src {_digest(SCRIPT)}; style-src {_digest(STYLE)}; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""Only this page's own script and style run, and it talks only to its own server."""


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
"""Host names that reach this machine only, answered to by default (with any IP address)."""


def serve(report: Report, *, host: str, port: int, allow_hosts: Iterable[str] = ()) -> None:
    """Serve the page for ``report`` on ``host:port`` until SIGINT or SIGTERM; requests
    naming another ``Host`` than ``allowed_hosts(host, allow_hosts)`` are refused."""
    server = make_server(report, host, port, allow_hosts)

    def stop(*_: object) -> None:
        # shutdown() waits for serve_forever(), which runs in this (the handler's) thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    shown_host = f"[{host}]" if ":" in host else host
    print(
        f"beatless status: serving http://{shown_host}:{server.server_address[1]}/ "
        "(Ctrl-C to stop)",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class PageServer(ThreadingHTTPServer):
    """Serves one fleet's status; the store is read by one request at a time, so a store
    client that is not safe to share between threads is never shared."""

    def __init__(self, report: Report, address: tuple[str, int], allowed: frozenset[str]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.report = report
        self.allowed = allowed
        self.reading = threading.Lock()
        super().__init__(address, _Handler)


def make_server(
    report: Report, host: str, port: int, allow_hosts: Iterable[str] = ()
) -> ThreadingHTTPServer:
    """A server for ``report`` bound to ``host:port`` (0: any free port), not yet serving,
    that answers only requests whose ``Host`` it serves (see :func:`allowed_hosts`)."""
    allowed = allowed_hosts(host, allow_hosts)
    try:
        return PageServer(report, (host, port), allowed)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve the status page on {host} port {port}: {exc.strerror or exc}; "
            "give another --serve PORT or --host"
        ) from None


def allowed_hosts(host: str, allow_hosts: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` names a page listening on ``host`` answers to besides IP addresses:
    the loopback names, ``host`` itself and each of ``allow_hosts``."""
    given = list(allow_hosts)
    bad = [name for name in given if not host_name(name) or any(c in name for c in "/ @?#")]
    if bad:
        raise ConfigError(f"--allow-host {bad[0]!r}: give a host name such as status.example.com")
    return frozenset({host_name(name) for name in (host, *given)} | LOOPBACK_NAMES)


def host_name(header: str) -> str:
    """The name a ``Host`` header (or an ``--allow-host``) names: lower case, without its
    port, brackets or trailing dot."""
    name = header.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return name.rstrip(".")


def _is_address(name: str) -> bool:
    """Whether ``name`` is an IP address, which no rebinding page can be served under."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class _Handler(BaseHTTPRequestHandler):
    server_version = f"beatless/{__version__}"

    def do_GET(self) -> None:
        if not self._host_served():
            return
        path = urlsplit(self.path).path
        if path == "/":
            self._page()
        elif path == "/status.json":
            self._json()
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", f"no page at {path}\n")

    def _host_served(self) -> bool:
        """Whether the request names a ``Host`` this page is served under; if not, it is
        answered 421 here, with no data."""
        allowed = cast("PageServer", self.server).allowed
        headers = self.headers.get_all("Host") or []
        if len(headers) <= 1:
            name = host_name(headers[0]) if headers else ""
            if not headers or name in allowed or _is_address(name):
                return True
        self._send(
            HTTPStatus.MISDIRECTED_REQUEST,
            "text/plain",
            "this page answers only to localhost, an IP address or a name given with "
            "--allow-host NAME\n",
        )
        return False

    def _status(self) -> tuple[Mapping[str, Any] | None, str | None]:
        """The report, or why the store could not give it."""
        server = cast("PageServer", self.server)
        try:
            with server.reading:
                return server.report(), None
        except StoreError as exc:
            return None, f"the claim store failed: {exc}"

    def _page(self) -> None:
        status, error = self._status()
        if status is None:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/html", render_page(None, error))
        else:
            every = getattr(cast("PageServer", self.server).report, "read_every_s", None)
            self._send(HTTPStatus.OK, "text/html", render_page(status, read_every_s=every))

    def _json(self) -> None:
        status, error = self._status()
        if status is None:
            body = json.dumps({"error": error})
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, "application/json", body)
        else:
            self._send(HTTPStatus.OK, "application/json", json.dumps(status))

    def _send(self, code: HTTPStatus, kind: str, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", POLICY)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """One line per request would be one every two seconds per open page: debug only."""
        logger.debug("%s " + format, self.address_string(), *args)


# -- the page ---------------------------------------------------------------------------


def _e(value: object) -> str:
    """Any value as HTML text or attribute content."""
    return escape(str(value), quote=True)


def _ms(instant: str) -> int:
    """Epoch milliseconds of an ISO 8601 instant as the report writes them."""
    return round(datetime.fromisoformat(instant).timestamp() * 1_000)


def render_page(
    status: Mapping[str, Any] | None, error: str | None = None, *, read_every_s: float | None = None
) -> str:
    """The whole page: the status, or (with ``status`` ``None``) the store's ``error``;
    ``read_every_s``, how long a report is kept before the store is read again."""
    if status is None:
        title = "beatless status"
        body = (
            f'<h1>beatless status</h1><div id="store-error" class="alert" role="alert">'
            f"{_e(error)}; trying again every {REFRESH_MS / 1_000:g} s</div>"
        )
    else:
        title = f"beatless status: {status['namespace']}"
        body = _status_html(status, read_every_s)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head>"
        f'<body data-refresh-ms="{REFRESH_MS}">'
        '<div id="refresh-error" class="alert" role="alert" hidden></div>'
        f'<main id="status">{body}</main>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def _status_html(status: Mapping[str, Any], read_every_s: float | None) -> str:
    now_ms = _ms(status["at"])
    refresh = f"refreshed every {REFRESH_MS / 1_000:g} s"
    if read_every_s is not None and read_every_s * 1_000 >= 1.5 * REFRESH_MS:
        refresh = f"read from the store every {read_every_s:.0f} s (a big report)"
    return "".join(
        [
            f'<h1>beatless: <span id="namespace">{_e(status["namespace"])}</span></h1>',
            f'<div class="at">at <span id="at">{_e(status["at"])}</span>, {refresh}</div>',
            _problems(status["problems"]),
            _nodes(status["nodes"], now_ms),
            _live(status.get("live"), status["nodes"]),
            _entries(status["entries"], now_ms),
            _controls(status.get("audit") or []),
        ]
    )


def _problems(problems: Sequence[str]) -> str:
    if not problems:
        return '<section id="problems" class="alert good" data-count="0">No problems.</section>'
    items = "".join(f'<li class="problem">{_e(p)}</li>' for p in problems)
    return (
        f'<section id="problems" class="alert bad" role="alert" data-count="{len(problems)}">'
        f"<h2>{len(problems)} problem{'s' if len(problems) > 1 else ''}</h2>"
        f"<ul>{items}</ul></section>"
    )


def _nodes(nodes: Sequence[Mapping[str, Any]], now_ms: int) -> str:
    heading = f"<h2>Live nodes ({len(nodes)})</h2>"
    if not nodes:
        return heading + '<p id="nodes" class="muted">No node is live.</p>'
    fingerprints = {n["fingerprint"] for n in nodes}
    tzdatas = {n["tzdata"] for n in nodes}
    rows = "".join(_node(n, now_ms, len(fingerprints) > 1, len(tzdatas) > 1) for n in nodes)
    return (
        f'{heading}<table id="nodes"><thead><tr><th>node</th><th>health</th>'
        "<th>runs</th><th>schedule</th><th>tzdata</th><th>clock offset</th>"
        f"<th>last wake</th><th>last seen</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _node(node: Mapping[str, Any], now_ms: int, drifts: bool, tz_drifts: bool) -> str:
    healthy = bool(node["healthy"])
    offset, wake = node["clock_offset_ms"], node["last_wake"]
    far = offset is not None and abs(offset) > OFFSET_WARN_MS
    cells = [
        f'<td class="mono">{_e(node["node"])}</td>',
        f'<td><span class="badge {"ok" if healthy else "bad"}">{_e(node["health"])}</span></td>',
        f"<td>{_e(node['framework'])} on {_e(node['host'])} pid {_e(node['pid'])}, "
        f"beatless {_e(node['version'])}</td>",
        f'<td class="mono fingerprint{" differs" if drifts else ""}">'
        f"{_e(node['fingerprint'])}</td>",
        f'<td class="tzdata{" differs" if tz_drifts else ""}">{_e(node["tzdata"])}</td>',
        f'<td class="offset{" warn" if far else ""}">'
        f"{'unknown' if offset is None else f'{int(offset):+d} ms'}</td>",
        '<td class="wake">never</td>'
        if wake is None
        else f'<td class="wake" title="{_e(wake)}">{(now_ms - _ms(wake)) / 1_000:.1f} s ago</td>',
        f"<td>{_e(node.get('last_seen_s', '?'))} s ago</td>",
    ]
    return (
        f'<tr class="node" data-node="{_e(node["node"])}" data-healthy="{str(healthy).lower()}">'
        f"{''.join(cells)}</tr>"
    )


def _live(live: Mapping[str, Any] | None, nodes: Sequence[Mapping[str, Any]]) -> str:
    """The fleet's live revision, its fence, and the nodes still on an older one."""
    if not live:
        return ""
    by = f" by {_e(live['writer'])}" if live["writer"] else ""
    note = f": {_e(live['note'])}" if live["note"] else ""
    behind = "".join(
        f'<li class="behind" data-node="{_e(b["node"])}">{_e(b["node"])} on revision '
        f"{_e(b['revision'])}</li>"
        for b in live["behind"]
    )
    on = sum(1 for n in nodes if (n.get("live_revision") or 0) >= live["revision"])
    return (
        f'<h2>Live schedule</h2><section id="live" data-revision="{_e(live["revision"])}" '
        f'data-behind="{len(live["behind"])}"><p>revision <b>{_e(live["revision"])}</b>{by}'
        f'{note}; committed <span class="mono">{_e(live["committed"])}</span>, in force from '
        f'<span class="mono">{_e(live["fence"])}</span>; {on} node(s) on it</p>'
        + (f"<p>On an older revision:</p><ul>{behind}</ul>" if behind else "")
        + "</section>"
    )


def _entries(entries: Sequence[Mapping[str, Any]], now_ms: int) -> str:
    heading = f"<h2>Entries ({len(entries)})</h2>"
    if not entries:
        return heading + '<p class="muted">No entry is known: no node has published any.</p>'
    legend = "".join(
        f'<span><svg viewBox="0 0 10 10"><circle class="swatch" data-outcome="{o}" '
        f'cx="5" cy="5" r="5"/></svg> {o.replace("_", " ")}</span>'
        for o in OUTCOMES
    )
    return (
        f'{heading}<div class="legend">{legend}<span>higher: later after its release; '
        "ringed: run by hand</span></div>" + "".join(_entry(e, now_ms) for e in entries)
    )


def _entry(entry: Mapping[str, Any], now_ms: int) -> str:
    paused = bool(entry["paused"])
    name = _e(entry["entry"])
    fan_out = f", fan-out over {_e(entry['fan_out'])}" if entry["fan_out"] else ""
    missed = int(entry["missed"])
    return (
        f'<section class="entry{" is-paused" if paused else ""}" data-entry="{name}" '
        f'data-paused="{str(paused).lower()}">'
        f'<h3><span class="mono">{name}</span><span class="muted">{_e(entry["trigger"])}'
        f"</span>{_pause(entry)}</h3>"
        f'<div class="facts muted">address <code>{_e(entry["address"])}</code>{fan_out}; '
        f"{_last(entry['last'])}; {len(entry['timeline'])} of the last hour in the history kept, "
        f'<span class="missed{" warn" if missed else ""}">{missed} missed'
        "</span></div>"
        f"{_timeline(entry['timeline'], now_ms, entry['entry'])}"
        f"{_upcoming(entry['next'], paused)}</section>"
    )


def _pause(entry: Mapping[str, Any]) -> str:
    if not entry["paused"]:
        return '<span class="badge running pause-state">running</span>'
    control = entry.get("control") or {}
    until = f" until {_e(control['until'])}" if control.get("until") else " until resumed"
    by = f", by {_e(control['by'])} on {_e(control['host'])}" if control.get("by") else ""
    return f'<span class="badge paused pause-state">paused{until}{by}</span>'


def _last(last: Mapping[str, Any] | None) -> str:
    if last is None:
        return "never fired (in the history kept)"
    return (
        f"last {_e(last['outcome'])} on {_e(last['node'])} for {_e(last['occurrence'])}, "
        f"{_e(last['lateness_ms'])} ms after its release"
    )


def _timeline(items: Sequence[Mapping[str, Any]], now_ms: int, name: str) -> str:
    """The last hour's firings: x is the occurrence, y the lateness (log scale)."""
    grid = []
    for ms in LATENESS_TICKS_MS:
        y = _y(ms)
        label = f"{ms // 1_000} s" if ms >= 1_000 else f"{ms} ms"
        grid.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - MARGIN}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{label}</text>'
        )
    for tick in range(0, HOUR_MS + 1, TIME_TICK_MS):
        x, anchor = _x(tick / HOUR_MS), "end" if tick == HOUR_MS else "middle"
        label = "now" if tick == HOUR_MS else f"−{(HOUR_MS - tick) // 60_000} min"
        grid.append(
            f'<text x="{x:.1f}" y="{MARGIN + HEIGHT + BOTTOM - 3}" '
            f'text-anchor="{anchor}">{label}</text>'
        )
    marks = "".join(_mark(item, now_ms) for item in items)
    return (
        f'<svg class="timeline" viewBox="0 0 {WIDTH} {MARGIN + HEIGHT + BOTTOM}" role="img" '
        f'aria-label="firings of {_e(name)} in the last hour" data-count="{len(items)}">'
        f'<rect class="plot" x="{LEFT}" y="{MARGIN}" width="{WIDTH - MARGIN - LEFT}" '
        f'height="{HEIGHT}"/>{"".join(grid)}{marks}</svg>'
    )


def _x(share: float) -> float:
    """Where a share of the hour (0: an hour ago, 1: now) is drawn, inside the plot."""
    return LEFT + (WIDTH - MARGIN - LEFT) * min(max(share, 0.0), 1.0)


def _y(lateness_ms: float) -> float:
    """Where a lateness is drawn: log scale, 1 ms (or less) at the bottom, the top clamped."""
    share = math.log10(max(lateness_ms, 1)) / math.log10(LATENESS_TOP_MS)
    inner = HEIGHT - 2 * MARK_RADIUS
    return MARGIN + HEIGHT - MARK_RADIUS - inner * min(share, 1.0)


def _mark(item: Mapping[str, Any], now_ms: int) -> str:
    x = _x((int(item["occurrence_ms"]) - (now_ms - HOUR_MS)) / HOUR_MS)
    lateness = int(item["lateness_ms"])
    tenant = f", tenant {item['tenant']}" if item.get("tenant") else ""
    manual = bool(item.get("manual"))
    tip = (
        f"{item['occurrence']}{tenant}: {item['outcome']} on {item['node']}, "
        f"{lateness} ms after its release{' (run by hand)' if manual else ''}"
    )
    return (
        f'<circle class="firing" data-outcome="{_e(item["outcome"])}" '
        f'data-by="{_e(item["node"])}" data-lateness-ms="{lateness}" '
        f'data-manual="{str(manual).lower()}" cx="{x:.1f}" cy="{_y(lateness):.1f}" '
        f'r="{MARK_RADIUS}"><title>{_e(tip)}</title></circle>'
    )


def _upcoming(upcoming: Sequence[Mapping[str, Any]], paused: bool) -> str:
    if not upcoming:
        return '<p class="muted">Next firings: unknown (the trigger is not known here).</p>'
    note = " (not claimed while paused)" if paused else ""
    items = "".join(_next_item(n) for n in upcoming)
    return f'<div>Next firings{note}:</div><ol class="upcoming">{items}</ol>'


def _next_item(n: Mapping[str, Any]) -> str:
    """One coming firing; a fan-out's (no offset of its own) as its tenants' window."""
    if n.get("offset_ms") is None:
        window = int(n.get("window_ms") or 0)
        return (
            f'<li class="next" data-window-ms="{window}">{_e(n["occurrence"])}: each tenant '
            f"released at its own offset within the {window / 1_000:.3f} s jitter window "
            f"→ {_e(n['release'])} to {_e(n.get('release_last') or n['release'])}</li>"
        )
    return (
        f'<li class="next" data-offset-ms="{int(n["offset_ms"])}">'
        f"{_e(n['occurrence'])} + jitter offset {int(n['offset_ms']) / 1_000:.3f} s "
        f"→ released {_e(n['release'])}</li>"
    )


def _controls(audit: Iterable[Mapping[str, Any]]) -> str:
    recent = list(audit)[-CONTROLS_SHOWN:]
    if not recent:
        return ""
    items = "".join(
        f'<li class="control">{_e(c["at"])}: {_e(c["action"])} {_e(c["entry"])}'
        + (f" until {_e(c['until'])}" if c.get("until") else "")
        + (f" tenant {_e(c['tenant'])}" if c.get("tenant") else "")
        + f" by {_e(c['by'])} on {_e(c['host'])}</li>"
        for c in recent
    )
    return f'<h2>Recent controls</h2><ul id="controls">{items}</ul>'
