"""``beatless demo``: real node processes racing for firings on a temporary SQLite store.

The parent starts ``--nodes`` processes (``python -m beatless.cli.demo node ...``), each a
full scheduler on one SQLite file with the built-in schedule below. Every node reports
when it started scheduling, each firing it wins and when it stopped, as JSON lines on its
stdout; the parent prints the firings as they come, then checks the run independently of
the nodes' decisions: it computes, from the triggers alone, every firing some node was
running for (its occurrence after the node started, its release before the node
stopped) and counts the ones no node won (missed) and the ones won more than once
(duplicates).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from beatless.core.triggers import Cron, Every
from beatless.core.urls import mask_url
from beatless.errors import ConfigError
from beatless.schedule.entry import Entry, Schedule
from beatless.schedule.firing import Firing, iso
from beatless.schedule.outcomes import DecisionOutcome

STARTUP_S = 60.0
"""How long the nodes get to start scheduling (a loaded machine takes seconds to import
and connect): ``--seconds`` counts from when every node has, or from this bound."""
NODE_STOP_S = 5.0
"""The ``timeout`` of each node's :meth:`~beatless.node.scheduler.Scheduler.stop`: half of
it at most to decide what was released by the end, then the board's last write."""
GRACE_S = NODE_STOP_S + 5.0
"""How long the nodes get to stop on their own after the end before they are killed: their
stop, then closing the store and reporting, on a machine that may run them slowly."""
FANOUT = "fanout"


def demo_schedule(namespace: str = "demo") -> Schedule:
    """The built-in schedule: plain, jittered, cron and fan-out entries, all short."""
    common: dict[str, Any] = {"max_late": "8s"}
    return Schedule(
        [
            Entry(name="tick-1s", task="demo.tick", trigger=Every("1s"), **common),
            Entry(name="tick-2s", task="demo.tick", trigger=Every("2s"), **common),
            Entry(name="spread-5s", task="demo.spread", trigger=Every("5s"), jitter="2s", **common),
            Entry(name="minutely", task="demo.minutely", trigger=Cron("* * * * *"), **common),
            Entry(
                name=FANOUT,
                task="demo.report",
                trigger=Every("10s"),
                jitter="4s",
                tenants=[f"t{i:02d}" for i in range(1, 21)],
                **common,
            ),
        ],
        namespace=namespace,
    )


# -- the parent -------------------------------------------------------------------------


@dataclass
class _Node:
    name: str
    process: subprocess.Popen[str]
    log: Path


@dataclass
class _Run:
    start_ms: int
    end_ms: int
    """When the nodes are told to stop: ``--seconds`` after :attr:`up_ms`."""
    up_ms: int = 0
    """When every node was scheduling (or the start-up bound passed)."""
    starting: set[str] = field(default_factory=set)
    """The nodes not scheduling yet, whose output is still open."""
    firings: list[dict[str, Any]] = field(default_factory=list)
    spans: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """When each node started scheduling and, once it said so, when it stopped."""
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    interrupted: bool = False
    late_commits: int = 0
    reports: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    open_streams: int = 0


