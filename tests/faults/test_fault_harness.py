"""The fault suite's own tools do what the scenarios rely on: the proxy passes, holds
and delivers late, and cuts; the analysis counts duplicates, misses, early and stale
sends exactly. Fast: no scheduler runs here."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import harness
import pytest
from analysis import Fault, Send, analyse, expected_firings, in_flight_at_fault, read_records
from fault_node import build_schedule, make_enqueue, noted_monotonic, record_commits
from harness import Fleet
from proxy import Proxy
from redis_server import RedisServer
from test_faults_live import judge

from beatless import Firing
from beatless.core._logtext import shown
from beatless.live.revisions import Revision
from beatless.node._recorder import Recorder
from beatless.node.dispatch import LATE_COMMIT, TwoPhase, dispatch_now
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


def recorded_send(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    enqueue: Callable[[Callable[[Firing], None]], Callable[[Firing], None]],
    **dispatcher: Any,
) -> dict[str, Any]:
    """Dispatch one firing two-phase on a memory store through the fault node's recording
    enqueue (wrapped by ``enqueue``, with ``dispatcher``'s options): its record line. The
    dispatcher's logger is put back as it was afterwards."""
    schedule = build_schedule(
        {"namespace": "harness", "entries": [{"name": "tick", "every_s": 1, "max_late_s": 20}]}
    )
    record = tmp_path / "sends.jsonl"
    fd = os.open(record, os.O_WRONLY | os.O_CREAT, 0o644)
    log = logging.getLogger("beatless.node.dispatch")
    level, filters = log.level, list(log.filters)
    request.addfinalizer(lambda: (log.setLevel(level), setattr(log, "filters", filters)))
    recording = make_enqueue({"node": "n0"}, fd)
    entry = schedule.entries[0]
    firing = Firing.of(entry, None, schedule.address(entry), int(time.time()) * 1_000)
    dispatch_now(
        TwoPhase(MemoryStore(), enqueue(recording), lease=10, **dispatcher), [firing], node="n0"
    )
    os.close(fd)
    assert log.getEffectiveLevel() == logging.DEBUG
    (line,) = [json.loads(text) for text in record.read_text().splitlines()]
    return line


def test_a_send_counts_from_the_dispatchers_last_check_not_from_the_enqueue_call(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A node frozen after the dispatcher's last check and before its enqueue is called
    sends late with no check in between (the residual window): the record's ``called`` is
    the check, so the analysis sees that send in flight at the freeze."""

    def frozen_then(recording: Callable[[Firing], None]) -> Callable[[Firing], None]:
        def send(firing: Firing) -> None:
            time.sleep(0.3)  # the freeze: after the check, before the enqueue runs
            recording(firing)

        return send

    line = recorded_send(tmp_path, request, frozen_then)
    assert line["sent"] - line["called"] >= 0.3


def test_a_send_counts_from_the_age_check_even_if_frozen_before_the_sending_line(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node frozen after the dispatcher checked the claim's age and before its
    ``SENDING`` line (in its lateness check, here) sends with no check after the freeze:
    the record's ``called`` is still the age check (the dispatcher's last read of its
    monotonic clock), not the line's own time."""
    frozen_at: list[float] = []
    is_late = Recorder.is_late

    def frozen_in_the_lateness_check(self: Recorder, firing: Firing, ahead_ms: int = 0) -> bool:
        frozen_at.append(time.time())
        time.sleep(0.3)  # the last is the freeze after the age check, before the line
        return is_late(self, firing, ahead_ms)

    monkeypatch.setattr(Recorder, "is_late", frozen_in_the_lateness_check)
    line = recorded_send(tmp_path, request, lambda recording: recording, monotonic=noted_monotonic)
    assert line["called"] <= frozen_at[-1], "the age check came before the last freeze"
    assert line["sent"] - line["called"] >= 0.3


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


Copy = tuple[str, float, float, float | None]
"""A copy of a firing: the node, and when (seconds after the occurrence) it was checked,
its send finished and its commit returned (``None``: never)."""
FROZEN_MID_SEND: list[Copy] = [("n1", 0.0, 8.06, 8.07), ("n3", 3.5, 3.51, 3.52)]
"""The copies of the CI run: n1 checked the firing and was frozen (from +0.05 s to
+8.05 s) before its send finished; its claim ran out, n3 took the firing over at +3.5 s,
and n1's commit, after the thaw, found it taken over."""
N1_FROZEN = (("n1",), 0.05, 8.05)


@pytest.mark.parametrize(
    ("copies", "fault", "told", "excused"),
    [
        pytest.param(FROZEN_MID_SEND, N1_FROZEN, {"n1"}, True, id="frozen-mid-send"),
        pytest.param(FROZEN_MID_SEND, N1_FROZEN, None, True, id="frozen-mid-send-logs-unread"),
        pytest.param(FROZEN_MID_SEND, N1_FROZEN, set(), False, id="frozen-mid-send-never-told"),
        pytest.param(FROZEN_MID_SEND, (("n0",), 0.05, 8.05), {"n1"}, False, id="another-node"),
        pytest.param(FROZEN_MID_SEND, ((), 0.05, 8.05), {"n1"}, True, id="store-fault"),
        pytest.param(FROZEN_MID_SEND, None, {"n1"}, False, id="no-fault"),
        pytest.param(
            [("n1", 0.0, 0.01, 0.02), ("n3", 3.5, 3.51, 3.52)],
            N1_FROZEN,
            {"n1"},
            False,
            id="frozen-after-its-commit-returned",
        ),
        pytest.param(
            [("n1", 0.1, 8.06, 8.07), ("n3", 3.5, 3.51, 3.52)],
            N1_FROZEN,
            {"n1"},
            False,
            id="checked-after-the-freeze-began",
        ),
        pytest.param(
            [("n3", 0.0, 0.01, 0.02), ("n1", 0.04, 8.06, 8.07)],
            N1_FROZEN,
            {"n1"},
            False,
            id="only-the-second-copy-in-flight",
        ),
        pytest.param(
            [("n1", 0.0, 0.01, None), ("n3", 3.5, 3.51, 3.52)],
            (("n1",), 0.05, 0.05),
            set(),
            True,
            id="killed-before-its-commit",
        ),
    ],
)
def test_a_duplicate_is_in_flight_at_a_fault_only_if_it_struck_the_first_sender_mid_send(
    copies: list[Copy],
    fault: tuple[tuple[str, ...], float, float] | None,
    told: set[str] | None,
    excused: bool,
) -> None:
    """A firing sent twice is excused (the two-phase window) only if its first copy was
    checked before a fault of its node (or of every node) began, and its commit had not
    returned then; and, where the node's log was read and its commit returned, the node
    told it. Otherwise the duplicate counts: the judge can fail."""
    schedule = build_schedule(SPEC)
    start = ANCHOR_S * 1_000
    tick = next(iter(expected_firings(schedule, start, start).values()))
    base = tick.occurrence_ms / 1_000
    sends = [
        Send(
            **{
                **asdict(send_of(tick, node, checked)),
                "sent": base + sent,
                "committed": None if committed is None else base + committed,
            }
        )
        for node, checked, sent, committed in copies
    ]
    faults = [] if fault is None else [Fault("fault", base + fault[1], base + fault[2], fault[0])]
    told_by = None if told is None else {node: {tick.id} for node in told}
    report = analyse(
        "unit",
        schedule,
        window_ms=(start, start),
        sends=sends,
        failed_sends=0,
        summaries=[],
        faults=faults,
        told=told_by,
    )
    assert report.duplicates == 1
    assert report.in_flight_duplicates == int(excused)
    assert (tick.id in in_flight_at_fault(sends, faults, told_by)) is excused
    assert (tick.id in report.in_flight) is excused
    (example,) = report.examples["duplicate"]
    assert example.endswith("in flight at fault)") is excused
    # Each copy told by its node and times, with the faults that began near them.
    assert all(f"{node} (called " in example for node, *_ in copies)
    if fault is None:
        assert "faults near: none" in example
    if excused:
        assert "faults near: fault on " in example
    if told is not None:  # each copy says whether its node told the two-phase window
        for node, *_ in copies:
            said = "told taken over" if node in told else "not told"
            assert re.search(rf"{node} \(called [^)]*, {said}\)", example), example


def fleet_files(tmp_path: Path, copies: list[Copy]) -> tuple[Fleet, Firing]:
    """A fleet of n1 and n3 that ran and stopped, as ``fault_node`` leaves its files: each
    node's record (its sends and commits), its log (the WARNING of a commit that found
    its firing taken over) and its summary, for one tick sent by each of ``copies``."""
    spec = {"namespace": "faults", "anchor_s": ANCHOR_S, "entries": [SPEC["entries"][0]]}
    run = Fleet(tmp_path / "fleet", "unit", spec)
    tick = next(
        iter(expected_firings(build_schedule(spec), ANCHOR_S * 1_000, ANCHOR_S * 1_000).values())
    )
    base = tick.occurrence_ms / 1_000
    first = min(copies, key=lambda copy: copy[1])
    for node, checked, sent, committed in copies:
        run.names.append(node)
        line = {
            **asdict(send_of(tick, node, checked)),
            "task": tick.entry.task,
            "args": [],
            "sent": base + sent,
        }
        del line["committed"]
        lines = [line]
        taken_over = node == first[0] and committed is not None
        if committed is not None:
            lines.append({"node": node, "commit": [tick.id], "at": base + committed})
        run.record_path(node).write_text("".join(json.dumps(x) + "\n" for x in lines))
        if taken_over:
            warning = LATE_COMMIT % (tick.id, shown(tick.entry.name))
            run.log_path(node).write_text(f"2027-01-15 08:00:08 {node} WARNING x: {warning}\n")
        stats = {"tick": {"won": 1, "two_phase_window": int(taken_over)}}
        summary = {"node": node, "stats": stats, "outcomes": {"won": 1}, "reported": {}}
        run.summary_path(node).write_text(json.dumps(summary))
    return run, tick


@pytest.mark.parametrize("frozen", [True, False], ids=["n1-frozen-mid-send", "no-fault"])
def test_the_live_judge_excuses_a_second_copy_only_if_a_fault_froze_the_first_mid_send(
    frozen: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge of the live and django-celery-beat fault tests, fed the records of the CI
    run that failed: n1 frozen while it sent ``faults/tick`` (the freeze aimed at its
    poll of the rows: it stops the whole node), n3 sending it again once n1's claim ran
    out. With that freeze recorded, the second copy is in flight at a fault and passes;
    the same copies with no fault fail the judge as a firing sent twice."""
    monkeypatch.setattr(harness, "record", lambda report, code: None)  # no results line
    run, tick = fleet_files(tmp_path, FROZEN_MID_SEND)
    base = tick.occurrence_ms / 1_000
    if frozen:
        run.fault("n1 frozen", base + N1_FROZEN[1], base + N1_FROZEN[2], nodes=["n1"])
    empty = Revision(
        1, (), committed_ms=tick.occurrence_ms - 9_000, fence_ms=tick.occurrence_ms - 7_000
    )
    judged = judge(run, [empty], (base, base))  # no live entry: the tick alone is expected
    assert judged.twice == [tick.id]
    assert judged.report.in_flight_duplicates == int(frozen)
    if frozen:
        judged.assert_as_in_force(0, enough=-1)  # no live entries here
        assert judged.in_flight == {tick.id: "first sent by n1, in flight at n1 frozen"}
    else:
        with pytest.raises(AssertionError, match="sent twice, not in flight at a fault"):
            judged.assert_as_in_force(0, enough=-1)
