"""The history tells what happened (``beatless.fleet._notes``, ``beatless.ops.status``).

A firing's strongest outcome is what the history shows, on every store: a note of a
weaker one (``paused``, ``missed``) never replaces a ``won``. The missed count of the
last hour comes from missed-count notes of its own, so it does not shrink when the
history (the last ``HISTORY_KEEP`` firings of an address) rolls over.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import pytest
from stores import StoreFactory
from test_status import NS, Fleet

from beatless import Entry, Every, Schedule
from beatless.errors import StoreUnavailable
from beatless.fleet._controls import set_control
from beatless.fleet._missed import MARKER_LEASE_MS, SWEEP_CHUNK
from beatless.fleet._notes import (
    HISTORY_KEEP,
    HISTORY_STRENGTH,
    HistoryItem,
    history_key,
    history_kind,
    missed_kind,
    strongest,
)
from beatless.node.scheduler import Decision, Scheduler
from beatless.ops.status import HOUR_MS, report
from beatless.schedule.firing import Firing, claim_request, firing_id, iso
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores import ClaimRequest, Outcome

TICK = Entry(name="tick", task="tests.tick", trigger=Every(1), max_late="5s")


def one_node(store_factory: StoreFactory) -> Scheduler:
    """A node of its own namespace on the store, on the store's clock."""
    return Scheduler(
        Schedule([TICK], namespace=f"history-{uuid.uuid4().hex[:8]}"),
        store=store_factory(),
        node="n0",
        enqueue=lambda firing: None,
        clock=store_factory.clock if store_factory.exact_clock else time.time,
    )


def test_every_outcome_of_the_history_has_one_strength_and_a_sent_firing_is_strongest() -> None:
    assert set(HISTORY_STRENGTH) == DecisionOutcome.HISTORY
    sent = min(HISTORY_STRENGTH["won"], HISTORY_STRENGTH["takeover"])
    assert all(HISTORY_STRENGTH[o] < sent for o in ("paused", "missed", "skipped_overlap"))
    # A weaker outcome never has the key a claim's outcome has.
    assert history_key("f", "won") == history_key("f", "takeover") == "f"
    assert len({history_key("f", o) for o in ("won", "paused", "missed")}) == 3


def test_strongest_keeps_one_item_per_firing_with_its_strongest_outcome() -> None:
    def item(outcome: str, at_ms: int, id_: str = "f") -> HistoryItem:
        return HistoryItem(id_, "tick", None, 1_000, 1_000, "n", outcome, 0, at_ms)

    kept = strongest([item("paused", 5), item("won", 3), item("missed", 9), item("paused", 1, "g")])

    assert [(i.id, i.outcome) for i in kept] == [("f", "won"), ("g", "paused")]


