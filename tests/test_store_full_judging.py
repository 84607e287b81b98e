"""A firing a full store kept a node from judging is asked about before it is said missed.

Two nodes on one memory store and one clock the test moves: node A claims, sends and
commits a firing before the store fills; node B's claims of it are refused as full
until it is late. B does not report it missed: it asks the store who holds it once the
store answers again, with a judging claim that never wins (``beatless.node._judging``).
Nobody holds it: ``missed``. Another node holds or committed it: ``held`` / ``lost``.
The store still refusing past the firing's memory: the firing's history decides (sent by
another node: ``lost``; not sent: ``missed``, told as not judged); a history that cannot
be read either leaves it waiting a minute more."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from test_scheduler import T0, Clock, entry

from beatless import Entry, Every, Schedule
from beatless.errors import StoreFull, StoreUnavailable
from beatless.node._judging import HISTORY_SETTLE_MS, HISTORY_WAIT_MS
from beatless.node.scheduler import Decision, Scheduler
from beatless.schedule.firing import Firing, claim_request
from beatless.stores.base import ClaimRequest, Outcome, judging
from beatless.stores.memory import MemoryStore

MAX_LATE_S = 20
MEMORY_S = MAX_LATE_S + 10
"""An entry's memory: jitter (none) + max_late + the store's 10 s tolerance."""
STEP_S = 0.25
RETRIED = frozenset({"store_full", "unavailable"})


class FillingStore(MemoryStore):
    """A memory store that refuses every claim as full while :attr:`full`, and records
    each claim it answers."""

    full = False

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.claims: list[list[ClaimRequest]] = []

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        if self.full:
            raise StoreFull("maxmemory reached")
        self.claims.append(list(requests))
        return super().claim(requests, node=node, lease_ms=lease_ms)

    def judging_calls(self) -> list[int]:
        """The size of each judging claim answered (occurrences at the Unix epoch)."""
        return [len(c) for c in self.claims if all(r.occurrence_ms == 0 for r in c)]


class Fleet:
    """Nodes on one filling store (of class ``store``), one clock, entries every hour from
    ``T0`` (``kw``: the entry's options)."""

    def __init__(
        self,
        names: Sequence[str],
        *,
        store: type[FillingStore] = FillingStore,
        lease: str = "5s",
        entries: Sequence[Entry] = (),
        **kw: Any,
    ) -> None:
        self.clock = Clock()
        self.store = store(clock=self.clock)
        self.sent: list[tuple[str, Firing]] = []
        self.decided: dict[str, list[Decision]] = {name: [] for name in names}
        schedule = Schedule(
            list(entries) or [entry(trigger=Every(3600), max_late=f"{MAX_LATE_S}s", **kw)]
        )
        self.nodes = {
            name: Scheduler(
                schedule,
                store=self.store,
                clock=self.clock,
                node=name,
                enqueue=lambda firing, name=name: self.sent.append((name, firing)),
                lease=lease,
                preferred=False,
            )
            for name in names
        }
        self.clock.now = T0

    def tick(self, *names: str) -> None:
        for name in names:
            self.decided[name] += self.nodes[name].tick()

    def run_until(self, at_s: float, *names: str) -> None:
        """Tick ``names`` every ``STEP_S`` until ``T0 + at_s``."""
        while self.clock.now < T0 + at_s:
            self.clock.now += STEP_S
            self.tick(*names)

    def final(self, name: str) -> list[Decision]:
        """The final decisions of node ``name``: without its retries."""
        return [d for d in self.decided[name] if d.outcome not in RETRIED]

    def outcomes(self, name: str) -> list[str]:
        return [d.outcome for d in self.final(name)]


def test_a_node_refused_as_full_reports_no_miss_for_a_firing_another_node_sent_before() -> None:
    fleet = Fleet(["a", "b"])
    fleet.tick("a")  # a claims, sends and commits before the store fills
    fleet.store.full = True
    fleet.tick("b")  # b's claim is refused as full: b could not judge the firing
    fleet.run_until(MAX_LATE_S + 2, "b")  # late, still full: waiting for the store
    assert fleet.outcomes("b") == []
    assert len(fleet.nodes["b"].judging) == 1

    fleet.store.full = False
    fleet.run_until(MAX_LATE_S + 3, "b")

    assert fleet.outcomes("a") == ["won"]
    assert fleet.outcomes("b") == ["lost"]
    assert [name for name, _ in fleet.sent] == ["a"]
    assert fleet.nodes["b"].stats["e"].missed == 0
    assert fleet.nodes["b"].stats["e"].store_full > 0
    assert len(fleet.nodes["b"].flights) == len(fleet.nodes["b"].judging) == 0


def test_a_firing_another_node_holds_pending_is_held_not_missed() -> None:
    fleet = Fleet(["b"])
    firing = Firing.of(fleet.nodes["b"].schedule.entries[0], None, "default/e", round(T0 * 1_000))
    holder = [claim_request(firing)]
    assert fleet.store.claim(holder, node="a", lease_ms=MEMORY_S * 1_000) == [Outcome.WON]
    fleet.store.full = True
    fleet.run_until(MAX_LATE_S + 2, "b")
    fleet.store.full = False
    fleet.run_until(MAX_LATE_S + 3, "b")

    assert fleet.outcomes("b") == ["held"]
    assert fleet.sent == []
    assert fleet.nodes["b"].stats["e"].missed == 0
    assert fleet.store.commit([firing.id], node="a") == [True]  # still a's


def test_firings_nobody_claimed_are_missed_once_the_store_answers_in_one_judging_claim() -> None:
    fleet = Fleet(["a", "b"], tenants=("t1", "t2", "t3"))
    fleet.store.full = True
    fleet.run_until(MAX_LATE_S + 2, "a", "b")
    assert fleet.outcomes("a") == fleet.outcomes("b") == []

    fleet.store.full = False
    fleet.run_until(MAX_LATE_S + 2 + STEP_S, "a", "b")

    for name in ("a", "b"):
        assert fleet.outcomes(name) == ["missed"] * 3
        assert fleet.nodes[name].stats["e"].missed == 3
    assert fleet.sent == []
    assert fleet.store.judging_calls() == [3, 3]  # one claim per node, all three in it
    assert (
        fleet.store.claim(
            [judging(claim_request(d.firing)) for d in fleet.final("a")], node="c", lease_ms=1
        )
        == [Outcome.LATE] * 3
    )  # nothing was written


def test_a_store_full_past_the_firings_memory_is_missed_and_told_as_not_judged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = Fleet(["b"])
    fleet.store.full = True
    with caplog.at_level(logging.WARNING, logger="beatless.node.scheduler"):
        fleet.run_until(MEMORY_S, "b")
        assert fleet.outcomes("b") == []  # late, waiting for the store until its memory
        fleet.run_until(MEMORY_S + 2 + HISTORY_SETTLE_MS / 1_000, "b")

    assert fleet.outcomes("b") == ["missed"]
    assert fleet.final("b")[0].lateness_ms > MEMORY_S * 1_000
    assert fleet.nodes["b"].stats["e"].missed == 1
    assert fleet.store.judging_calls() == []
    said = [r.getMessage() for r in caplog.records if "firing(s) not judged" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("entry 'e', occurrence 2026-11-29T02:00:00")
    assert "1 firing(s) not judged: the claim store refused" in said[0]


def test_a_firing_past_its_memory_that_the_history_records_sent_is_lost_not_missed() -> None:
    """The store refuses b's claims until the firing's memory has run out: a claim's
    answer could no longer tell a sent firing from a missed one, the history does."""
    fleet = Fleet(["a", "b"])
    fleet.tick("a")  # a sends and commits, with its history note, before the store fills
    fleet.store.full = True
    fleet.run_until(MEMORY_S + 2 + HISTORY_SETTLE_MS / 1_000, "b")

    assert fleet.outcomes("a") == ["won"]
    assert fleet.outcomes("b") == ["lost"]
    assert fleet.nodes["b"].stats["e"].missed == 0
    assert len(fleet.nodes["b"].judging) == 0


class DeafStore(FillingStore):
    """A filling store whose notes cannot be read either while it is full."""

    def read_notes(self, kinds: Sequence[str]) -> dict[str, dict[str, str]]:
        if self.full:
            raise StoreFull("maxmemory reached")
        return super().read_notes(kinds)


def test_a_firing_past_its_memory_whose_history_cannot_be_read_waits_for_it() -> None:
    fleet = Fleet(["a", "b"], store=DeafStore)
    fleet.tick("a")
    fleet.store.full = True
    fleet.run_until(MEMORY_S + 10, "b")
    assert fleet.outcomes("b") == []  # past the memory, the history unread: waiting
    fleet.store.full = False
    fleet.run_until(MEMORY_S + 11, "b")

    assert fleet.outcomes("b") == ["lost"]
    assert fleet.nodes["b"].stats["e"].missed == 0


def test_a_firing_whose_history_stays_unreadable_is_missed_a_minute_past_its_memory() -> None:
    fleet = Fleet(["b"], store=DeafStore)
    fleet.store.full = True
    fleet.run_until(MEMORY_S + HISTORY_WAIT_MS / 1_000 - 1, "b")
    assert fleet.outcomes("b") == []
    fleet.run_until(MEMORY_S + HISTORY_WAIT_MS / 1_000 + 1, "b")

    assert fleet.outcomes("b") == ["missed"]
    assert fleet.nodes["b"].stats["e"].missed == 1


def test_a_node_that_stops_while_the_store_is_full_tells_its_waiting_firings_not_judged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = Fleet(["b"])
    fleet.store.full = True
    fleet.run_until(MAX_LATE_S + 1, "b")
    node = fleet.nodes["b"]
    node.on_decision = fleet.decided["b"].append
    with caplog.at_level(logging.WARNING, logger="beatless.node.scheduler"):
        node.start()
        node.stop(timeout=5)

    assert fleet.outcomes("b") == ["missed"]
    assert any("firing(s) not judged" in r.getMessage() for r in caplog.records)


STALL_S = MAX_LATE_S + 5


class StallingStore(FillingStore):
    """A store that refuses one claim as full after making its caller wait ``STALL_S``
    (a call blocked until its timeout), and answers again from then on."""

    stall_s: float = STALL_S

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        if self.full:
            self.full = False
            clock = self._clock
            assert isinstance(clock, Clock)
            clock.now += self.stall_s
            raise StoreFull("blocked publishing (low on memory)")
        return super().claim(requests, node=node, lease_ms=lease_ms)


def test_firings_released_while_a_refused_claim_held_the_node_up_are_judged_by_the_store() -> None:
    """b's claim of the first entry's firing is refused after a stall that outlasts
    max_late: the other entries' firings were released meanwhile, and b reaches them only
    once late. Another node refused too, or whose claim grew too old to send, may not
    have sent them either: the store is asked, and a firing nobody holds is reported
    missed, not late."""
    anchors = {"e1": 0, "e2": 2, "e3": 4}
    entries = [
        entry(name, trigger=Every(3600, datetime.fromtimestamp(T0 + at, UTC)), max_late="20s")
        for name, at in anchors.items()
    ]
    fleet = Fleet(["b"], store=StallingStore, entries=entries)
    fleet.store.full = True
    fleet.run_until(0.5, "b")  # e1's claim stalls, then is refused
    assert fleet.clock.now > T0 + 4 + MAX_LATE_S
    fleet.run_until(STALL_S + 2, "b")

    decided = {d.firing.entry.name: d.outcome for d in fleet.final("b")}
    assert decided == dict.fromkeys(anchors, "missed")
    assert sum(fleet.nodes["b"].stats[name].missed for name in anchors) == 3
    assert fleet.sent == []


def test_occurrences_a_refused_claim_stalled_the_node_past_are_judged_not_skipped() -> None:
    """A stall of 8 s on a trigger of every second with max_late 2 s: the occurrences
    released meanwhile are not skipped in bulk as a frozen node's would be (counted
    late, reported by nobody), but each asked about, and missed: nobody holds them."""
    fleet = Fleet(["b"], store=StallingStore, entries=[entry(max_late="2s")])
    store = fleet.store
    assert isinstance(store, StallingStore)
    store.stall_s = 8
    store.full = True
    fleet.tick("b")  # its first claim stalls 8 s, then is refused
    refused_at = fleet.clock.now
    stats = fleet.nodes["b"].stats["e"]
    skipped_at_start = stats.late_node  # before its start: not this test's concern
    fleet.run_until(refused_at - T0 + 15, "b")

    decided = {round(d.firing.occurrence_ms / 1_000): d.outcome for d in fleet.final("b")}
    released = range(round(refused_at) - 8, math.floor(refused_at - 2))  # and late
    assert {o: decided.get(o) for o in released} == dict.fromkeys(released, "missed")
    assert stats.late_node == skipped_at_start
    assert fleet.sent  # the store answers again: what is not late is sent


class LostAnswerStore(FillingStore):
    """A store whose next claim is written but its answer lost, as on a cut connection."""

    lose_answer = False

    def claim(self, requests: Sequence[ClaimRequest], *, node: str, lease_ms: int) -> list[Outcome]:
        outcomes = super().claim(requests, node=node, lease_ms=lease_ms)
        if self.lose_answer:
            self.lose_answer = False
            raise StoreUnavailable("connection reset")
        return outcomes


def test_a_firing_whose_only_claim_is_the_nodes_own_unsent_one_is_missed_and_released() -> None:
    fleet = Fleet(["b"], store=LostAnswerStore, lease="60s")
    store = fleet.store
    assert isinstance(store, LostAnswerStore)
    store.lose_answer = True
    fleet.tick("b")  # claimed, but b never heard it won
    store.full = True
    fleet.run_until(MAX_LATE_S + 2, "b")
    store.full = False
    fleet.run_until(MAX_LATE_S + 3, "b")

    assert fleet.outcomes("b") == ["missed"]
    assert fleet.sent == []
    # Released: another node asking finds nobody holds it.
    asked = judging(claim_request(fleet.final("b")[0].firing))
    assert store.claim([asked], node="c", lease_ms=1) == [Outcome.LATE]
