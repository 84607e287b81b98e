"""The registry, history and status of a fleet (``beatless.fleet._notes``, ``beatless.ops.status``).

Three nodes share one memory store and a clock the test moves; each wake is followed by
the board's sync, as its thread does every second.
"""

from __future__ import annotations

import io
import json
import logging
from collections import deque
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stores import ManualClock

from beatless import Entry, Every, Schedule
from beatless.cli._status import write_json
from beatless.fleet._notes import (
    REGISTRY_TTL_MS,
    HistoryItem,
    NodeRecord,
    drift,
    history_kind,
    nodes_kind,
)
from beatless.node.scheduler import Scheduler
from beatless.ops.status import render, report
from beatless.schedule.firing import iso
from beatless.stores import MemoryStore

NS = "status-test"


def schedule(jitter: str = "0s") -> Schedule:
    return Schedule(
        [
            Entry(name="tick", task="tests.tick", trigger=Every(1), max_late="5s"),
            Entry(name="slow", task="tests.slow", trigger=Every(10), jitter=jitter),
        ],
        namespace=NS,
    )


class Fleet:
    """Nodes on one memory store and one manual clock; each wake is followed by the
    board's sync, as its thread does every second. What they send is kept in ``sent``."""

    plan = staticmethod(schedule)
    """The schedule of a node started without one."""

    def __init__(self, count: int = 3) -> None:
        self.clock = ManualClock()
        self.store = MemoryStore(clock=self.clock)
        self.sent: list[tuple[str, str]] = []
        self.nodes = [self.node(f"n{i}") for i in range(count)]

    def node(self, name: str, plan: Schedule | None = None) -> Scheduler:
        return Scheduler(
            plan or self.plan(),
            store=self.store,
            clock=self.clock,
            node=name,
            enqueue=lambda firing: self.sent.append((firing.entry.name, firing.id)),
            lease="2s",
        )

    def run(self, seconds: int, nodes: list[Scheduler] | None = None) -> None:
        for _ in range(seconds * 4):
            for node in nodes if nodes is not None else self.nodes:
                node.tick()
                node.board.sync()
            self.clock.advance(250)

    def status(self, plan: Schedule | None = None) -> dict:  # type: ignore[type-arg]
        return report(self.store, NS, schedule=plan, now_ms=self.clock.now_ms())


def test_a_healthy_fleet_shows_its_nodes_and_each_entrys_last_firing() -> None:
    fleet = Fleet()
    fleet.run(25)

    status = fleet.status()

    assert status["problems"] == []
    nodes = status["nodes"]
    assert [n["node"] for n in nodes] == ["n0", "n1", "n2"]
    assert {n["fingerprint"] for n in nodes} == {schedule().fingerprint}
    assert all(n["healthy"] and n["clock_offset_ms"] == 0 and n["last_wake"] for n in nodes)
    entries = {e["entry"]: e for e in status["entries"]}
    tick = entries["tick"]
    assert tick["last"]["outcome"] in ("won", "takeover")
    assert tick["last"]["node"] in ("n0", "n1", "n2")
    assert tick["missed"] == 0
    assert tick["paused"] is False
    assert len(tick["next"]) == 3
    # Every sent firing is in the history once, written by its winner alone.
    kept = fleet.store.read_notes([history_kind(f"{NS}/tick")])[history_kind(f"{NS}/tick")]
    assert set(kept) == {id_ for entry, id_ in fleet.sent if entry == "tick"}
    # Counters are as of each node's last registry post, at most 5 s ago.
    assert 0 < sum(n["counters"]["won"] for n in nodes) <= len(fleet.sent)
    assert "no problems" in render(status)


def test_the_status_reads_the_entries_the_nodes_publish_without_the_schedule() -> None:
    fleet = Fleet()
    fleet.run(3)

    published = fleet.status()
    given = fleet.status(schedule())

    assert [e["entry"] for e in published["entries"]] == ["slow", "tick"]
    assert {e["entry"]: e["next"] for e in published["entries"]} == {
        e["entry"]: e["next"] for e in given["entries"]
    }


