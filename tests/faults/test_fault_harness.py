"""The fault suite's own tools do what the scenarios rely on: the proxy passes, holds
and delivers late, and cuts; the analysis counts duplicates, misses, early and stale
sends exactly. Fast: no scheduler runs here."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
from analysis import Fault, Send, analyse, expected_firings, read_records
from fault_node import build_schedule, make_enqueue, record_commits
from proxy import Proxy
from redis_server import RedisServer

from beatless import Firing
from beatless.node.dispatch import TwoPhase, dispatch_now
from beatless.stores.memory import MemoryStore

pytestmark = pytest.mark.faults

ServerFactory = Callable[[str], RedisServer]
ProxyFactory = Callable[[tuple[str, int]], Proxy]


def command(port: int, *words: str, timeout: float = 2.0) -> bytes:
    """Send one Redis command over a fresh connection and return the raw reply."""
    payload = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload.encode())
        return sock.recv(1024)


def test_proxy_passes_bytes_through(redis_server: ServerFactory, proxy: ProxyFactory) -> None:
    link = proxy(redis_server("store").address)
    assert command(link.port, "PING") == b"+PONG\r\n"


def test_paused_proxy_holds_bytes_and_delivers_them_late(
    redis_server: ServerFactory, proxy: ProxyFactory
) -> None:
    store = redis_server("store")
    link = proxy(store.address)
    link.pause()
    with pytest.raises(TimeoutError):
        command(link.port, "SET", "held", "late", timeout=0.5)
    assert command(store.port, "EXISTS", "held") == b":0\r\n", "delivered while paused"
    link.resume()
    deadline = time.monotonic() + 2
    while command(store.port, "EXISTS", "held") != b":1\r\n":
        assert time.monotonic() < deadline, "the held command was never delivered"
        time.sleep(0.02)


def is_cut(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection instead of answering."""
    try:
        sock.sendall(b"PING\r\n")
        return not sock.recv(64)
    except ConnectionError:
        return True


def new_link_is_cut(port: int) -> bool:
    """True when a new connection to ``port`` is reset, at once or at its first command."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            return is_cut(sock)
    except ConnectionError:
        return True


def test_dropped_proxy_cuts_links_and_refuses_new_ones_until_resumed(
    redis_server: ServerFactory, proxy: ProxyFactory
) -> None:
    link = proxy(redis_server("store").address)
    with socket.create_connection(("127.0.0.1", link.port), timeout=2) as before:
        assert not is_cut(before), "the link does not pass bytes before the drop"
        link.drop()
        assert is_cut(before), "a link open before the drop still answers"
    assert new_link_is_cut(link.port), "a link opened during the drop answers"
    link.resume()
    assert command(link.port, "PING") == b"+PONG\r\n"


ANCHOR_S = 1_800_000_000
SPEC = {
    "namespace": "faults",
    "anchor_s": ANCHOR_S,
    "entries": [
        {"name": "tick", "every_s": 1, "max_late_s": 20},
        {"name": "fanout", "every_s": 10, "jitter_s": 3, "max_late_s": 20, "tenants": 3},
    ],
}


def send_of(firing: Firing, node: str, after_occurrence_s: float) -> Send:
    """A send of ``firing`` by ``node``, begun ``after_occurrence_s`` after its occurrence."""
    at = firing.occurrence_ms / 1_000 + after_occurrence_s
    return Send(
        id=firing.id,
        address=firing.address,
        entry=firing.entry.name,
        occurrence_ms=firing.occurrence_ms,
        release_ms=firing.release_ms,
        max_late_ms=firing.entry.max_late_ms,
        node=node,
        called=at,
        sent=at + 0.01,
    )


def test_analysis_counts_duplicates_misses_early_and_stale_sends() -> None:
    schedule = build_schedule(SPEC)
    start = ANCHOR_S * 1_000
    firings = list(expected_firings(schedule, start, start + 10_000).values())
    assert len(firings) == 11 + 2 * 3  # tick: 11 seconds; fan-out: 2 occurrences x 3
    on_time = [send_of(f, "n0", f.offset_ms / 1_000) for f in firings[3:]]
    wrong = [
        send_of(firings[3], "n1", 5),  # a second copy
        send_of(firings[4], "n1", 25),  # stale, and a second copy
        send_of(firings[5], "n2", -60),  # early, and a second copy
    ]
    summaries = [{"outcomes": {"late": 1}, "reported": {"late": [firings[0].id]}}]
    report = analyse(
        "unit",
        schedule,
        window_ms=(start, start + 10_000),
        sends=on_time + wrong,
        failed_sends=0,
        summaries=summaries,
    )
    assert (report.expected, report.duplicates, report.misses) == (17, 3, 3)
    assert (report.stale, report.early, report.unreported_misses) == (1, 1, 2)
    assert report.window_sends_by_node == {"n0": 14, "n1": 2, "n2": 1}


def test_misses_a_node_dropped_in_bulk_count_as_reported() -> None:
    schedule = build_schedule(SPEC)
    start = ANCHOR_S * 1_000
    ticks = list(expected_firings(schedule, start, start + 2_000).values())
    summaries = [
        {
            "outcomes": {"late": 1},
            "outcomes_by_entry": {"tick": {"late": 1}},
            "reported": {"late": [ticks[0].id]},
            "stats": {"tick": {"late_node": 2}},  # one decided, one dropped in bulk
        }
    ]
    report = analyse(
        "unit",
        schedule,
        window_ms=(start, start + 2_000),
        sends=[],
        failed_sends=0,
        summaries=summaries,
    )
    assert (report.misses, report.unreported_misses) == (3 + 3, 1 + 3)


def test_a_fault_excuses_only_misses_it_held_from_release_until_late() -> None:
    schedule = build_schedule(SPEC)
    start = ANCHOR_S * 1_000
    tick = next(f for f in expected_firings(schedule, start, start).values())
    base = tick.occurrence_ms / 1_000
    assert Fault("pause", base - 1, base + 25).excuses(tick)
    assert not Fault("pause", base - 1, base + 10).excuses(tick), "ended before it was late"
    assert not Fault("pause", base + 5, base + 25).excuses(tick), "began after its release"


def test_a_send_counts_from_the_dispatchers_last_check_not_from_the_enqueue_call(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A node frozen after the dispatcher's last check and before its enqueue is called
    sends late with no check in between (the residual window): the record's ``called`` is
    the check, so the analysis sees that send in flight at the freeze."""
    schedule = build_schedule(
        {"namespace": "harness", "entries": [{"name": "tick", "every_s": 1, "max_late_s": 20}]}
    )
    record = tmp_path / "sends.jsonl"
    fd = os.open(record, os.O_WRONLY | os.O_CREAT, 0o644)
    log = logging.getLogger("beatless.node.dispatch")
    level, filters = log.level, list(log.filters)
    request.addfinalizer(lambda: (log.setLevel(level), setattr(log, "filters", filters)))
    recording = make_enqueue({"node": "n0"}, fd)

    def frozen_then_send(firing: Firing) -> None:
        time.sleep(0.3)  # the freeze: after the check, before the enqueue runs
        recording(firing)

    entry = schedule.entries[0]
    firing = Firing.of(entry, None, schedule.address(entry), int(time.time()) * 1_000)
    dispatch_now(TwoPhase(MemoryStore(), frozen_then_send, lease=10), [firing], node="n0")
    os.close(fd)
    (line,) = [json.loads(text) for text in record.read_text().splitlines()]
    assert line["sent"] - line["called"] >= 0.3
    assert log.getEffectiveLevel() == logging.DEBUG