def run_demo(
    *, nodes: int = 3, seconds: float = 30.0, as_json: bool = False, store: str | None = None
) -> int:
    """Run the demo; 0 when every expected firing was won exactly once, 1 otherwise.

    The nodes share a temporary SQLite file, or the claim store at ``store`` (any URL
    :func:`~beatless.stores.open_store` takes), under the namespace ``demo``: a store
    keeps one bucket, queue set or epoch per namespace, so runs share them rather than
    leave one behind each; two runs never share a firing unless they overlap in time.
    The claims expire with the store's memory of them.
    """
    if not 1 <= nodes <= 32:
        raise ConfigError(f"--nodes must be between 1 and 32, got {nodes}")
    if not 5 <= seconds <= 3_600:
        raise ConfigError(f"--seconds must be between 5 and 3600, got {seconds:g}")
    workdir = Path(tempfile.mkdtemp(prefix="beatless-demo-"))
    namespace = "demo"
    if store is None:
        url = f"sqlite:///{(workdir / 'claims.db').as_posix()}"
    else:
        url = store
        _probe(url, namespace)
    schedule = demo_schedule(namespace)
    start_ms = int(time.time() * 1_000)
    run = _Run(start_ms, start_ms + int((STARTUP_S + seconds) * 1_000))
    children: list[_Node] = []
    previous = _interrupt_on_sigterm()
    try:
        if not as_json:
            print(f"beatless demo: {nodes} nodes, {seconds:g}s, store {mask_url(url)}")
            _print_schedule(schedule)
        children = [  # each node stops when its stdin closes; run.end_ms is a backstop
            _spawn(f"node-{i}", url, namespace, run.end_ms, workdir) for i in range(1, nodes + 1)
        ]
        _collect(children, run, as_json, seconds)
    finally:
        _kill(children)
        _take_reports(run, as_json, time.time() + 1.0)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    failures = _failures(children)
    summary = summarize(schedule, run, [c.name for c in children], failures)
    _print_summary(summary, as_json)
    shutil.rmtree(workdir, ignore_errors=True)
    if run.interrupted:
        return 130
    return 0 if summary["duplicates"] == 0 and summary["missed"] == 0 and not failures else 1


def _interrupt_on_sigterm() -> Any:
    """Treat SIGTERM like Ctrl-C, so the nodes are killed either way; the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


DEMO_LEASE = "3s"
"""Time a winner has to enqueue and commit: short, so a takeover fits in ``max_late``
(8 s, with jitters up to 4 s), and long enough for a laptop that runs the nodes slowly."""


def _probe(url: str, namespace: str) -> None:
    """Reach the store once before starting nodes: one line, not a traceback per node."""
    from beatless.stores import open_store

    with open_store(url, namespace=namespace) as store:
        store.probe()


def _spawn(name: str, url: str, namespace: str, until_ms: int, workdir: Path) -> _Node:
    log = workdir / f"{name}.log"
    command = [sys.executable, "-m", "beatless.cli.demo", "node", "--store", url, "--node", name]
    command += ["--until", str(until_ms), "--namespace", namespace]
    with log.open("w") as err:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C reaches the parent only
        )
    return _Node(name, process, log)


def _collect(children: Sequence[_Node], run: _Run, as_json: bool, seconds: float) -> None:
    """Print each report as it arrives: while the nodes start, for ``seconds`` once they
    all schedule, then while they stop (each on its stdin closing), until every node has
    stopped or the grace ends."""
    for child in children:
        threading.Thread(target=_read, args=(child, run.reports), daemon=True).start()
    run.open_streams, run.starting = len(children), {child.name for child in children}
    if not as_json:
        print(_row("release (UTC)", "node", "entry", "tenant", "occurrence", "offset", "late"))
    try:
        _take_reports(run, as_json, time.time() + STARTUP_S, until_up=True)
        run.up_ms = int(time.time() * 1_000)
        run.end_ms = run.up_ms + int(seconds * 1_000)
        _take_reports(run, as_json, run.end_ms / 1_000)
        _close_inputs(children)
        _take_reports(run, as_json, run.end_ms / 1_000 + GRACE_S)
    except KeyboardInterrupt:
        run.interrupted = True
        run.end_ms = min(run.end_ms, int(time.time() * 1_000))
        run.up_ms = run.up_ms or run.end_ms


def _take_reports(run: _Run, as_json: bool, deadline: float, *, until_up: bool = False) -> None:
    """Take the nodes' reports until ``deadline``, every node's output closed or (with
    ``until_up``) every node scheduling."""
    while run.open_streams and time.time() < deadline and not (until_up and not run.starting):
        try:
            report = run.reports.get(timeout=0.1)
        except queue.Empty:
            continue
        if report.get("event") == "closed":
            run.open_streams -= 1
            run.starting.discard(report["node"])
        elif report.get("event") == "started":
            run.spans[report["node"]] = (report["start_ms"], None)
            run.starting.discard(report["node"])
        elif report.get("event") == "stats":
            run.stats[report["node"]] = report["entries"]
            started = run.spans.get(report["node"], (report["stopped_ms"], None))[0]
            run.spans[report["node"]] = (started, report["stopped_ms"])
            run.late_commits += int(report.get("late_commits", 0))
        else:
            run.firings.append(report)
            _print_firing(report, run.start_ms, as_json)


def _read(child: _Node, reports: queue.Queue[dict[str, Any]]) -> None:
    for line in child.process.stdout or ():
        with contextlib.suppress(json.JSONDecodeError):
            reports.put(json.loads(line))
    reports.put({"event": "closed", "node": child.name})


def _close_inputs(children: Sequence[_Node]) -> None:
    """Close each node's stdin: it stops on EOF."""
    for child in children:
        with contextlib.suppress(OSError):
            if child.process.stdin is not None:
                child.process.stdin.close()