def test_a_node_that_stops_leaves_the_registry_when_its_record_runs_out() -> None:
    fleet = Fleet()
    fleet.run(2)
    _stopped, *alive = fleet.nodes

    fleet.run(REGISTRY_TTL_MS // 1_000 - 5, alive)
    assert len(fleet.status()["nodes"]) == 3
    fleet.run(6, alive)

    assert [n["node"] for n in fleet.status()["nodes"]] == ["n1", "n2"]
    assert fleet.status()["problems"] == []


def test_a_node_running_another_schedule_is_drift_and_a_problem(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = Fleet()
    other = fleet.node("n3", schedule(jitter="2s"))
    with caplog.at_level(logging.WARNING, logger="beatless.fleet"):
        fleet.run(6, [*fleet.nodes, other])

    problems = fleet.status()["problems"]

    assert any(
        "schedule fingerprint" in p
        and schedule().fingerprint in p
        and schedule("2s").fingerprint in p
        and "n3" in p
        for p in problems
    ), problems
    assert "different schedule fingerprints" in caplog.text
    # Said once per problem, not at every sync.
    assert caplog.text.count("different schedule fingerprints") == 4


def test_a_node_whose_loop_stalls_is_reported_by_its_own_board() -> None:
    fleet = Fleet()
    fleet.run(2)
    stalled = fleet.nodes[0]
    for _ in range(7):
        fleet.clock.advance(1_000)
        stalled.board.sync()
    fleet.run(1, fleet.nodes[1:])
    stalled.board.sync(fleet.clock.now_ms() + 5_000)  # the registry post is due again

    problems = fleet.status()["problems"]

    assert any(p.startswith("node n0: its scheduler loop has not woken for") for p in problems)


def test_a_stopped_loop_is_reported_not_running() -> None:
    fleet = Fleet()
    fleet.run(1)
    record = fleet.nodes[0].board.node_record(fleet.clock.now_ms())
    fleet.nodes[0].stop()

    dead = fleet.nodes[0].board.node_record(fleet.clock.now_ms())

    assert record.health() is None
    assert dead.health() == "its scheduler loop is not running"


def test_firings_no_node_claimed_in_time_are_missed_and_a_problem() -> None:
    fleet = Fleet()
    fleet.run(5)
    frozen_at = fleet.clock.now_ms()
    fleet.clock.advance(30_000)  # every node frozen, far past max_late (5 s) of "tick"
    fleet.run(30)

    status = fleet.status()

    tick = next(e for e in status["entries"] if e["entry"] == "tick")
    # Occurrences from the freeze to 5 s (max_late) before the fleet woke were sent by
    # nobody: 25 of them; every other second was sent.
    assert tick["missed"] == 25, tick
    assert any(
        p.startswith("entry tick: 25 missed firing(s) in the last hour") for p in status["problems"]
    )
    slow = next(e for e in status["entries"] if e["entry"] == "slow")
    assert slow["missed"] == 0, slow  # its occurrence in the freeze was within max_late (60 s)
    assert tick["missed_last"] == iso(frozen_at + 24_000)


def test_a_fresh_fleet_has_missed_nothing() -> None:
    fleet = Fleet()
    fleet.clock.advance(3_600_000)
    fleet.run(1)

    assert fleet.status()["problems"] == []


def test_no_live_node_is_a_problem() -> None:
    status = report(MemoryStore(), NS, schedule=schedule(), now_ms=0)

    assert status["nodes"] == []
    assert status["problems"] == [
        f"no live node in namespace {NS!r}: no registry record is current"
    ]
    assert [e["last"] for e in status["entries"]] == [None, None]


def test_the_json_report_has_the_documented_keys() -> None:
    fleet = Fleet()
    fleet.run(2)

    status = json.loads(json.dumps(fleet.status()))

    assert {"nodes", "entries", "problems"} <= set(status)
    assert {"node", "fingerprint", "clock_offset_ms", "last_wake"} <= set(status["nodes"][0])
    assert {"entry", "last", "next", "paused", "missed"} <= set(status["entries"][0])


def test_records_this_version_cannot_read_are_left_out() -> None:
    store = MemoryStore()
    from beatless.stores.base import Note

    store.post(
        [
            Note(nodes_kind(NS), "junk", "not json", 10_000),
            Note(nodes_kind(NS), "old", json.dumps({"node": "old"}), 10_000),
            Note(history_kind(f"{NS}/tick"), "x", "[]", 10_000),
        ]
    )

    status = report(store, NS, schedule=schedule(), now_ms=store.time_ms())

    assert status["nodes"] == []
    assert NodeRecord.from_json("[1]") is None
    assert HistoryItem.from_json("{") is None


def test_drift_names_tzdata_and_clock_offsets() -> None:
    base = NodeRecord("a", "h", 1, "1", "x", "memory", "f1", "2025a", 0, 1, 1, 0, True, 1)
    records = [
        base,
        NodeRecord("b", "h", 2, "1", "x", "memory", "f1", "2025b", -1_500, 1, 1, 0, True, 1),
    ]

    problems = drift(records)

    assert problems == [
        "live nodes run different tzdata versions: 2025a on a; 2025b on b",
        "node b: clock +1500ms from the store's (over 1000ms)",
    ]


def test_each_missed_firing_is_counted_and_logged_by_exactly_one_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = Fleet()
    fleet.run(5)
    frozen_at = fleet.clock.now_ms()
    fleet.clock.advance(30_000)  # every node frozen, far past max_late (5 s) of "tick"
    with caplog.at_level(logging.WARNING, logger="beatless.fleet"):
        fleet.run(31)  # two sweeps of every node: the missed firings have settled

    missed = [frozen_at + s * 1_000 for s in range(25)]
    assert sum(n.stats["tick"].missed for n in fleet.nodes) == 25
    # Logged as they settle, each firing in exactly one WARNING of one node.
    warnings = [r for r in caplog.records if "missed: no node claimed them" in r.getMessage()]
    assert sum(r.args[1] for r in warnings) == 25, [r.getMessage() for r in warnings]  # type: ignore[index]
    kind = history_kind(f"{NS}/tick")
    items = [json.loads(v) for v in fleet.store.read_notes([kind])[kind].values()]
    recorded = [i for i in items if i["outcome"] == "missed"]
    # The history keeps the latest 50 occurrences of the address: the oldest missed ones
    # may have left it already.
    oldest = min(i["occurrence_ms"] for i in items)
    assert sorted(i["occurrence_ms"] for i in recorded) == [o for o in missed if o >= oldest]
    # The nodes sweep at phases of their own: each firing is recorded by the node that
    # found it first and counted it, whichever that was.
    for node in fleet.nodes:
        found = sum(1 for i in recorded if i["node"] == node.node)
        assert found <= node.stats["tick"].missed


def test_ten_nodes_read_the_history_for_missed_firings_as_often_as_three(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each of ten nodes sweeps every 100 s, not every 30 s: the fleet's history reads stay
    those of three nodes however many there are."""
    sweeps = {}
    for count in (3, 10):
        fleet = Fleet(count)
        fleet.run(8)  # every node has read the registry
        reads = []
        read_logs = fleet.store.read_logs

        def counted(kinds: list[str], _reads: list[int] = reads, _read: Any = read_logs) -> Any:
            _reads.append(len(kinds))
            return _read(kinds)

        monkeypatch.setattr(fleet.store, "read_logs", counted)
        fleet.run(300)
        sweeps[count] = len(reads)
        assert {n.board.sweep_every_ms() for n in fleet.nodes} == {max(count, 3) * 10_000}

    assert 27 <= sweeps[3] <= 33, sweeps
    assert 27 <= sweeps[10] <= 33, sweeps


def test_a_fleet_started_at_once_spreads_its_sweeps_over_the_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten nodes started in the same second sweep together once, at start; after that each
    sweeps at a phase of its own: never more than three in a 10-s window, as three nodes
    would, and never more than a period (100 s) apart."""
    fleet = Fleet(10)
    at: dict[str, list[int]] = {node.node: [] for node in fleet.nodes}
    for node in fleet.nodes:
        swept = node.board._sweep_missed

        def counted(now: int, _name: str = node.node, _swept: Any = swept) -> None:
            at[_name].append(now)
            _swept(now)

        monkeypatch.setattr(node.board, "_sweep_missed", counted)
    start = fleet.clock.now_ms()
    fleet.run(400)

    later = sorted(t for times in at.values() for t in times if t - start > 100_000)
    busiest = max(sum(1 for t in later if s <= t < s + 10_000) for s in later)
    assert busiest <= 3, later
    assert 25 <= len(later) <= 33, later
    for times in at.values():
        assert times[0] == start
        assert max(b - a for a, b in pairwise(times)) <= 100_000, times


def test_occurrences_coalesced_by_catch_up_are_not_missed_and_explain_says_so() -> None:
    from beatless.cli._explain import what_happened

    fleet = Fleet()
    fleet.run(5)
    stopped_at = fleet.clock.now_ms()
    fleet.clock.advance(4_000)  # the whole fleet down for 4 s, within tick's max_late (5 s)
    fleet.nodes = [fleet.node(f"m{i}") for i in range(3)]  # started again
    fleet.run(25)

    tick = next(e for e in fleet.status()["entries"] if e["entry"] == "tick")
    assert tick["missed"] == 0, tick
    assert sum(n.stats["tick"].missed for n in fleet.nodes) == 0
    plan = schedule()
    said = what_happened(fleet.store, plan, plan.entry("tick"), None, stopped_at + 1_000)
    assert said.startswith("coalesced: catch_up 'latest' left it unclaimed"), said
    assert iso(stopped_at + 3_000) in said  # the last occurrence before the start was sent


def test_a_sent_firing_is_in_the_history_with_its_commit_before_any_sync() -> None:
    fleet = Fleet()
    for _ in range(8):  # wakes only: the boards never sync
        for node in fleet.nodes:
            node.tick()
        fleet.clock.advance(250)

    kind = history_kind(f"{NS}/tick")
    items = [json.loads(v) for v in fleet.store.read_notes([kind])[kind].values()]
    sent = [id_ for entry, id_ in fleet.sent if entry == "tick"]
    assert sent
    assert sorted(i["id"] for i in items) == sorted(sent)
    assert all(i["outcome"] in ("won", "takeover") for i in items)
    assert all(node.board._pending == deque() for node in fleet.nodes)  # nothing left to post


def test_firings_sent_in_the_two_phase_window_are_counted_per_node_and_a_problem() -> None:
    fleet = Fleet()
    fleet.run(1)
    fleet.nodes[1].stats["tick"].two_phase_window += 2  # as a commit that found them taken over
    fleet.nodes[1].board.sync(fleet.clock.now_ms() + 5_000)  # the registry post is due again

    status = fleet.status()

    counted = {n["node"]: n["counters"].get("two_phase_window") for n in status["nodes"]}
    assert counted == {"n0": 0, "n1": 2, "n2": 0}
    assert [p for p in status["problems"] if "two-phase window" in p] == [
        "node n1: 2 firing(s) sent in the two-phase window (their commit failed until their "
        "lease ran out, and another node claimed them): a second copy of each may have "
        "reached the broker under the same message id, which the workers' once-only check "
        "refuses; the node's WARNING lines name them"
    ]
    text = render(status)
    assert [line.split()[0] for line in text.splitlines() if "two-phase window 2" in line] == ["n1"]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=40,
)


@given(JSON_VALUES, st.integers(1, 50))
def test_status_json_is_written_in_pieces_as_json_dumps_writes_it_whole(
    value: Any, batch: int
) -> None:
    """``status --json`` writes the report as it encodes it, a batch of pieces at a time,
    not as one string: the text is that of ``json.dumps(indent=2)``, whatever the batch."""
    out = io.StringIO()
    write_json(value, out, batch=batch)
    assert out.getvalue() == json.dumps(value, indent=2) + "\n"
