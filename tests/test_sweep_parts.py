"""A big schedule's missed-firing sweep reads it in parts, every entry in turn
(:func:`beatless.fleet._missed.sweep_views`)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from beatless import Entry, Every, Schedule
from beatless.fleet._missed import SWEEP_ENTRIES, sweep_views


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
