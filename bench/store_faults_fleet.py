"""The fleets, servers and counting of ``store_faults.py``: one row's run, reused from
``tests/faults`` (the node processes, private servers, proxies, the other client of a
Redis, the analysis of the nodes' records, the copies scenarios' real workers).

A :class:`Bench` holds one row's working directory and every server, proxy, writer,
fleet and worker it starts, and stops them all by pid in :meth:`Bench.close`.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "bench"
FAULTS = ROOT / "tests" / "faults"
if str(FAULTS) not in sys.path:  # imported by store_faults.py, which puts them first
    sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(FAULTS)]

import harness  # noqa: E402
import postgres_server  # noqa: E402
from analysis import (  # noqa: E402
    Report,
    _unreported,
    analyse,
    expected_firings,
    read_records,
    read_summaries,
)
from fault_node import build_schedule  # noqa: E402
from harness import Fleet, next_whole_second  # noqa: E402
from nats_server import NatsServer  # noqa: E402
from pressure import Writer  # noqa: E402
from proxy import Proxy  # noqa: E402
from redis_server import RedisServer  # noqa: E402
from test_faults_copies import REPORTED, Copies, Workers  # noqa: E402
from test_faults_failover import Replicated  # noqa: E402

from beatless import Firing  # noqa: E402

LEASE_S = 10
MAX_LATE_S = 20
SEND_DELAY_S = 0.01
GRACE_S = 5
LEAD_S = 8
"""Seconds from starting the nodes to the schedule's anchor (the window's start)."""
NODES = ("n0", "n1", "n2")
WORKERS = ("w1", "w2")
MIB = 1024 * 1024
WAIT_QUERY = "?wait=1&wait_timeout=500ms"
REFUSED = "beatless.errors.StoreRefused: "


@dataclass(frozen=True)
class Sizes:
    """The lengths of a run: the measured window, and the restart-empty row's own."""

    window_s: int
    long_window_s: int

    @property
    def fault_at_s(self) -> float:
        """When a single fault begins after the anchor: 1.5 s into a fan-out."""
        return self.window_s // 3 // 10 * 10 + 1.5

    def spaced(self, window_s: int) -> list[float]:
        """Three fault instants spread over ``window_s``, each 1.5 s into a fan-out."""
        step = window_s // 3
        return [step * k + step // 2 // 10 * 10 + 1.5 for k in range(3)]


FULL = Sizes(window_s=60, long_window_s=90)
QUICK = Sizes(window_s=30, long_window_s=45)


@dataclass
class Outcome:
    """What one row measured: a report, a refusal at start, copies run by workers."""

    report: Report | None = None
    refused: str | None = None
    copies: Copies | None = None
    coalesced: int = 0
    """Misses a starting node's catch-up coalesced into a later occurrence."""
    reported_twice: int = 0
    """Firings sent twice that a node named in a WARNING of the two-phase window."""
    note: str = ""


# -- the servers, proxies and fleets of one row ----------------------------------------


class Bench:
    """One row's working directory and everything it starts, stopped by :meth:`close`."""

    def __init__(self, workdir: Path, sizes: Sizes, name: str) -> None:
        self.workdir = workdir
        self.sizes = sizes
        self.name = name
        self.stack = contextlib.ExitStack()

    def close(self) -> None:
        self.stack.close()

    def redis(self, name: str) -> RedisServer:
        server = RedisServer(self.workdir / name, name)
        self.stack.callback(server.kill)
        return server.start()

    def replicated(self) -> Replicated:
        store = Replicated(self.workdir / "store", self.proxy)
        self.stack.callback(store.kill)
        return store

    def postgres(self) -> postgres_server.PostgresServer:
        server = postgres_server.PostgresServer(self.workdir / "postgres")
        server.settings = {**server.settings, "synchronous_commit": "on"}
        self.stack.callback(server.stop)
        return server.start()

    def nats(self) -> NatsServer:
        server = NatsServer(self.workdir / "nats")
        self.stack.callback(server.kill)
        return server.start()

    def proxy(self, target: tuple[str, int]) -> Proxy:
        return self.stack.enter_context(Proxy(target))

    def writer(self, port: int, rate: int) -> Writer:
        made = Writer(port, rate)
        self.stack.callback(made.close)
        return made

    def fleet(self, spec: dict[str, Any]) -> Fleet:
        made = Fleet(self.workdir / "fleet", self.name, spec)
        self.stack.callback(made.stop)
        return made

    def start(self, spec: dict[str, Any], urls: list[str], **extra: Any) -> tuple[int, Fleet]:
        """Start the three nodes, node ``i`` on ``urls[i]``; the anchor and the fleet."""
        anchor = next_whole_second(LEAD_S)
        spec = {**spec, "anchor_s": anchor}
        run = self.fleet(spec)
        run.start(self.common(anchor, **extra), nodes(urls))
        return anchor, run

    def common(self, anchor: int, *, window_s: int | None = None, **extra: Any) -> dict[str, Any]:
        until = anchor + (window_s or self.sizes.window_s) + MAX_LATE_S + GRACE_S
        return {
            "send_delay_s": SEND_DELAY_S,
            "lease_s": LEASE_S,
            "until": until,
            "log_level": "INFO",  # the catch-up line, with its span (:func:`coalesced`)
            **extra,
        }

    def finish(self, run: Fleet, anchor: int, window_s: int | None = None) -> Outcome:
        """Wait for the nodes to end, then count the window's firings."""
        end = anchor + (window_s or self.sizes.window_s)
        run.wait(timeout=end + MAX_LATE_S + GRACE_S - time.time() + 30)
        report, caught_up = measure(run, (anchor, end))
        return Outcome(report, coalesced=caught_up, reported_twice=reported_twice(run, report))


def nodes(urls: list[str], suffix: str = "") -> list[dict[str, Any]]:
    return [{"node": name + suffix, "store": url} for name, url in zip(NODES, urls, strict=True)]


def week(*, big: bool = False) -> dict[str, Any]:
    """Entries every 1 and 2 s and two 30-tenant fan-outs every 10 s; ``big``: a
    300-tenant fan-out every 30 s (no jitter) instead of the two."""
    entries: list[dict[str, Any]] = [
        {"name": "tick", "every_s": 1, "max_late_s": MAX_LATE_S},
        {"name": "tock", "every_s": 2, "max_late_s": MAX_LATE_S},
    ]
    fans = [("fan_big", 30, 0, 300)] if big else [("fan_a", 10, 3, 30), ("fan_b", 10, 4, 30)]
    for name, every_s, jitter_s, tenants in fans:
        entries.append(
            {
                "name": name,
                "every_s": every_s,
                "jitter_s": jitter_s,
                "max_late_s": MAX_LATE_S,
                "tenants": tenants,
            }
        )
    return {"namespace": "faults", "entries": entries}


# -- counting ---------------------------------------------------------------------------


def measure(run: Fleet, window_s: tuple[float, float]) -> tuple[Report, int]:
    """:meth:`Fleet.report` without printing or appending to the tests' results file,
    and how many of the misses a starting node's catch-up coalesced (:func:`coalesced`):
    those are left out of the report's unreported misses."""
    sends, failed = read_records(run.record_path(n) for n in run.names)
    summaries = read_summaries(run.summary_path(n) for n in run.names)
    schedule = build_schedule(run.schedule_spec)
    window_ms = (int(window_s[0] * 1_000), int(window_s[1] * 1_000))
    report = analyse(
        run.scenario,
        schedule,
        window_ms=window_ms,
        sends=sends,
        failed_sends=failed,
        summaries=summaries,
        faults=run.faults,
    )
    report.silent_nodes = [n for n in run.names if not run.summary_path(n).exists()]
    report.files = str(run.workdir)
    sent = {send.id for send in sends}
    missed = [f for key, f in expected_firings(schedule, *window_ms).items() if key not in sent]
    caught_up = coalesced(run, missed, summaries)
    if caught_up and report.unreported_misses:
        left = [f for f in missed if f.id not in caught_up]
        report.unreported_misses = _unreported(left, summaries)
    return report, len(caught_up)


CAUGHT_UP = re.compile(
    r"entry '(?P<entry>[^']+)': \d+ occurrence\(s\) from (?P<first>\S+) to (?P<last>\S+), "
    r"before this node started, left unclaimed by catch_up="
)
"""The INFO line of a starting node's catch-up (``Scheduler._say_catch_up``)."""


def coalesced(
    run: Fleet, missed: Sequence[Firing], summaries: Sequence[dict[str, Any]]
) -> set[str]:
    """The missed firings no node reported one by one that a node's catch-up
    (``latest``, the default) coalesced into a later occurrence as it started: counted
    ``catch_up_skipped`` and said once per entry at INFO, with the span, read here from
    the nodes' logs."""
    reported = {key for s in summaries for ids in s.get("reported", {}).values() for key in ids}
    spans: list[tuple[str, int, int]] = []
    for name in run.names:
        log = run.workdir / f"{name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        for found in CAUGHT_UP.finditer(text):
            first, last = (_epoch_ms(found[k]) for k in ("first", "last"))
            spans.append((found["entry"], first, last))
    return {
        f.id
        for f in missed
        if f.id not in reported
        and any(e == f.entry.name and lo <= f.occurrence_ms <= hi for e, lo, hi in spans)
    }


def _epoch_ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1_000)