def _kill(children: Sequence[_Node]) -> None:
    """Close each node's stdin (it stops on EOF), then kill by pid what is still running."""
    _close_inputs(children)
    for child in children:
        try:
            child.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def _failures(children: Sequence[_Node]) -> dict[str, str]:
    failed = {}
    for child in children:
        code = child.process.returncode
        if code not in (0, None):
            lines = child.log.read_text(errors="replace").strip().splitlines()
            failed[child.name] = f"exit code {code}" + (f": {lines[-1]}" if lines else "")
    return failed


# -- checking the run -------------------------------------------------------------------


def expected_firings(schedule: Schedule, spans: Sequence[tuple[int, int]]) -> dict[str, Firing]:
    """Every firing some node was running for, computed from the triggers alone.

    ``spans`` holds when each node started scheduling and when it stopped. A node decides
    every firing whose occurrence is at or after its start (an earlier one is left to its
    ``catch_up`` policy) and whose release is at or before its stop (a stopping node
    decides what was released by then before it leaves): so a firing in some node's span
    is one that node must have seen won, by itself or another.
    """
    if not spans:
        return {}
    first, last = min(start for start, _ in spans), max(stop for _, stop in spans)
    out = {}
    for entry in schedule.entries:
        for occurrence in entry.trigger.after(first - 1):
            if occurrence > last:
                break
            for tenant in entry.tenant_list() or (None,):
                firing = Firing.of(entry, tenant, schedule.address(entry, tenant), occurrence)
                if any(a <= occurrence and firing.release_ms <= b for a, b in spans):
                    out[firing.id] = firing
    return out


def node_spans(run: _Run) -> list[tuple[int, int]]:
    """When each node that started scheduling did so and stopped; one that never said it
    stopped (killed, crashed) is held to the end it was given."""
    return [(start, run.end_ms if stop is None else stop) for start, stop in run.spans.values()]


def summarize(
    schedule: Schedule, run: _Run, nodes: Sequence[str], failures: dict[str, str]
) -> dict[str, Any]:
    """The numbers of a run: firings, duplicates, missed, per-node wins, fan-out spread."""
    wins = Counter(f["id"] for f in run.firings)
    spans = node_spans(run)
    expected = expected_firings(schedule, spans)
    missed = [f for id_, f in expected.items() if id_ not in wins]
    in_window = [f for f in run.firings if f["id"] in expected]
    lateness = sorted(f["lateness_ms"] for f in in_window)
    per_node = Counter(f["node"] for f in run.firings)
    lost = {n: sum(s.get("lost", 0) for s in run.stats.get(n, {}).values()) for n in nodes}
    window = [iso(min(a for a, _ in spans)), iso(max(b for _, b in spans))] if spans else None
    return {
        "event": "summary",
        "namespace": schedule.namespace,
        "nodes": len(nodes),
        "seconds": (run.end_ms - run.up_ms) / 1_000,
        "startup_s": (run.up_ms - run.start_ms) / 1_000,
        "firings": len(run.firings),
        "duplicates": sum(count - 1 for count in wins.values()),
        "late_commits": run.late_commits,
        "expected": len(expected),
        "missed": len(missed),
        "missed_firings": [f"{f.address}@{iso(f.occurrence_ms)}" for f in missed[:10]],
        "window": window,
        "wins_per_node": {n: per_node.get(n, 0) for n in nodes},
        "lost_per_node": lost,
        "lateness_ms": _lateness(lateness),
        "fanout": _spread(schedule.entry(FANOUT), run.firings),
        "node_failures": failures,
        "interrupted": run.interrupted,
    }


