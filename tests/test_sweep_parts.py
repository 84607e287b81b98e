"""A big schedule's missed-firing sweep reads it in parts, every entry in turn
(:func:`beatless.fleet._missed.sweep_views`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stores import ManualClock

from beatless import Entry, Every, Schedule
from beatless.fleet._missed import SWEEP_ENTRIES, sweep_part, sweep_views
from beatless.node.scheduler import Scheduler
from beatless.stores import MemoryStore


def schedule_of(plain: int, fanned: int = 0) -> Schedule:
    entries = [Entry(name=f"e{i:05d}", task="t", trigger=Every(60)) for i in range(plain)]
    entries += [
        Entry(name=f"f{i:05d}", task="t", trigger=Every(60), tenants=["a", "b"])
        for i in range(fanned)
    ]
    return Schedule(entries, namespace="parts")


def test_the_parts_of_a_big_schedule_read_every_entry_once_and_no_fan_out() -> None:
    schedule = schedule_of(2 * SWEEP_ENTRIES + 500, fanned=3)
    seen = Counter(view.name for part in range(3) for view in sweep_views(schedule, part))
    assert set(seen) == {f"e{i:05d}" for i in range(2 * SWEEP_ENTRIES + 500)}
    assert set(seen.values()) == {1}
    assert [len(sweep_views(schedule, part)) for part in range(3)] == [1_000, 1_000, 500]
    # Taken round: part 3 is part 0 again.
    assert sweep_views(schedule, 3) == sweep_views(schedule, 0)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3 * SWEEP_ENTRIES), st.integers(0, 10**12))
def test_any_run_of_sweeps_as_long_as_the_parts_reads_every_entry(size: int, start: int) -> None:
    schedule = schedule_of(size)
    parts = -(-size // SWEEP_ENTRIES)
    read = {
        view.name for part in range(start, start + parts) for view in sweep_views(schedule, part)
    }
    assert len(read) == size


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 400),
    st.integers(1_000, 120_000),
    st.integers(0, 10**12),
    st.randoms(use_true_random=False),
)
def test_the_fleet_reads_every_part_within_the_parts_over_the_nodes_plus_one_periods(
    nodes: int, parts: int, every: int, start: int, rng: Any
) -> None:
    """Each node sweeps at the start of each of its periods, placed on the clock by a phase
    of its own (any: drawn here): in any window of ``⌈parts / nodes⌉ + 1`` periods the
    fleet's sweeps read every part."""
    names = {f"node-{i}" for i in range(nodes)}
    window = (-(-parts // nodes) + 1) * every
    read = set()
    for name in names:
        phase = rng.randrange(10**9)
        # The node's sweeps in the window: at each start of a period of its own.
        first = -(-(start + phase % every) // every)
        at = first * every - phase % every
        while at < start + window:
            read.add(sweep_part(at, every, phase, name, names) % parts)
            at += every
    assert read == set(range(parts))


def test_a_node_alone_or_before_it_read_the_members_reads_the_next_part_each_period() -> None:
    assert [sweep_part(t * 30_000, 30_000, 7, "a", set()) for t in range(3)] == [0, 1, 2]
    assert sweep_part(30_000, 30_000, 7, "a", {"a"}) == 1


def test_ten_nodes_of_a_fleet_read_every_part_within_three_of_their_periods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten real nodes, each sweeping every 100 s, on a schedule of 20 parts (parts of two
    entries, for the test): every window of three periods (300 s, and the second of a
    sync) reads all 20 parts, where parts placed by each node's name alone leave some
    unread."""
    from beatless.fleet import _missed

    monkeypatch.setattr(_missed, "SWEEP_ENTRIES", 2)
    plan = Schedule(
        [Entry(name=f"e{i:02d}", task="t", trigger=Every(3_600)) for i in range(40)],
        namespace="sweep-parts",
    )
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    nodes = [
        Scheduler(plan, store=store, clock=clock, node=f"n{i}", enqueue=lambda f: None)
        for i in range(10)
    ]
    start = clock.now_ms()
    swept = sweeps_of(plan, nodes, clock, 700, monkeypatch)

    assert {n.board.sweep_every_ms() for n in nodes} == {100_000}
    assert_every_part_read(swept, start + 100_000, start + 700_000, 301_000)


def test_nodes_of_two_schedules_in_one_namespace_each_sweep_theirs_at_their_own_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twelve real nodes in one namespace, four running one schedule and eight another (a
    rolling deploy half done): each group sweeps at the pace of a fleet of its own size,
    the four every 40 s and the eight every 80 s, not every 120 s as twelve would, and the
    four read all 20 parts of theirs in every window of six of their periods (241 s). At
    the pace of twelve they would need 721 s."""
    from beatless.fleet import _missed

    monkeypatch.setattr(_missed, "SWEEP_ENTRIES", 2)
    old = Schedule(
        [Entry(name=f"e{i:02d}", task="t", trigger=Every(3_600)) for i in range(40)],
        namespace="sweep-deploy",
    )
    new = Schedule(
        [Entry(name=f"e{i:02d}", task="t", trigger=Every(1_800)) for i in range(40)],
        namespace="sweep-deploy",
    )
    assert old.fingerprint != new.fingerprint
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    nodes = [
        Scheduler(
            new if i < 4 else old,
            store=store,
            clock=clock,
            node=f"n{i:02d}",
            enqueue=lambda f: None,
        )
        for i in range(12)
    ]
    start = clock.now_ms()
    swept = sweeps_of(new, nodes, clock, 600, monkeypatch)

    assert [n.board.sweep_every_ms() for n in nodes] == [40_000] * 4 + [80_000] * 8
    assert_every_part_read(swept, start + 60_000, start + 600_000, 241_000)


def sweeps_of(
    schedule: Schedule,
    nodes: list[Scheduler],
    clock: ManualClock,
    seconds: int,
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[int, int]]:
    """Run ``nodes`` for ``seconds`` of the clock, each a wake and a sync a second; the
    sweeps of ``schedule`` they made, as (when, part of 20)."""
    from beatless.node import _board

    swept: list[tuple[int, int]] = []
    sweep = _board.sweep_missed

    def recorded(store: Any, plan: Schedule, node: str, now: int, *a: Any, **k: Any) -> Any:
        if plan is schedule:
            swept.append((now, k["part"] % 20))
        return sweep(store, plan, node, now, *a, **k)

    monkeypatch.setattr(_board, "sweep_missed", recorded)
    for _ in range(seconds):
        for node in nodes:
            node.tick()
            node.board.sync()
        clock.advance(1_000)
    return swept


def assert_every_part_read(swept: list[tuple[int, int]], begin: int, end: int, window: int) -> None:
    """Every window of ``window`` ms starting from ``begin`` and ending by ``end`` (each
    10 s) holds a sweep of each of the 20 parts."""
    for first in range(begin, end - window, 10_000):
        read = {part for at, part in swept if first <= at < first + window}
        assert read == set(range(20)), (first, sorted(read))
