"""The history of a fan-out's tenants: the tenants ``status`` shows keep a history each;
the others go into batch notes of their occurrence, one per store call and node
(``beatless.fleet._notes``), which ``explain`` reads for one tenant."""

from __future__ import annotations

import json

from test_status import NS, Fleet

from beatless.cli._explain import what_happened
from beatless.core.triggers import Every
from beatless.fleet._controls import set_control
from beatless.fleet._notes import (
    TENANTS_PUBLISHED,
    batch_items,
    fan_out_history_kind,
    history_kind,
)
from beatless.schedule.entry import Entry, Schedule

TENANTS = tuple(f"t{i:03d}" for i in range(100))
BASE = f"{NS}/fan"


def fan_out() -> Schedule:
    return Schedule(
        [Entry(name="fan", task="tests.fan", trigger=Every(2), tenants=TENANTS, jitter="900ms")],
        namespace=NS,
    )


class FanFleet(Fleet):
    plan = staticmethod(fan_out)


def batches(fleet: Fleet, occurrence_ms: int) -> dict[str, str]:
    kind = fan_out_history_kind(BASE, occurrence_ms)
    return fleet.store.read_notes([kind])[kind]


def occurrences(fleet: Fleet) -> list[int]:
    fired = {
        json.loads(v)["occurrence_ms"]
        for t in TENANTS[:TENANTS_PUBLISHED]
        for v in fleet.store.read_notes([history_kind(f"{BASE}/{t}")])[
            history_kind(f"{BASE}/{t}")
        ].values()
    }
    return sorted(fired)


def test_tenants_status_does_not_show_are_written_in_few_batch_notes_per_occurrence() -> None:
    fleet = FanFleet()
    fleet.run(7)

    done = occurrences(fleet)[:-1]  # the last may still be releasing
    assert len(done) >= 2
    shown, others = TENANTS[:TENANTS_PUBLISHED], TENANTS[TENANTS_PUBLISHED:]
    own = fleet.store.read_notes([history_kind(f"{BASE}/{t}") for t in TENANTS])
    # The tenants status shows keep a history of their own, one item per occurrence...
    assert all(len(own[history_kind(f"{BASE}/{t}")]) >= len(done) for t in shown)
    # ... the others have none: their firings are in their occurrence's batch notes.
    assert all(own[history_kind(f"{BASE}/{t}")] == {} for t in others)
    for occurrence in done:
        notes = batches(fleet, occurrence)
        items = [i for text in notes.values() for i in batch_items(BASE, text)]
        assert sorted(i.tenant for i in items) == sorted(others)  # each exactly once
        assert {i.outcome for i in items} == {"won"}
        assert {i.occurrence_ms for i in items} == {occurrence}
        # One note per store call and node, not one per tenant.
        assert len(notes) < len(others) / 4
        assert all(key.startswith(f"{occurrence}.n") for key in notes)
        sent = {i for _, i in fleet.sent}
        assert {i.id for i in items} <= sent


def test_explain_finds_a_tenant_in_its_occurrence_s_batch_notes() -> None:
    fleet = FanFleet()
    plan = fan_out()
    entry = plan.entry("fan")
    fleet.run(5)
    occurrence = occurrences(fleet)[0]
    (item,) = [
        i for text in batches(fleet, occurrence).values() for i in batch_items(BASE, text, "t050")
    ]

    said = what_happened(fleet.store, plan, entry, "t050", occurrence)

    assert said == f"fired: sent by node {item.node}, {item.lateness_ms} ms after its release"
    assert what_happened(fleet.store, plan, entry, "t005", occurrence).startswith("fired: sent")
    assert what_happened(fleet.store, plan, entry, "t050", occurrence - 3_600_000).startswith(
        "not in the history"
    )


def test_a_paused_fan_out_is_recorded_paused_in_batch_notes_at_the_next_sync() -> None:
    fleet = FanFleet()
    fleet.run(1)
    set_control(fleet.store, NS, "pause", "fan")
    fleet.run(6)

    paused = [
        i
        for occurrence in occurrences(fleet)
        for text in batches(fleet, occurrence).values()
        for i in batch_items(BASE, text)
        if i.outcome == "paused"
    ]
    found = {
        json.loads(text)["occurrence_ms"]
        for t in TENANTS[:TENANTS_PUBLISHED]
        for text in fleet.store.read_notes([history_kind(f"{BASE}/{t}")])[
            history_kind(f"{BASE}/{t}")
        ].values()
        if json.loads(text)["outcome"] == "paused"
    }
    found.discard(max(occurrences(fleet)))  # may still be releasing
    assert found
    for occurrence in found:
        items = [i for text in batches(fleet, occurrence).values() for i in batch_items(BASE, text)]
        # Every tenant beyond those shown is in the batch notes: sent before the pause
        # was read, or paused (by every node that found it paused: a tenant's own history
        # keeps one item per firing id, batch notes one per node).
        assert {i.tenant for i in items} == set(TENANTS[TENANTS_PUBLISHED:])
        assert {i.outcome for i in items} <= {"won", "paused"}
    assert paused