def _lateness(values: Sequence[int]) -> dict[str, int | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": values[len(values) // 2],
        "p99": values[min(len(values) - 1, len(values) * 99 // 100)],
        "max": values[-1],
    }


def _spread(entry: Entry, firings: Sequence[dict[str, Any]]) -> dict[str, Any]:
    offsets = [f["offset_ms"] for f in firings if f["entry"] == entry.name]
    window = entry.jitter_ms
    bins = 8
    histogram = [0] * bins
    for offset in offsets:
        histogram[min(bins - 1, offset * bins // window)] += 1
    return {
        "entry": entry.name,
        "window_ms": window,
        "firings": len(offsets),
        "min_ms": min(offsets, default=None),
        "max_ms": max(offsets, default=None),
        "mean_ms": round(statistics.fmean(offsets)) if offsets else None,
        "histogram": histogram,
    }


# -- output -----------------------------------------------------------------------------


def _row(*cells: str) -> str:
    widths = (13, 8, 10, 7, 13, 8, 8)
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _clock(ms: int) -> str:
    return iso(ms)[11:23]


def _print_schedule(schedule: Schedule) -> None:
    for entry in schedule.entries:
        tenants = entry.tenant_list()
        fan = f", {len(tenants)} tenants" if tenants else ""
        jitter = f", jitter {entry.jitter_ms / 1_000:g}s" if entry.jitter_ms else ""
        print(f"  {entry.name:<10} {entry.trigger.describe()}{jitter}{fan}")
    print()


def _print_firing(report: dict[str, Any], start_ms: int, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"event": "firing", **report}), flush=True)
        return
    note = "  (occurred before the start)" if report["occurrence_ms"] < start_ms else ""
    row = _row(
        _clock(report["release_ms"]),
        report["node"],
        report["entry"],
        report["tenant"] or "-",
        _clock(report["occurrence_ms"]),
        f"{report['offset_ms']}ms",
        f"{report['lateness_ms']}ms",
    )
    print(row + note, flush=True)


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary), flush=True)
        return
    late = summary["lateness_ms"]
    print()
    started = f"{summary['startup_s']:.1f}s"
    print(f"summary ({summary['nodes']} nodes, {summary['seconds']:g}s once up in {started})")
    print(f"  firings      {summary['firings']}")
    print(f"  duplicates   {summary['duplicates']}   (a firing id won by more than one node)")
    if summary["late_commits"]:
        print(
            f"  late commits {summary['late_commits']}   (sent, but the claim ran out before its "
            f"commit: the node was starved longer than the lease, and another node may have "
            f"sent the firing again)"
        )
    if summary["window"] is None:
        window = "no node started scheduling"
    else:
        first, last = (t[11:23] for t in summary["window"])
        window = f"occurred from {first}, as a node started, and released by {last}, as it stopped"
    print(f"  missed       {summary['missed']} of {summary['expected']} expected ({window})")
    for name in summary["missed_firings"]:
        print(f"                 {name}")
    wins = "  ".join(f"{n} {c}" for n, c in summary["wins_per_node"].items())
    print(f"  wins         {wins}")
    lost = "  ".join(f"{n} {c}" for n, c in summary["lost_per_node"].items())
    print(f"  races lost   {lost}")
    if late["max"] is not None:
        print(f"  lateness     p50 {late['p50']}ms  p99 {late['p99']}ms  max {late['max']}ms")
    for line in _spread_lines(summary["fanout"]):
        print(line)
    for name, why in summary["node_failures"].items():
        print(f"  FAILED       {name}: {why}")


