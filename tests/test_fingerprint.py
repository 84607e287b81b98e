"""The schedule fingerprint: equal for the same schedule, different for any change a node
would act on differently."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beatless import Entry, Schedule
from beatless.core.triggers import Cron, Every, tzdata_version


def entries() -> list[Entry]:
    return [
        Entry(
            name="report", task="t.report", trigger=Cron("0 2 * * *"), jitter="2m", max_late="5m"
        ),
        Entry(name="beat", task="t.beat", trigger=Every(30), tenants=["a", "b"]),
    ]


def test_the_same_schedule_has_the_same_fingerprint_whatever_the_entry_order() -> None:
    one = Schedule(entries(), namespace="shop")
    other = Schedule(list(reversed(entries())), namespace="shop")
    assert re.fullmatch(r"[0-9a-f]{16}", one.fingerprint)
    assert one.fingerprint == other.fingerprint


@pytest.mark.parametrize(
    "change",
    [
        {"jitter": "3m"},
        {"max_late": "6m"},
        {"task": "t.other"},
        {"trigger": Cron("0 3 * * *")},
        {"trigger": Cron("0 2 * * *", tz="Europe/Berlin")},
        {"tenants": ["x"]},
        {"catch_up": "all"},
        {"overlap": "skip"},
        {"run_lease": "1m"},
        {"heartbeat": "10s"},
        {"once_only": False},
        {"args": ("x",)},
        {"kwargs": {"format": "pdf"}},
        {"options": {"queue": "reports"}},
    ],
    ids=lambda change: next(iter(change)),
)
def test_any_change_a_node_acts_on_changes_the_fingerprint(change: dict[str, object]) -> None:
    base = entries()
    changed = [base[0].replace(**change), base[1]]
    assert Schedule(changed).fingerprint != Schedule(base).fingerprint


def test_schedules_differing_only_in_arguments_have_different_fingerprints() -> None:
    def schedule(*args: object, **kwargs: object) -> Schedule:
        return Schedule(
            [Entry(name="e", task="t", trigger=Every(30), args=args, kwargs=kwargs)],
            namespace="shop",
        )

    assert schedule(1).fingerprint != schedule(2).fingerprint
    assert schedule(1).fingerprint != schedule("1").fingerprint
    assert schedule(size=1).fingerprint != schedule(size=2).fingerprint
    assert schedule([1, 2]).fingerprint != schedule([2, 1]).fingerprint


def test_arguments_written_alike_have_the_same_fingerprint_on_every_node() -> None:
    """Key order, a tuple for a list, and an object's memory address do not count: what
    the task receives does."""

    class Marker:
        pass

    def schedule(args: object, kwargs: dict[str, object], options: dict[str, object]) -> Schedule:
        entry = Entry(
            name="e", task="t", trigger=Every(30), args=args, kwargs=kwargs, options=options
        )
        return Schedule([entry])

    one = schedule([1, (2, 3)], {"a": 1, "b": {"x": 1, "y": 2}}, {"marker": Marker()})
    two = schedule((1, [2, 3]), {"b": {"y": 2, "x": 1}, "a": 1}, {"marker": Marker()})
    assert one.fingerprint == two.fingerprint
    sets = schedule([], {"s": {"b", "a", "c"}}, {}), schedule([], {"s": {"c", "a", "b"}}, {})
    assert sets[0].fingerprint == sets[1].fingerprint


def test_namespace_and_zone_of_unzoned_crons_change_the_fingerprint() -> None:
    base = Schedule(entries()).fingerprint
    assert Schedule(entries(), namespace="other").fingerprint != base
    assert Schedule(entries(), timezone="Asia/Tokyo").fingerprint != base


@given(st.lists(st.integers(min_value=1, max_value=10**6), min_size=1, max_size=8, unique=True))
def test_fingerprints_of_different_intervals_differ(intervals: list[int]) -> None:
    def schedule(seconds: list[int]) -> Schedule:
        return Schedule(
            [Entry(name=f"e{i}", task="t", trigger=Every(s)) for i, s in enumerate(seconds)]
        )

    base = schedule(intervals)
    bumped = schedule([*intervals[:-1], intervals[-1] + 1])
    assert base.fingerprint == schedule(intervals).fingerprint
    assert base.fingerprint != bumped.fingerprint


def test_tzdata_version_names_the_database_zoneinfo_reads() -> None:
    version = tzdata_version()
    assert version == "unknown" or re.fullmatch(r"\d{4}[a-z]+", version)
