"""A fleet whose store lost its memory writes back what it sent, and loses only what it must.

Three nodes on one memory store (each its own store object) run a fan-out; 5 s into it
the store loses everything. Without re-seeding every firing released before the new
epoch's start + 10 s that nobody held was dropped; with it, the nodes write back what
they sent, and once all of them did, the rest is claimed and sent: nothing twice,
nothing missed. A node that knew the fleet and does not re-seed keeps the gate shut.
"""

from __future__ import annotations

from collections import Counter

import pytest
from test_scheduler import T0, Clock
from test_two_phase import monotonic_of

from beatless import Entry, Every, Firing, Schedule
from beatless.node import _reseed
from beatless.node._reseed import Reseeded, Reseeder, Ring, gate_open, reseeded_kind
from beatless.node.scheduler import Scheduler
from beatless.schedule.firing import claim_request
from beatless.stores import MemoryStore

TENANTS = 60


def fleet(
    clock: Clock, names: tuple[str, ...] = ("a", "b", "c")
) -> tuple[MemoryStore, list[Scheduler], list[Firing]]:
    store = MemoryStore(clock=clock)
    sent: list[Firing] = []

    def send(firing: Firing) -> None:
        sent.append(firing)
        clock.ms += 5

    schedule = Schedule(
        [
            Entry(
                name="fan",
                task="tasks.t",
                trigger=Every(60),
                tenants=[f"t{i}" for i in range(TENANTS)],
                jitter="10s",
                max_late="50s",
            )
        ]
    )
    nodes = [
        Scheduler(
            schedule,
            store=store.view(),
            clock=clock,
            node=name,
            enqueue=send,
            monotonic=monotonic_of(clock),
            lease="5s",
            preferred=False,
        )
        for name in names
    ]
    return store, nodes, sent


def run(nodes: list[Scheduler], clock: Clock, until_ms: int) -> None:
    """Tick every node every 100 ms, and sync each one's board every second."""
    while clock.ms < until_ms:
        clock.ms += 100
        for node in nodes:
            node.tick()
            if clock.ms % 1_000 < 100:
                node.board.sync()


def test_a_store_restarted_empty_mid_fan_out_costs_nothing_when_every_node_re_seeds() -> None:
    clock = Clock(T0 - 3)
    store, nodes, sent = fleet(clock)
    run(nodes, clock, round(T0 * 1_000) + 5_000)
    before = len(sent)
    assert 0 < before < TENANTS

    store.lose_memory()
    run(nodes, clock, round(T0 * 1_000) + 40_000)

    sends = Counter(f.id for f in sent if f.occurrence_ms == round(T0 * 1_000))
    assert max(sends.values()) == 1
    assert len(sends) == TENANTS
    assert sum(n.stats["fan"].forgotten for n in nodes) == 0
    assert all(n.store.forgot_before_ms is None for n in nodes)


def test_a_known_node_that_does_not_re_seed_keeps_the_gate_shut_and_nothing_is_sent_twice() -> None:
    clock = Clock(T0 - 3)
    store, nodes, sent = fleet(clock)
    run(nodes, clock, round(T0 * 1_000) + 5_000)
    sent_before = Counter(f.id for f in sent)

    store.lose_memory()  # c freezes with it: it never wakes again
    run(nodes[:2], clock, round(T0 * 1_000) + 60_000)

    sends = Counter(f.id for f in sent)
    assert max(sends.values()) == 1
    assert set(sent_before) <= set(sends)
    forgotten = sum(n.stats["fan"].forgotten for n in nodes[:2])
    assert forgotten > 0  # held off until late: reported, as without re-seeding
    assert all(n.store.forgot_before_ms is not None for n in nodes[:2])


def test_the_gate_waits_for_every_node_any_re_seeded_node_knew() -> None:
    a, b, c = ("a", 1), ("b", 2), ("c", 3)
    notes = [Reseeded("e", a, frozenset({a, b})), Reseeded("e", b, frozenset({a, b, c}))]
    assert gate_open("e", {a}, notes) == (False, {c})
    notes.append(Reseeded("e", c, frozenset()))
    assert gate_open("e", {a}, notes) == (True, set())
    # A note for another epoch, or a restarted process under the same name, does not count.
    assert gate_open("f", {a}, notes) == (False, {a})
    assert gate_open("e", {("c", 9)}, notes)[1] == {("c", 9)}