def test_a_send_is_in_flight_until_its_commit_returns() -> None:
    """A node frozen after a send finished and before its commit reached the store leaves
    that firing to be taken over (the residual window): its duplicate is in flight at the
    freeze. A send whose commit had returned, or had been refused, before the freeze is not."""
    schedule = build_schedule(SPEC)
    start = ANCHOR_S * 1_000
    firings = list(expected_firings(schedule, start, start + 10_000).values())
    frozen_at = start / 1_000 + 5
    freeze = Fault("frozen", frozen_at, frozen_at + 30)
    cases = {  # the first copy's commit returned ...
        "after the freeze": freeze.end + 0.01,
        "never": None,
        "before the freeze": freeze.start - 0.2,
    }
    sends = []
    for firing, committed in zip(firings, cases.values(), strict=False):
        first = send_of(firing, "n0", frozen_at - 0.1 - firing.occurrence_ms / 1_000)
        assert first.sent < freeze.start, "the first copy's send finished before the freeze"
        sends.append(Send(**{**asdict(first), "committed": committed}))
        sends.append(send_of(firing, "n1", frozen_at + 7 - firing.occurrence_ms / 1_000))
    report = analyse(
        "unit",
        schedule,
        window_ms=(start, start + 10_000),
        sends=sends,
        failed_sends=0,
        summaries=[],
        faults=[freeze],
    )
    assert (report.duplicates, report.in_flight_duplicates) == (3, 2)


def test_the_fault_node_records_when_each_commit_returned(tmp_path: Path) -> None:
    schedule = build_schedule(
        {"namespace": "harness", "entries": [{"name": "tick", "every_s": 1, "max_late_s": 20}]}
    )
    record_path = tmp_path / "sends.jsonl"
    fd = os.open(record_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    store = MemoryStore()
    record_commits(store, "n0", fd)
    entry = schedule.entries[0]
    firing = Firing.of(entry, None, schedule.address(entry), int(time.time()) * 1_000)
    line = {
        "id": firing.id,
        "address": firing.address,
        "entry": "tick",
        "occurrence_ms": firing.occurrence_ms,
        "release_ms": firing.release_ms,
        "max_late_ms": 20_000,
        "node": "n0",
        "called": time.time(),
        "sent": time.time(),
    }
    os.write(fd, (json.dumps(line) + "\n").encode())
    before = time.time()
    dispatch_now(TwoPhase(store, lambda firing: None, lease=10), [firing], node="n0")
    os.close(fd)

    (send,), failed = read_records([record_path])

    assert failed == 0
    assert send.committed is not None
    assert before <= send.committed <= time.time()
