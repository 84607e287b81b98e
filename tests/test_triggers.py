"""Triggers: Every and Cron turn an instant into occurrences, purely."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import islice, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beatless.core.triggers import Cron, Every, Trigger
from beatless.errors import ConfigError, ScheduleError
from beatless.schedule.firing import from_datetime, iso

JAN_2026 = "2026-01-01T00:00:00+00:00"


def ms(text: str) -> int:
    return from_datetime(datetime.fromisoformat(text))


def take(trigger: Trigger, after: str, count: int = 3) -> list[str]:
    return [iso(m) for m in islice(trigger.after(ms(after)), count)]


def cron(expr: str, after: str = JAN_2026, count: int = 3, **kwargs: object) -> list[str]:
    return take(Cron(expr, "UTC", **kwargs), after, count)  # type: ignore[arg-type]


# --- Every ------------------------------------------------------------------------------


@settings(max_examples=200)
@given(
    interval_ms=st.integers(1, 10 * 86_400_000),
    early=st.integers(0, 2**42),
    later_by=st.integers(0, 50),
    fraction=st.floats(0, 1),
)
def test_every_nodes_started_at_different_instants_agree_on_every_slot(
    interval_ms: int, early: int, later_by: int, fraction: float
) -> None:
    trigger = Every(timedelta(milliseconds=interval_ms))
    late = early + later_by * interval_ms + int(fraction * interval_ms)
    from_early = [s for s in islice(trigger.after(early), later_by + 5) if s > late]
    from_late = list(islice(trigger.after(late), len(from_early)))
    assert from_early == from_late
    assert from_late[0] % interval_ms == 0  # anchored to the Unix epoch
    assert late < from_late[0] <= late + interval_ms


def test_every_30s_falls_on_epoch_aligned_slots() -> None:
    assert take(Every("30s"), "2026-03-01T12:00:10+00:00") == [
        "2026-03-01T12:00:30.000Z",
        "2026-03-01T12:01:00.000Z",
        "2026-03-01T12:01:30.000Z",
    ]


def test_every_is_strictly_after_an_instant_on_a_slot() -> None:
    assert take(Every(60), "2026-03-01T12:00:00+00:00", 1) == ["2026-03-01T12:01:00.000Z"]


def test_every_with_a_custom_anchor_counts_from_the_anchor() -> None:
    anchor = datetime(2026, 1, 1, 0, 0, 7, tzinfo=timezone(timedelta(hours=2)))
    trigger = Every("1h", anchor=anchor)
    assert take(trigger, "2026-02-01T10:30:00+00:00", 2) == [
        "2026-02-01T11:00:07.000Z",
        "2026-02-01T12:00:07.000Z",
    ]
    assert trigger.anchor == datetime(2025, 12, 31, 22, 0, 7, tzinfo=UTC)
    assert "from 2025-12-31T22:00:07+00:00" in trigger.describe()


def test_every_supports_sub_second_intervals() -> None:
    assert take(Every("250ms"), "2026-03-01T12:00:00.100+00:00") == [
        "2026-03-01T12:00:00.250Z",
        "2026-03-01T12:00:00.500Z",
        "2026-03-01T12:00:00.750Z",
    ]
    assert Every(0.25).min_gap_ms() == 250


@pytest.mark.parametrize("interval", [0, -5, "0s", timedelta(microseconds=500)])
def test_every_refuses_an_interval_under_one_millisecond(interval: object) -> None:
    with pytest.raises(ScheduleError, match="at least 1ms"):
        Every(interval)  # type: ignore[arg-type]


def test_every_refuses_a_naive_anchor() -> None:
    with pytest.raises(ConfigError, match="timezone-aware"):
        Every(60, anchor=datetime(2026, 1, 1))


def test_every_refuses_an_unreadable_interval_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="every"):
        Every("soon")


def test_every_describes_itself_in_short_form() -> None:
    assert Every(90).describe() == "every 1m30s"


# --- Cron: fields and aliases -----------------------------------------------------------


def test_cron_with_five_fields_fires_on_the_minute() -> None:
    assert cron("*/20 9 * * *") == [
        "2026-01-01T09:00:00.000Z",
        "2026-01-01T09:20:00.000Z",
        "2026-01-01T09:40:00.000Z",
    ]


def test_cron_with_six_fields_reads_seconds_first() -> None:
    assert cron("15,45 * * * * *") == [
        "2026-01-01T00:00:15.000Z",
        "2026-01-01T00:00:45.000Z",
        "2026-01-01T00:01:15.000Z",
    ]


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("@hourly", ["2026-01-01T01:00:00.000Z", "2026-01-01T02:00:00.000Z"]),
        ("@daily", ["2026-01-02T00:00:00.000Z", "2026-01-03T00:00:00.000Z"]),
        ("@midnight", ["2026-01-02T00:00:00.000Z", "2026-01-03T00:00:00.000Z"]),
        ("@weekly", ["2026-01-04T00:00:00.000Z", "2026-01-11T00:00:00.000Z"]),  # Sundays
        ("@monthly", ["2026-02-01T00:00:00.000Z", "2026-03-01T00:00:00.000Z"]),
        ("@yearly", ["2027-01-01T00:00:00.000Z", "2028-01-01T00:00:00.000Z"]),
        ("@annually", ["2027-01-01T00:00:00.000Z", "2028-01-01T00:00:00.000Z"]),
        ("@HOURLY", ["2026-01-01T01:00:00.000Z", "2026-01-01T02:00:00.000Z"]),
    ],
)
def test_cron_aliases_expand_to_their_expressions(alias: str, expected: list[str]) -> None:
    assert cron(alias, count=2) == expected


def test_cron_refuses_reboot_which_has_no_occurrences() -> None:
    with pytest.raises(ScheduleError, match="@reboot"):
        Cron("@reboot")


def test_cron_last_day_of_month_follows_month_lengths() -> None:
    assert cron("0 0 L * *") == [
        "2026-01-31T00:00:00.000Z",
        "2026-02-28T00:00:00.000Z",
        "2026-03-31T00:00:00.000Z",
    ]


def test_cron_last_weekday_of_month_avoids_weekends() -> None:
    # 31 Jan 2026 is a Saturday, 28 Feb a Saturday: the Fridays before.
    assert cron("0 0 LW * *") == [
        "2026-01-30T00:00:00.000Z",
        "2026-02-27T00:00:00.000Z",
        "2026-03-31T00:00:00.000Z",
    ]


def test_cron_nearest_weekday_to_the_first_on_a_saturday_is_monday_the_third() -> None:
    # 1 Aug 2026 is a Saturday: Friday 31 July would leave the month.
    assert cron("0 0 1W * *", "2026-07-15T00:00:00+00:00") == [
        "2026-08-03T00:00:00.000Z",
        "2026-09-01T00:00:00.000Z",
        "2026-10-01T00:00:00.000Z",
    ]


def test_cron_nearest_weekday_on_a_sunday_is_the_monday_after() -> None:
    assert cron("0 0 15W * *", "2026-02-01T00:00:00+00:00", 1) == ["2026-02-16T00:00:00.000Z"]


def test_cron_nearest_weekday_to_a_last_day_on_a_sunday_is_the_friday_before() -> None:
    # 31 May 2026 is a Sunday: Monday 1 June would leave the month.
    assert cron("0 0 31W * *", "2026-05-01T00:00:00+00:00", 1) == ["2026-05-29T00:00:00.000Z"]


def test_cron_31w_does_not_fire_in_a_30_day_month() -> None:
    assert cron("0 0 31W * *", "2026-03-31T00:00:00+00:00", 2) == [
        "2026-05-29T00:00:00.000Z",  # nothing in April
        "2026-07-31T00:00:00.000Z",  # nothing in June
    ]


def test_cron_nearest_weekday_combines_with_other_days_of_month() -> None:
    assert cron("0 0 L,15W * *", count=4) == [
        "2026-01-15T00:00:00.000Z",
        "2026-01-31T00:00:00.000Z",
        "2026-02-16T00:00:00.000Z",
        "2026-02-28T00:00:00.000Z",
    ]


def test_cron_nth_weekday_of_month() -> None:
    assert cron("0 0 * * 5#3") == [  # third Friday
        "2026-01-16T00:00:00.000Z",
        "2026-02-20T00:00:00.000Z",
        "2026-03-20T00:00:00.000Z",
    ]


def test_cron_last_weekday_of_a_kind_in_month() -> None:
    assert cron("0 0 * * 5L", count=2) == ["2026-01-30T00:00:00.000Z", "2026-02-27T00:00:00.000Z"]


def test_cron_day_of_month_or_day_of_week_as_debian_cron_does() -> None:
    # 13th OR Friday: Fri 2, Fri 9, Tue 13, Fri 16.
    assert cron("0 0 13 * 5", count=4) == [
        "2026-01-02T00:00:00.000Z",
        "2026-01-09T00:00:00.000Z",
        "2026-01-13T00:00:00.000Z",
        "2026-01-16T00:00:00.000Z",
    ]


def test_cron_day_and_requires_both_as_celery_crontab_does() -> None:
    # Friday the 13th in 2026: February, March, November.
    trigger = Cron("0 0 13 * 5", "UTC", day_and=True)
    assert take(trigger, JAN_2026) == [
        "2026-02-13T00:00:00.000Z",
        "2026-03-13T00:00:00.000Z",
        "2026-11-13T00:00:00.000Z",
    ]
    assert "AND" in trigger.describe()


def test_cron_star_in_day_of_week_means_every_listed_day_of_month() -> None:
    assert cron("0 0 1,15 * *", count=2) == [
        "2026-01-15T00:00:00.000Z",
        "2026-02-01T00:00:00.000Z",
    ]


# --- Cron: occurrences ------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    expr=st.sampled_from(
        ["*/7 * * * *", "0 */3 * * *", "30 2 * * *", "*/20 * * * * *", "0 0 L * *", "@hourly"]
    ),
    tz=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    instant=st.integers(ms("2025-01-01T00:00:00+00:00"), ms("2028-01-01T00:00:00+00:00")),
)
def test_cron_occurrences_are_strictly_after_ascending_millisecond_ints(
    expr: str, tz: str, instant: int
) -> None:
    got = list(islice(Cron(expr, tz).after(instant), 20))
    assert all(type(o) is int for o in got)
    assert got[0] > instant
    assert all(a < b for a, b in pairwise(got))


def test_cron_after_an_instant_inside_a_second_skips_that_second() -> None:
    assert cron("* * * * * *", "2026-01-01T00:00:00.999+00:00", 1) == ["2026-01-01T00:00:01.000Z"]


def test_cron_is_the_same_value_after_whitespace_is_normalised() -> None:
    assert Cron("0  2 *\t* *", "UTC") == Cron("0 2 * * *", "UTC")
    assert hash(Cron("0  2 * * *", "UTC")) == hash(Cron("0 2 * * *", "UTC"))


def test_cron_without_a_zone_binds_to_the_schedule_zone() -> None:
    bound = Cron("0 2 * * *").bind("Europe/Berlin")
    assert bound.tz == "Europe/Berlin"
    assert Cron("0 2 * * *", "UTC").bind("Europe/Berlin").tz == "UTC"


# --- Cron: errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "day_and"),
    [("0 0 30 2 *", None), ("0 0 31 4,6 *", True), ("0 0 31W 4 *", None)],
)
def test_cron_that_never_matches_is_refused_at_construction(
    expr: str, day_and: bool | None
) -> None:
    with pytest.raises(ScheduleError, match=expr):
        Cron(expr, "UTC", day_and=day_and)


@pytest.mark.parametrize(
    ("expr", "wording"),
    [
        ("61 * * * *", "bad minute"),
        ("* 24 * * *", "bad hour"),
        ("* * 32 * *", "bad day-of-month"),
        ("0 0 32W * *", "bad day-of-month"),
        ("* * * 13 *", "bad month"),
        ("* * * * 8", "bad day-of-week"),
        ("60 * * * * *", "bad second"),
        ("*/0 * * * *", "bad minute"),
        ("5-1 * * * *", "bad minute"),
        ("* * *", "expected 5 fields"),
    ],
)
def test_cron_bad_expression_names_the_field_as_debian_cron_does(expr: str, wording: str) -> None:
    with pytest.raises(ScheduleError, match=wording):
        Cron(expr, "UTC")


def test_cron_unknown_time_zone_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        Cron("0 2 * * *", "Mars/Olympus")