def test_a_note_round_trips_and_an_unreadable_one_is_none() -> None:
    note = Reseeded("tok", ("n", 5), frozenset({("m", 1)}), 3)
    assert Reseeded.of(note.to_json()) == note
    assert Reseeded.of("{") is None
    assert Reseeded.of('{"v": 2}') is None


def test_the_ring_keeps_a_firing_only_while_a_node_could_claim_it() -> None:
    clock = Clock(T0)
    _, nodes, _ = fleet(clock, ("a",))
    entry = nodes[0].schedule.entries[0]
    occurrence = round(T0 * 1_000)
    firing = Firing.of(entry, "t0", nodes[0].schedule.address(entry, "t0"), occurrence)
    ring = Ring(limit=2)
    ring.add(firing)
    assert [r.id for r in ring.requests(occurrence)] == [firing.id]
    assert ring.requests(occurrence + entry.max_late_ms + 10_001) == []


def test_the_ring_drops_the_oldest_over_its_limit_and_what_a_later_send_shows_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_reseed, "PRUNE_EVERY", 4)  # the late ones go at every 4th send
    clock = Clock(T0)
    _, nodes, _ = fleet(clock, ("a",))
    entry = nodes[0].schedule.entries[0]
    start = round(T0 * 1_000)

    def firing(tenant: str, occurrence: int) -> Firing:
        return Firing.of(entry, tenant, nodes[0].schedule.address(entry, tenant), occurrence)

    ring = Ring(limit=2)
    first, second, third = firing("t0", start), firing("t1", start), firing("t2", start)
    for sent in (first, second, third):
        ring.add(sent)
    assert [r.id for r in ring.requests(start)] == [second.id, third.id]
    # A firing whose occurrence is past the others' max_late + twice the tolerance was
    # won, so the store's clock is past theirs: they go, not at the next re-seed.
    later = firing("t3", start + entry.max_late_ms + 20_001)
    ring.add(later)
    assert len(ring) == 1
    assert [r.id for r in ring.requests(start)] == [later.id]
    ring.add(firing("t4", start + entry.max_late_ms + 20_001))
    assert len(ring) == 2  # nothing late to drop


def test_a_node_posts_its_note_only_once_every_firing_it_sent_is_written_back() -> None:
    # A firing it sent is held pending on the new epoch by a node that never saw the old
    # one: nothing is written for it, so the note waits until that claim is settled.
    clock = Clock(T0)
    store, nodes, _ = fleet(clock, ("a",))
    entry = nodes[0].schedule.entries[0]
    firing = Firing.of(entry, "t0", nodes[0].schedule.address(entry, "t0"), round(T0 * 1_000))
    a = store.view()
    notes: dict[str, str] = {}
    reseeder = Reseeder(
        a,
        node=("a", 1),
        namespace="ns",
        lease_ms=5_000,
        reach_ms=60_000,
        known_since=lambda _since: set(),
        notes=lambda: notes,
    )
    assert a.claim([claim_request(firing)], node="a", lease_ms=5_000)[0].is_won
    reseeder.sent(firing)
    reseeder.step(clock.ms)  # the first sighting
    store.lose_memory()
    fresh = store.view()
    assert fresh.claim([claim_request(firing)], node="z", lease_ms=5_000)[0].is_won
    a.claim([], node="a", lease_ms=5_000)  # a sees the new epoch

    assert not reseeder.step(clock.ms)
    assert a.read_notes([reseeded_kind("ns")])[reseeded_kind("ns")] == {}

    fresh.commit([firing.id], node="z")
    clock.ms += 600
    reseeder.step(clock.ms)
    posted = a.read_notes([reseeded_kind("ns")])[reseeded_kind("ns")]
    assert Reseeded.of(posted["a"]) is not None
