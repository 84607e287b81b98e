"""The fleet's membership as a versioned snapshot (``beatless.fleet._members``): each node's
store traffic does not grow with the fleet, members join, leave when their notes run out,
and come back; nodes of the previous version in the same namespace break nothing.

The fleets are simulated in one process (``bench/scale.py``'s ``SimFleet``): real
schedulers and boards, each on a view of its own of one memory store that counts each
view's round trips and bytes (``beatless.stores.traffic``), on one fake clock.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from beatless.fleet._controls import json_text
from beatless.fleet._members import (
    CHANGES_TTL_MS,
    MEMBERS_READ_EVERY_MS,
    PROGRESS_READ_MAX,
    WATCHED,
    Member,
    alive_json,
    changes_kind,
    member_of,
    members_kind,
    membership_kind,
    node_kind,
    shown_offset,
    watched,
)
from beatless.fleet._notes import (
    OFFSET_WARN_MS,
    REGISTRY_EVERY_MS,
    REGISTRY_TTL_MS,
    SYNC_EVERY_MS,
    NodeRecord,
    nodes_kind,
    progress_kind,
    read_registry,
)
from beatless.fleet._schema import family
from beatless.node._prefer import Progress
from beatless.stores.base import Note
from beatless.stores.traffic import Traffic, TrafficStore, size

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale import WARM_UP_MS, SimFleet, steady_schedule, traffic_figures

LEAVE_MS = REGISTRY_TTL_MS + 4 * SYNC_EVERY_MS + 2_000
"""A member that stopped posting is out of every view by then: its notes run out, a
watcher reads it gone at its next sync and writes a version, the others read it at their
next, the changes a sync later (every ``MEMBERS_READ_EVERY_MS`` at most), and the node
kinds they name at the sync after."""


def run(fleet: SimFleet, seconds: float) -> None:
    fleet.run_until(fleet.clock.ms + int(seconds * 1_000))


def views(fleet: SimFleet) -> set[tuple[str, ...]]:
    return {n.scheduler.preference.view.nodes for n in fleet.nodes if not n.frozen}


def names(count: int) -> tuple[str, ...]:
    return tuple(sorted(f"n{i}" for i in range(count)))


# -- traffic ---------------------------------------------------------------------------


SYNC_CALLS = ("post", "read_synced")
"""A board's sync: one post, one read. (Its missed-firing sweep, every 30 s, reads the
history of its entries: the schedule's size, whatever the fleet's.)"""


def per_sync(fleet: SimFleet, seconds: float) -> tuple[float, float]:
    """The sync calls and their bytes, both ways, per node per sync (the most of any
    node), over ``seconds`` from now. (One member in turn reads the whole registry every
    10 s, for nodes of an earlier beatless, in a call of its own: each node once in
    ``members × 10 s``.)"""
    for node in fleet.nodes:
        node.traffic.reset()
    run(fleet, seconds)
    syncs = seconds * 1_000 / SYNC_EVERY_MS
    traffic = [n.traffic for n in fleet.nodes]
    return (
        max(sum(t.calls[c] for c in SYNC_CALLS) for t in traffic) / syncs,
        max(sum(t.bytes[c] for c in SYNC_CALLS) for t in traffic) / syncs,
    )


@pytest.mark.slow
def test_each_nodes_round_trips_and_bytes_per_sync_do_not_grow_from_10_to_1000_nodes() -> None:
    """The same schedule (10 firings a second fleet-wide) on 10, 100 and 1,000 nodes: the
    busiest node's sync is about two round trips, and its bytes stay under a bound that does not
    depend on the fleet (the progress of at most ``PROGRESS_READ_MAX`` nodes and the two
    it watches), where reading every node's progress and record grew a hundredfold."""
    schedule = steady_schedule(20, 2, 0)
    figures = {}
    for count in (10, 100, 1_000):
        fleet = SimFleet(schedule, count, preferred=True, step_ms=1_000)
        run(fleet, WARM_UP_MS / 1_000)
        assert views(fleet) == {names(count)}
        figures[count] = per_sync(fleet, 10)
    assert figures[1_000][0] <= figures[10][0] + 0.1, figures  # a post and a read, and a
    assert figures[1_000][0] <= 3, figures  # controls' refresh or a new version at times
    bound = (WATCHED + PROGRESS_READ_MAX) * 250 + 1_500  # node kinds, and the rest
    assert all(size <= bound for _, size in figures.values()), figures
    assert figures[1_000][1] <= figures[100][1] * 1.1, figures


