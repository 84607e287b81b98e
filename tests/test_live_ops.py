"""Seeing live entries (issue 24, item 7): ``status``, its text and page, the metrics and
``explain`` name the fleet's live revision, its fence, the nodes behind it, and the
revision a firing ran under. Driven by a fake clock on the memory store."""

from __future__ import annotations

import argparse
import json

import pytest
from test_live_node import NS, Node, every
from test_live_node import clock as clock  # noqa: PLC0414 - the fixture, shared
from test_scheduler import Clock

from beatless.cli._explain import cmd_explain, what_happened
from beatless.fleet._notes import HistoryItem
from beatless.live import Live
from beatless.ops._page import render_page
from beatless.ops.status import BEHIND_MS, render, report
from beatless.schedule.entry import Schedule
from beatless.schedule.firing import iso
from beatless.stores.memory import MemoryStore


def test_status_shows_the_live_revision_its_fence_and_the_nodes_behind_it(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    live = Live(store, namespace=NS)
    live.put(every("report"), note="first")
    a, b = Node(store, clock), Node(store, clock)
    for _ in range(6):  # a registry record each, with revision 1
        a.run(1)
        b.run(1)
    second = live.put(every("report", args=(2,)), note="args 2")
    a.run(6)  # b is frozen: its record still says revision 1

    status = report(store, NS, now_ms=clock.ms)
    assert status["live"]["revision"] == 2
    assert status["live"]["fence"] == iso(second.fence_ms)
    assert status["live"]["note"] == "args 2"
    assert status["live"]["behind"] == [{"node": b.scheduler.node, "revision": 1}]
    nodes = {n["node"]: n for n in status["nodes"]}
    assert nodes[a.scheduler.node]["live_revision"] == 2
    assert nodes[a.scheduler.node]["live_lag_ms"] is not None
    assert not any("live revision" in p for p in status["problems"])  # not for long yet

    text = render(status)
    assert f"live schedule: revision 2 by {second.writer} (args 2)" in text
    assert "revision 1 (BEHIND)" in text
    page = render_page(status)
    assert 'id="live" data-revision="2" data-behind="1"' in page
    json.dumps(status)  # --json

    later = report(store, NS, now_ms=second.committed_ms + BEHIND_MS)
    assert any(
        p.startswith(f"node {b.scheduler.node}: runs live revision 1, the fleet's is 2")
        for p in later["problems"]
    )


def test_status_without_live_entries_has_no_live_section(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    Node(store, clock, [every("code")]).run(2)

    status = report(store, NS, now_ms=clock.ms)
    assert status["live"] is None
    assert "live schedule" not in render(status)
    assert 'id="live"' not in render_page(status)


def test_a_firing_sent_under_a_live_revision_names_it_in_its_history(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    live = Live(store, namespace=NS)
    first = live.put(every("report"), effective_in="2s")
    node = Node(store, clock)
    node.run(12)
    second = live.put(every("report", args=(2,)), effective_in="2s")
    node.run(20)
    node.scheduler.board.sync()

    sent = node.sent
    assert sent, "the live entry fired"
    schedule = Schedule([], namespace=NS)
    for firing in sent:
        said = what_happened(store, schedule, firing.entry, None, firing.occurrence_ms)
        revision = second if firing.occurrence_ms >= second.fence_ms else first
        assert f"under live revision {revision.number}" in said, said


def test_explain_names_the_live_revision_in_force_at_the_occurrence(
    clock: Clock, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore(clock=clock)
    live = Live(store, namespace=NS)
    first = live.put(every("report"), effective_in="2s")
    second = live.put(every("report", args=(2,)), effective_in="30s")
    node = Node(store, clock)
    node.run(45)
    node.scheduler.board.sync()
    monkeypatch.setattr("beatless.cli._explain.fleet_from_args", lambda args: FleetOf(store, clock))
    under_first = first.fence_ms + 10_000 - first.fence_ms % 10_000
    under_second = second.fence_ms + 10_000 - second.fence_ms % 10_000
    assert under_first < second.fence_ms
    for at, revision in ((under_first, first), (under_second, second)):
        args = argparse.Namespace(entry="report", at=iso(at), tenant=None)
        assert cmd_explain(args) == 0
        out = capsys.readouterr().out
        assert f"live revision {revision.number}" in out
        assert f"in force from {iso(revision.fence_ms)}" in out
        assert f"under live revision {revision.number}" in out


class FleetOf:
    """A fleet of the memory store, as ``fleet_from_args`` gives one."""

    def __init__(self, store: MemoryStore, clock: Clock) -> None:
        self.store, self.namespace, self.has_store = store, NS, True

    def known_schedule(self) -> Schedule:
        return Schedule([], namespace=NS)

    def open(self) -> Kept:
        return Kept(self.store)


class Kept:
    """The store, left open when a command's ``with`` ends."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def __enter__(self) -> MemoryStore:
        return self.store

    def __exit__(self, *exc: object) -> None:
        pass


def test_a_history_item_without_a_revision_reads_and_writes_as_before() -> None:
    old = (
        '{"id":"x","entry":"e","tenant":null,"occurrence_ms":1,"release_ms":1,"node":"n",'
        '"outcome":"won","lateness_ms":0,"at_ms":1,"manual":false,"coalesced":null}'
    )
    item = HistoryItem.parse(old)
    assert item.revision is None
    assert json.loads(item.to_json()) == json.loads(old)
    assert HistoryItem.parse(old[:-1] + ',"revision":7}').revision == 7