def reported_twice(run: Fleet, report: Report) -> int:
    """Firings sent twice that some node named in a two-phase-window WARNING."""
    if not report.duplicates:
        return 0
    sends, _ = read_records(run.record_path(n) for n in run.names)
    counts: dict[str, int] = {}
    for send in sends:
        counts[send.id] = counts.get(send.id, 0) + 1
    named: set[str] = set()
    for name in run.names:
        log = run.workdir / f"{name}.log"
        if log.exists():
            named.update(REPORTED.findall(log.read_text(errors="replace")))
    return sum(1 for key, count in counts.items() if count > 1 and key in named)


def refusal(run: Fleet, within_s: float) -> str | None:
    """The one line every node exited with, if every node exited within ``within_s``
    having logged exactly one refusal; ``None`` if any node still runs."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(p.poll() is not None for p in run.processes):
            break
        time.sleep(0.2)
    else:
        return None
    lines = []
    for name in run.names:
        text = (run.workdir / f"{name}.log").read_text(errors="replace")
        found = [line.split(REFUSED, 1)[1] for line in text.splitlines() if REFUSED in line]
        if len(found) != 1:
            return None
        lines.append(found[0])
    return lines[0] if len(set(lines)) == 1 else " | ".join(lines)


# -- PostgreSQL and NATS: links paused past the lease, with real workers ------------------


class BenchWorkers(Workers):
    """``celery worker`` processes of ``store_faults_worker`` (a task per bench entry)."""

    def start(self, name: str, store_url: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(harness.CODE_ROOT), str(FAULTS), str(HERE)]),
            "PYTHONUNBUFFERED": "1",
            "BENCH_FAULTS_BROKER": self.broker,
            "BENCH_FAULTS_STORE": store_url,
        }
        env.pop("COPIES_BROKER", None)
        command = [sys.executable, "-m", "celery", "-A", "store_faults_worker", "worker"]
        command += ["--without-beatless", "-P", "threads", "-c", "4", "-Q", "faults"]
        command += ["-n", f"{name}@%h", "-l", "INFO", "--without-mingle", "--without-gossip"]
        with self.log(name).open("ab") as out:
            self.processes[name] = subprocess.Popen(
                command,
                env=env,
                cwd=HERE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(" ready." in self.log(n).read_text(errors="replace") for n in self.processes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the workers did not start within {timeout:.0f}s: {self.workdir}")


@contextlib.contextmanager
def copies_nodes() -> Iterator[None]:
    """Nodes that send real Celery messages (``copies_node``) while the block runs."""
    saved = harness.NODE_SCRIPT
    harness.NODE_SCRIPT = FAULTS / "copies_node.py"
    try:
        yield
    finally:
        harness.NODE_SCRIPT = saved


def busiest(run: Fleet) -> int:
    """The index of the node that sent the most fan-out firings in the last 2 s."""
    since = time.time() - 2
    counts = [
        sum(1 for s in run.sends_of(n) if s["entry"].startswith("fan") and s["called"] > since)
        for n in run.names
    ]
    return counts.index(max(counts))