def test_a_node_reads_no_more_node_kinds_than_it_watches_and_the_progress_cap() -> None:
    fleet = SimFleet(steady_schedule(20, 1, 0), 30, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    asked: list[int] = []
    for node in fleet.nodes:
        original = node.scheduler.store.read_synced

        def counting(kinds, kept, original=original):  # type: ignore[no-untyped-def]
            asked.append(sum(1 for k in kinds if family(k) == "node"))
            return original(kinds, kept)

        node.scheduler.store.read_synced = counting  # type: ignore[method-assign]
    run(fleet, 10)
    assert asked
    assert max(asked) <= WATCHED + PROGRESS_READ_MAX
    assert max(asked) > WATCHED  # some progress is read: the lower ranks delegate
    delegated = sum(n.outcomes["delegated"] for n in fleet.nodes)
    assert delegated > 0


def test_the_traffic_figures_of_the_bench_are_counted_per_node() -> None:
    row = traffic_figures(steady_schedule(10, 2, 0), 5, 10, step_ms=500)
    assert row["nodes"] == 5
    assert row["firings"] >= 45
    assert 1 <= row["round_trips_per_node_s"] <= row["round_trips_per_node_s_max"] < 10
    assert row["bytes_in_per_node_s"] > 0
    assert row["bytes_out_per_node_s"] > 0
    assert row["views"] == [5]


def test_the_traffic_figures_with_churn_are_those_of_the_nodes_that_stayed() -> None:
    """One node leaves and one joins every 3 s of a 10-s window: three changes; the figures
    are of the five nodes that never left, and a join makes them read the members again
    (more bytes than in the same window without churn)."""
    quiet = traffic_figures(steady_schedule(10, 2, 0), 8, 10, step_ms=500)
    row = traffic_figures(steady_schedule(10, 2, 0), 8, 10, step_ms=500, churn_s=3)
    assert row["joins_and_leaves"] == 3
    assert row["nodes"] == 5
    assert row["bytes_in_per_node_s"] > quiet["bytes_in_per_node_s"]


def test_the_traffic_store_counts_each_views_calls_and_bytes_apart() -> None:
    store = TrafficStore(clock=lambda: 1_800_000_000.0)
    a, b = store.view(), store.view()
    a.post([Note("k", "key", "x" * 100, 10_000)])
    assert b.read_notes(["k"]) == {"k": {"key": "x" * 100}}
    assert (a.traffic.calls["post"], a.traffic.calls["read_notes"]) == (1, 0)
    assert (b.traffic.calls["post"], b.traffic.calls["read_notes"]) == (0, 1)
    assert a.traffic.sent >= 100 + len("k") + len("key")
    assert b.traffic.received >= 100
    assert store.traffics == [store.traffic, a.traffic, b.traffic]
    assert size({"ab": ["c", 1, None]}) == 2 + 1 + 8 + 1
    a.traffic.reset()
    assert a.traffic.round_trips == 0
    assert isinstance(a.traffic, Traffic)


# -- membership ------------------------------------------------------------------------


def test_a_join_is_read_from_its_change_note_not_from_the_whole_members() -> None:
    """Steady: no node reads the members or the changes. A node joins: each node reads the
    changes once or twice and the joiner's node kind, never the members whole (only the
    joiner does, at its first sync), and every view holds the joiner."""
    fleet = SimFleet(steady_schedule(10, 2, 0), 10, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    reads = {n.scheduler.node: Counter[str]() for n in fleet.nodes}
    for node in fleet.nodes:
        original = node.scheduler.store.read_synced

        def counting(kinds, kept, original=original, name=node.scheduler.node):  # type: ignore[no-untyped-def]
            reads[name]["members"] += members_kind("scale") in kinds
            reads[name]["changes"] += changes_kind("scale") in kinds
            reads[name]["joiner"] += node_kind("scale", "n10") in kinds
            return original(kinds, kept)

        node.scheduler.store.read_synced = counting  # type: ignore[method-assign]
    run(fleet, 30)
    assert all(c["members"] == c["changes"] == 0 for c in reads.values()), reads

    fleet.nodes.append(fleet.node("n10"))  # a node joins
    run(fleet, 5)
    assert all(c["members"] == 0 for c in reads.values()), reads
    assert all(1 <= c["changes"] <= 2 and c["joiner"] >= 1 for c in reads.values()), reads
    assert views(fleet) == {names(11)}


def test_a_node_that_stops_posting_leaves_every_view_and_comes_back_when_it_posts_again() -> None:
    fleet = SimFleet(steady_schedule(10, 2, 0), 6, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    assert views(fleet) == {names(6)}

    fleet.nodes[3].frozen = True
    frozen_at = fleet.clock.ms
    left_at = None
    while fleet.clock.ms < frozen_at + LEAVE_MS + 10_000:
        run(fleet, 0.5)
        if left_at is None and views(fleet) == {tuple(n for n in names(6) if n != "n3")}:
            left_at = fleet.clock.ms
    assert left_at is not None, views(fleet)
    assert left_at - frozen_at <= LEAVE_MS, left_at - frozen_at
    assert views(fleet) == {tuple(n for n in names(6) if n != "n3")}

    fleet.nodes[3].frozen = False  # back: it finds itself dropped, and posts a version
    run(fleet, 8)
    assert views(fleet) == {names(6)}
    members = fleet.store.read_notes([members_kind("scale")])[members_kind("scale")]
    assert sorted(members) == list(names(6))


def test_the_watchers_of_a_dead_node_dying_with_it_do_not_keep_it_in_the_views() -> None:
    """n2 and the two nodes that watch it (n0, n1: the ring is by name) die together;
    the nodes that watch those find them gone; each view that drops them closes its ring
    over the gap, so n6 watches n2 next, finds it gone and tells the others: a round of
    changes later, every member whose notes ran out is dropped."""
    fleet = SimFleet(steady_schedule(10, 2, 0), 7, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    assert watched(list(names(7)), "n0") == ["n1", "n2"]
    for node in fleet.nodes[:3]:
        node.frozen = True
    run(fleet, (LEAVE_MS + MEMBERS_READ_EVERY_MS + 2 * SYNC_EVERY_MS) / 1_000)
    assert views(fleet) == {("n3", "n4", "n5", "n6")}


def test_a_member_note_changes_only_when_what_the_fleet_compares_changes() -> None:
    assert shown_offset(None, None) is None
    assert shown_offset(OFFSET_WARN_MS, None) is None
    assert shown_offset(OFFSET_WARN_MS + 300, None) == OFFSET_WARN_MS + 300
    assert shown_offset(OFFSET_WARN_MS + 600, OFFSET_WARN_MS + 300) == OFFSET_WARN_MS + 300
    assert shown_offset(OFFSET_WARN_MS + 900, OFFSET_WARN_MS + 300) == OFFSET_WARN_MS + 900
    member = Member("n0", 1, "1.0", "f" * 16, "2025a", healthy=True)
    assert Member.parse(member.to_json()) == member
    assert member.record().health() is None
    unhealthy = Member("n0", 1, "1.0", "f" * 16, "2025a", healthy=False)
    assert unhealthy.record().health() is not None
    assert unhealthy.digest != member.digest


def test_a_node_kind_of_a_name_too_long_for_a_kind_is_its_digest() -> None:
    assert node_kind("ns", "n0") == "beatless/ns/node/n0"
    long = node_kind("ns", "x" * 2_000)
    assert long.startswith("beatless/ns/node/#")
    assert family(long) == family(node_kind("ns", "n0")) == "node"


# -- a fleet of two versions -----------------------------------------------------------


def old_node_notes(fleet: SimFleet, node: str) -> list[Note]:
    """What a node of the previous version posts: its registry record and a progress note
    in the fleet-wide progress kind; it writes no member note."""
    now = fleet.clock.ms
    template = fleet.nodes[0].scheduler.board.node_record(now)
    fields = {f: getattr(template, f) for f in template.__dataclass_fields__}
    fields |= {"node": node, "posted_ms": now, "last_wake_ms": now, "started_ms": now - 1_000}
    progress = Progress("0" * 16, now - 1_000, now)
    return [
        Note(nodes_kind("scale"), node, NodeRecord(**fields).to_json(), REGISTRY_TTL_MS),
        Note(progress_kind("scale"), node, progress.to_json(), REGISTRY_TTL_MS),
    ]


def test_nodes_of_the_previous_version_in_the_namespace_break_nothing() -> None:
    """Two old-style nodes keep posting their registry records and progress notes: the new
    nodes rank among themselves (the old ones are not members), send every firing once,
    and keep posting their full registry records, so the old nodes and ``status`` still
    see the whole fleet."""
    fleet = SimFleet(steady_schedule(20, 2, 0), 3, preferred=True)
    measured = fleet.clock.ms
    while fleet.clock.ms < measured + WARM_UP_MS + 40_000:
        if fleet.clock.ms % REGISTRY_EVERY_MS == 0:
            fleet.store.post(old_node_notes(fleet, "old-a") + old_node_notes(fleet, "old-b"))
        run(fleet, 0.1)
    assert views(fleet) == {names(3)}
    check = fleet.check(measured + WARM_UP_MS, fleet.clock.ms - 5_000)
    assert (check["missed"], check["duplicates"]) == (0, 0), check
    kind = nodes_kind("scale")
    registry = read_registry(fleet.store.read_notes([kind])[kind], "scale")
    assert sorted(r.node for r in registry) == ["n0", "n1", "n2", "old-a", "old-b"]
    assert all(r.counters for r in registry if not r.node.startswith("old"))
    assert sum(n.scheduler.board.skipped.total for n in fleet.nodes) == 0


def test_a_member_note_written_by_a_newer_version_is_read() -> None:
    """Fields a newer version adds to its member note are ignored."""
    member = Member("n0", 1, "9.0", "f" * 16, "2025a", healthy=True)
    text = json_text({**json.loads(member.to_json()), "joined_by": "n1"})
    assert Member.parse(text) == member
    assert membership_kind("ns") == "beatless/ns/membership"


# -- changes ---------------------------------------------------------------------------


def whole_reads(fleet: SimFleet) -> Counter[str]:
    """Count, by node, the syncs that read the members whole, from now on."""
    reads: Counter[str] = Counter()
    for node in fleet.nodes:
        original = node.scheduler.store.read_synced

        def counting(kinds, kept, original=original, name=node.scheduler.node):  # type: ignore[no-untyped-def]
            reads[name] += members_kind("scale") in kinds
            return original(kinds, kept)

        node.scheduler.store.read_synced = counting  # type: ignore[method-assign]
    return reads


def test_two_nodes_joining_at_once_are_both_in_every_view_though_one_version_is_left() -> None:
    """Two nodes join in the same step: the second one's version overwrites the first's,
    but each wrote a change note of its own, so no view misses either, and no node that
    stayed reads the members whole."""
    fleet = SimFleet(steady_schedule(10, 2, 0), 6, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    reads = whole_reads(fleet)
    fleet.nodes += [fleet.node("n6"), fleet.node("n7")]
    run(fleet, 0.1)
    changes = fleet.store.read_notes([changes_kind("scale")])[changes_kind("scale")]
    assert sorted(json.loads(text)["node"] for text in changes.values()) == ["n6", "n7"]
    run(fleet, 6)
    assert views(fleet) == {names(8)}
    assert all(reads[f"n{i}"] == 0 for i in range(6)), reads


def previous_release_notes(fleet: SimFleet, node: str, *, join: bool) -> list[Note]:
    """What a node of the release before change notes posts: its member note, its
    ``alive`` note and, when it joins, a version with no change note."""
    template = fleet.nodes[0].scheduler.board.node_record(fleet.clock.ms)
    fields = {f: getattr(template, f) for f in template.__dataclass_fields__}
    member = member_of(NodeRecord(**(fields | {"node": node})), None)
    notes = [
        Note(members_kind("scale"), node, member.to_json(), REGISTRY_TTL_MS),
        Note(node_kind("scale", node), "alive", alive_json(member), REGISTRY_TTL_MS),
    ]
    if join:
        notes.append(Note(membership_kind("scale"), "version", '{"by": "x"}', REGISTRY_TTL_MS))
    return notes


def test_a_version_written_without_a_change_note_makes_every_node_read_the_members() -> None:
    """A node of the previous release joins: its version has no change note, so each node
    reads the members whole, and every view holds it."""
    fleet = SimFleet(steady_schedule(10, 2, 0), 4, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    reads = whole_reads(fleet)
    fleet.store.post(previous_release_notes(fleet, "prev", join=True))
    end, posted = fleet.clock.ms + 12_000, fleet.clock.ms
    while fleet.clock.ms < end:
        run(fleet, 0.1)
        if fleet.clock.ms - posted >= REGISTRY_EVERY_MS:
            fleet.store.post(previous_release_notes(fleet, "prev", join=False))
            posted = fleet.clock.ms
    assert views(fleet) == {(*names(4), "prev")}
    assert sorted(reads.values()) == [1, 1, 1, 1], reads


def test_a_node_paused_longer_than_the_changes_live_reads_the_members_whole() -> None:
    """n3 is paused while n4 joins and the change note of its join runs out (the others
    drop n3 meanwhile): at its next read n3 cannot trust the changes, reads the members
    whole and has n4 in its view; it comes back into the others' views by a change."""
    fleet = SimFleet(steady_schedule(10, 2, 0), 4, preferred=True)
    run(fleet, WARM_UP_MS / 1_000)
    fleet.nodes[3].frozen = True
    fleet.nodes.append(fleet.node("n4"))
    run(fleet, CHANGES_TTL_MS / 1_000 + 1)
    changes = fleet.store.read_notes([changes_kind("scale")])[changes_kind("scale")]
    assert "n4" not in {json.loads(text)["node"] for text in changes.values()}
    reads = whole_reads(fleet)
    fleet.nodes[3].frozen = False
    run(fleet, 8)
    assert reads["n3"] == 1, reads
    assert sum(reads.values()) == 1, reads
    assert views(fleet) == {names(5)}