def _spread_lines(spread: dict[str, Any]) -> Iterator[str]:
    window = spread["window_ms"]
    if not spread["firings"]:
        yield f"  fan-out      {spread['entry']!r}: no firings yet (run longer)"
        return
    yield (
        f"  fan-out      {spread['entry']!r}: {spread['firings']} firings over a "
        f"{window / 1_000:g}s window: min {spread['min_ms']}ms, max {spread['max_ms']}ms, "
        f"mean {spread['mean_ms']}ms"
    )
    histogram = spread["histogram"]
    top = max(histogram, default=0) or 1
    step = window / len(histogram)
    for i, count in enumerate(histogram):
        bar = "#" * round(30 * count / top)
        yield f"    {i * step / 1_000:4.1f}-{(i + 1) * step / 1_000:4.1f}s  {bar} {count}"


# -- a node -----------------------------------------------------------------------------


def run_node(*, store_url: str, node: str, until_ms: int, namespace: str = "demo") -> int:
    """One demo node: schedule until ``until_ms``, stdin closing, or SIGTERM."""
    from beatless.node.scheduler import Decision, Scheduler
    from beatless.stores import open_store

    lock = threading.Lock()

    def report(decision: Decision) -> None:
        if decision.outcome in DecisionOutcome.SENT:
            _emit(lock, _firing_report(decision))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=_wait_for_eof, args=(sys.stdin, stop), daemon=True).start()
    late = _LateCommits()
    logging.getLogger("beatless.node.dispatch").addHandler(late)
    with open_store(store_url, namespace=namespace) as store:
        scheduler = Scheduler(
            demo_schedule(namespace),
            store=store,
            enqueue=_discard,
            node=node,
            on_decision=report,
            lease=DEMO_LEASE,
        )
        _emit(lock, {"event": "started", "node": node, "start_ms": scheduler.timeline.start_ms})
        scheduler.start()
        stop.wait(max(0.0, until_ms / 1_000 - time.time()))
        stopped_ms = math.floor(time.time() * 1_000)  # the stop decides what was released by then
        scheduler.stop(timeout=NODE_STOP_S)
        entries = {name: stats.as_dict() for name, stats in scheduler.stats.items()}
    _emit(
        lock,
        {
            "event": "stats",
            "node": node,
            "entries": entries,
            "late_commits": late.count,
            "stopped_ms": stopped_ms,
        },
    )
    return 0


class _LateCommits(logging.Handler):
    """Counts the node's sends whose claim ran out before their commit: the two-phase
    window, in which another node may send the firing again (a node starved of CPU for
    longer than the lease). A duplicate in the summary comes with one of these."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        from beatless.node.dispatch import LATE_COMMIT

        if record.msg == LATE_COMMIT:
            self.count += 1


def _firing_report(decision: Any) -> dict[str, Any]:
    firing = decision.firing
    return {
        "node": decision.node,
        "outcome": decision.outcome,
        "entry": firing.entry.name,
        "tenant": firing.tenant,
        "id": firing.id,
        "occurrence_ms": firing.occurrence_ms,
        "offset_ms": firing.offset_ms,
        "release_ms": firing.release_ms,
        "lateness_ms": decision.lateness_ms,
    }


def _discard(firing: Firing) -> None:
    """The demo's enqueue: there is no broker; the report to the parent is the output."""


def _emit(lock: threading.Lock, message: dict[str, Any]) -> None:
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def _wait_for_eof(stream: IO[str], stop: threading.Event) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.read()
    stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m beatless.cli.demo node --store URL --node NAME --until MS``."""
    parser = argparse.ArgumentParser(prog="python -m beatless.cli.demo")
    commands = parser.add_subparsers(dest="command", required=True)
    node = commands.add_parser("node", help="run one demo node (the demo starts these)")
    node.add_argument("--store", required=True)
    node.add_argument("--node", required=True)
    node.add_argument("--until", required=True, type=int, help="epoch milliseconds")
    node.add_argument("--namespace", default="demo")
    args = parser.parse_args(argv)
    return run_node(
        store_url=args.store, node=args.node, until_ms=args.until, namespace=args.namespace
    )


if __name__ == "__main__":
    raise SystemExit(main())