def test_a_won_firing_then_noted_paused_by_another_node_stays_won(
    store_factory: StoreFactory,
) -> None:
    """The winner's note goes with its commit; a node that had read a pause the winner
    had not yet posts ``paused`` for the same firing after it: the history says ``won``,
    in the status and in ``explain``."""
    from beatless.cli._explain import what_happened

    winner = one_node(store_factory)
    store, board, plan = winner.store, winner.board, winner.schedule
    occurrence = (store_factory.now_ms() // 1_000 - 2) * 1_000
    firing = Firing.of(TICK, None, plan.address(TICK), occurrence)
    request = claim_request(firing)
    assert store.claim([request], node="n0", lease_ms=30_000) == [Outcome.WON]
    store.commit([firing.id], node="n0", notes=winner.wake.history_notes([(firing, "won")]))
    late = Decision(firing, "paused", "n1", 200)
    store.post([board.history_note(firing.address, HistoryItem.of(late))])

    status = report(store, plan.namespace, schedule=plan, now_ms=store_factory.now_ms())

    tick = status["entries"][0]
    assert [(i["id"], i["outcome"]) for i in tick["recent"]] == [(firing.id, "won")]
    assert tick["counts"] == {"won": 1}
    said = what_happened(store, plan, TICK, None, occurrence)
    assert said.startswith("fired: sent by node n0"), said


def ladder_fleet() -> Fleet:
    """Three nodes with the preferred claimer on, and an entry whose max_late holds the
    ladder: each firing is claimed by its preferred node, the others look again later."""

    class Ladder(Fleet):
        plan = staticmethod(
            lambda: Schedule(
                [Entry(name="tick", task="tests.tick", trigger=Every(2), max_late="60s")],
                namespace=NS,
            )
        )

    return Ladder()


def test_a_firing_the_preferred_node_sent_before_a_pause_is_not_recorded_paused_by_others() -> None:
    """The pause lands after the preferred node sent a firing and before the other nodes'
    rungs: they see it paused when they look again, but the preferred node dealt with it,
    so they leave it (delegated), and nobody writes ``paused`` for a firing that ran."""
    fleet = ladder_fleet()
    fleet.run(12)  # every node in every view
    decided: list[Decision] = []
    for node in fleet.nodes:
        node.on_decision = decided.append
    release = (fleet.clock.now_ms() // 2_000 + 1) * 2_000
    # Up to the tick at the release, no node has read a pause; right after it, all have.
    while fleet.clock.now_ms() < release:
        for node in fleet.nodes:
            node.tick()
            node.board.sync()
        fleet.clock.advance(250)
    for node in fleet.nodes:
        node.tick()
    set_control(fleet.store, NS, "pause", "tick")
    for node in fleet.nodes:
        node.board.sync()
    fleet.clock.advance(250)
    fleet.run(12)

    sent = firing_id(f"{NS}/tick", release)
    assert ("tick", sent) in fleet.sent
    outcomes = [d.outcome for d in decided if d.firing.id == sent]
    assert "paused" not in outcomes, outcomes
    later = [d for d in decided if d.firing.occurrence_ms > release + 2_000]
    assert later
    assert all(d.outcome in ("paused", "delegated") for d in later)
    tick = fleet.status()["entries"][0]
    assert {i["outcome"] for i in tick["recent"] if i["id"] == sent} == {"won"}


def test_missed_in_the_last_hour_holds_when_the_history_rolls_over_and_ends_after_it() -> None:
    """82 firings missed, then far more than ``HISTORY_KEEP`` sent: the history no longer
    holds one missed firing, and the status still counts 82 (a problem) for the hour after
    them; then 0."""
    fleet = Fleet()
    fleet.run(5)
    frozen_at = fleet.clock.now_ms()
    fleet.clock.advance(87_000)  # every node frozen: tick's max_late is 5 s
    fleet.run(35)  # past two sweeps: every missed firing counted, by one node
    missed = fleet.status()["entries"]
    assert next(e for e in missed if e["entry"] == "tick")["missed"] == 82

    fleet.run(HISTORY_KEEP + 20)  # the history of tick is all sent firings now

    kind = history_kind(f"{NS}/tick")
    kept = [HistoryItem.from_json(v) for v in fleet.store.read_notes([kind])[kind].values()]
    assert all(i is not None and i.outcome != "missed" for i in kept)
    status = fleet.status()
    tick = next(e for e in status["entries"] if e["entry"] == "tick")
    assert tick["missed"] == 82, tick
    assert tick["missed_last"] == iso(frozen_at + 81_000)
    assert any(p.startswith("entry tick: 82 missed firing(s)") for p in status["problems"])

    # One node runs on (a wake and a sync a second) to the end of the hour of the last
    # missed firing: counted until then, and not after.
    node, last = fleet.nodes[0], frozen_at + 81_000
    while fleet.clock.now_ms() < last + HOUR_MS:
        node.tick()
        node.board.sync()
        fleet.clock.advance(1_000)
    fleet.clock.advance(last + HOUR_MS - fleet.clock.now_ms())
    tick = next(e for e in fleet.status()["entries"] if e["entry"] == "tick")
    assert (tick["missed"], tick["missed_last"]) == (1, iso(last)), tick
    fleet.clock.advance(1)
    status = fleet.status()
    assert next(e for e in status["entries"] if e["entry"] == "tick")["missed"] == 0
    assert status["problems"] == []


@pytest.mark.parametrize("count", [3, 1_500])
def test_missed_counts_are_kept_per_address_on_every_store(
    store_factory: StoreFactory, count: int
) -> None:
    """The missed-count notes a sweep writes (more than one when they would not fit one
    note) are read back by the status on every store, each occurrence once."""
    node = one_node(store_factory)
    plan = node.schedule
    now = store_factory.now_ms()
    occurrences = [now - 10 * 60_000 + 100 * i for i in range(count)]
    notes = node.board.missed_notes(plan.address(TICK), occurrences, now)
    assert len(notes) == (1 if count < 1_000 else 2)
    node.store.post(notes)

    kind = missed_kind(plan.address(TICK))
    assert len(node.store.read_notes([kind])[kind]) == len(notes)
    status = report(node.store, plan.namespace, schedule=plan, now_ms=now)
    assert status["entries"][0]["missed"] == count


def test_a_sweep_after_a_long_freeze_claims_its_markers_in_chunks_and_counts_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """600 firings missed at once (every node frozen 10 minutes): the sweep claims their
    markers at most ``SWEEP_CHUNK`` per call, not in one call that could outlast a store's
    timeout. A chunk the store fails is found again at the next sweep: still counted once."""
    fleet = Fleet()
    fleet.run(5)
    claim = fleet.store.claim
    chunks: list[int] = []
    failed: list[int] = []

    def claiming(requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        if lease_ms == MARKER_LEASE_MS:
            if len(chunks) == 1 and not failed:
                failed.append(len(requests))
                raise StoreUnavailable("link cut mid-sweep")
            chunks.append(len(requests))
        return claim(requests, node=node, lease_ms=lease_ms)

    monkeypatch.setattr(fleet.store, "claim", claiming)
    fleet.clock.advance(605_000)
    fleet.run(35)

    tick = next(e for e in fleet.status()["entries"] if e["entry"] == "tick")
    assert tick["missed"] == 600, tick
    assert failed == [SWEEP_CHUNK]
    assert max(chunks) == SWEEP_CHUNK
    assert sum(chunks) >= 600
