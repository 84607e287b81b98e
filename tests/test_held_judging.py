"""A firing a node saw held by another node, too late to take over, is asked about again.

A node that finds a firing held pending by another node looks at it again once the
holder's lease has run out: it takes the firing over if the holder never committed it,
while it is not late. When that look would come too late to send, the node asks the
store then with a judging claim (``beatless.node._judging``): the holder committed it,
``lost``; it let the firing go unsent (released its claim, or let its lease run out),
``missed``. Before, the node decided ``held`` and never looked again, so a firing the
holder then released unsent was sent by nobody and reported missed by nobody.

Two nodes (one a bare claim of the test's, as node ``a``) on one memory store with one
clock the test moves: the entry fires every hour, ``max_late`` 20 s, lease 5 s.
"""

from __future__ import annotations

import pytest
from test_scheduler import T0
from test_store_full_judging import MAX_LATE_S, MEMORY_S, Fleet

from beatless.fleet._notes import history_kind, missed_kind, read_history
from beatless.ops.status import report
from beatless.schedule.firing import Firing, claim_request
from beatless.stores.base import Outcome

TOO_LATE_S = 16
"""Seen held at T0 + 16 s: a look again after the lease (5 s + 0.5 s) would be late."""


def _held_by_a(fleet: Fleet, *, lease_s: float = 10) -> Firing:
    """The firing at T0, claimed pending by node ``a`` now, which will not send it."""
    firing = Firing.of(fleet.nodes["b"].schedule.entries[0], None, "default/e", round(T0 * 1_000))
    lease_ms = round(lease_s * 1_000)
    assert fleet.store.claim([claim_request(firing)], node="a", lease_ms=lease_ms) == [Outcome.WON]
    return firing


def _sees_held_too_late(fleet: Fleet, how: str) -> Firing:
    """Node ``b`` first gets an answer for the firing at ``T0 + TOO_LATE_S``, held by ``a``:
    ``frozen`` (b does not wake until then) or ``full`` (b's claims are refused as full)."""
    if how == "full":
        fleet.store.full = True
        fleet.run_until(TOO_LATE_S - 1, "b")
        fleet.store.full = False
    fleet.clock.now = T0 + TOO_LATE_S - 0.5
    firing = _held_by_a(fleet)
    fleet.clock.now = T0 + TOO_LATE_S
    fleet.tick("b")
    assert fleet.outcomes("b") == ["held"]
    return firing


@pytest.mark.parametrize("how", ["frozen", "full"])
def test_a_firing_seen_held_too_late_to_take_over_and_released_unsent_is_missed(how: str) -> None:
    fleet = Fleet(["b"])
    firing = _sees_held_too_late(fleet, how)
    fleet.run_until(TOO_LATE_S + 1, "b")
    fleet.store.release([firing.id], node="a")  # a gives it up unsent
    fleet.run_until(MAX_LATE_S + 5, "b")

    assert fleet.outcomes("b") == ["held", "missed"]
    assert fleet.sent == []
    stats = fleet.nodes["b"].stats["e"]
    assert (stats.missed, stats.lost) == (1, 1)
    assert len(fleet.nodes["b"].flights) == len(fleet.nodes["b"].judging) == 0


def test_a_firing_seen_held_too_late_whose_holder_lets_its_lease_run_out_is_missed() -> None:
    fleet = Fleet(["b"])
    _sees_held_too_late(fleet, "frozen")
    fleet.run_until(MAX_LATE_S + 10, "b")  # a's lease ran out at T0 + 25.5 s

    assert fleet.outcomes("b") == ["held", "held", "missed"]
    assert fleet.nodes["b"].stats["e"].missed == 1


def test_a_firing_seen_held_too_late_that_its_holder_commits_is_lost_once() -> None:
    fleet = Fleet(["b"])
    firing = _sees_held_too_late(fleet, "frozen")
    fleet.run_until(TOO_LATE_S + 1, "b")
    assert fleet.store.commit([firing.id], node="a") == [True]  # a sent it
    fleet.run_until(MAX_LATE_S + 5, "b")

    assert fleet.outcomes("b") == ["held", "lost"]
    stats = fleet.nodes["b"].stats["e"]
    assert (stats.missed, stats.lost) == (0, 1)


def test_a_node_that_wakes_late_for_a_firing_it_saw_held_asks_before_saying_late() -> None:
    fleet = Fleet(["b"])
    fleet.clock.now = T0 + 9.5
    firing = _held_by_a(fleet, lease_s=1)
    fleet.clock.now = T0 + 10
    fleet.tick("b")  # held: looked at again at T0 + 15.5 s, in time to take it over
    fleet.store.release([firing.id], node="a")
    fleet.clock.now = T0 + MAX_LATE_S + 1  # b froze past the look: the firing is late
    fleet.tick("b")

    assert fleet.outcomes("b") == ["held", "missed"]
    assert fleet.nodes["b"].stats["e"].late_node == 0


def test_a_firing_judged_held_after_a_full_store_and_then_released_unsent_is_missed() -> None:
    fleet = Fleet(["b"])
    firing = _held_by_a(fleet, lease_s=MEMORY_S)
    fleet.store.full = True
    fleet.run_until(MAX_LATE_S + 2, "b")  # unjudged until late
    fleet.store.full = False
    fleet.run_until(MAX_LATE_S + 3, "b")
    assert fleet.outcomes("b") == ["held"]  # the judging claim: a holds it pending

    fleet.store.release([firing.id], node="a")  # ... and gives it up unsent
    fleet.run_until(MAX_LATE_S + 10, "b")

    assert fleet.outcomes("b") == ["held", "missed"]
    assert fleet.sent == []
    assert fleet.nodes["b"].stats["e"].missed == 1


@pytest.mark.parametrize("how", ["frozen", "full"])
def test_a_firing_judged_missed_is_recorded_missed_in_the_history(how: str) -> None:
    """The judging claim writes nothing: the node writes the ``missed`` note at its next
    sync, so the history tells it and the fleet's sweep does not count it a second time."""
    fleet = Fleet(["b"])
    firing = _sees_held_too_late(fleet, how)
    fleet.run_until(TOO_LATE_S + 1, "b")
    fleet.store.release([firing.id], node="a")
    fleet.run_until(MAX_LATE_S + 5, "b")
    assert fleet.outcomes("b") == ["held", "missed"]

    fleet.nodes["b"].board.sync()
    kind = history_kind(firing.address)
    items = read_history(firing.address, fleet.store.read_notes([kind])[kind])
    assert [(i.id, i.outcome) for i in items if i.id == firing.id] == [(firing.id, "missed")]
    # Counted for the hour in a missed-count note too, as the sweep's finds are.
    missed = missed_kind(firing.address)
    assert list(fleet.store.read_notes([missed])[missed]) == [f"{firing.occurrence_ms}.b"]
    # Told once by the status, which reads both.
    status = report(fleet.store, "default", now_ms=round(fleet.clock.now * 1_000))
    assert [(e["entry"], e["missed"]) for e in status["entries"]] == [("e", 1)]
