"""The cron evaluator, cross-checked against cronsim and against a brute-force walk.

Two independent references:

- **cronsim**, through its public API only (``CronSim(expr, start)`` iterated), where it
  defines the same semantics as beatless: every fixed-time expression, and real-time
  expressions in zones whose offsets change by whole hours away from midnight (cronsim
  steps real time by the hour, which lands half an hour off across Lord Howe's shift).
- **a brute-force walk** over every UTC minute of a window, reading the local wall time
  with zoneinfo and checking it against the wall times cronsim yields when evaluated in
  UTC (where it has no DST handling at all). It applies the documented rule directly:
  real time runs every instant whose wall time matches; a fixed-time job runs each
  matching wall time at its first pass, a skipped one at the first whole minute after.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from beatless.core._cron import CronError, CronPattern
from beatless.core._time import from_datetime, iso, next_change_s, offset_s, to_datetime
from beatless.core.triggers import Cron
from beatless.errors import ScheduleError

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"]
TRANSITIONS = [
    from_datetime(datetime.fromisoformat(text))
    for text in [
        "2026-03-08T07:00:00+00:00",  # New York springs forward
        "2026-03-29T01:00:00+00:00",  # Berlin springs forward
        "2026-04-04T15:00:00+00:00",  # Lord Howe falls back 30 min
        "2026-10-03T15:30:00+00:00",  # Lord Howe springs forward 30 min
        "2026-10-25T01:00:00+00:00",  # Berlin falls back
        "2026-11-01T06:00:00+00:00",  # New York falls back
        "2026-06-15T00:00:00+00:00",  # nothing changes (Kathmandu is +05:45 all year)
    ]
]


# --- expressions ---------------------------------------------------------------------


def _values(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    step = st.integers(2, max(2, (high - low) // 2))
    return st.one_of(
        value.map(str),
        st.lists(value, min_size=2, max_size=4, unique=True).map(
            lambda vs: ",".join(map(str, sorted(vs)))
        ),
        st.tuples(value, value, step).map(lambda t: f"{min(t[:2])}-{max(t[:2])}/{t[2]}"),
        st.tuples(value, value).map(lambda t: f"{min(t)}-{max(t)}"),
        st.tuples(value, step).map(lambda t: f"{t[0]}/{t[1]}"),
        step.map(lambda s: f"*/{s}"),
    )


SECONDS = st.one_of(st.sampled_from(["0", "30", "*/20", "10-50/20", "*/7"]), _values(0, 59))
MINUTES = st.one_of(st.sampled_from(["*", "0", "30", "*/15", "0-59"]), _values(0, 59))
HOURS = st.one_of(
    st.sampled_from(["*", "1", "2", "3", "1,2", "2,3", "1-3", "0-3", "*/2", "22-23"]),
    _values(0, 23),
)
DAYS = st.one_of(st.sampled_from(["*", "*", "L", "LW", "*/3", "1-7", "29-31"]), _values(1, 31))
MONTHS = st.sampled_from(["*", "*", "*", "3,4", "10,11", "*/2", "JAN-APR", "oct-dec", "4"])
WEEKDAYS = st.sampled_from(
    ["*", "*", "*", "0", "7", "SUN", "1-5", "mon-fri", "5L", "0#1", "7#2", "6#5", "1,3", "*/2"]
)


@st.composite
def expressions(draw: st.DrawFn) -> str:
    """Expressions in the grammar cronsim shares with beatless (no ``nW``)."""
    fields = [draw(MINUTES), draw(HOURS), draw(DAYS), draw(MONTHS), draw(WEEKDAYS)]
    if draw(st.booleans()):
        fields.insert(0, draw(SECONDS))
    return " ".join(fields)


def _cron(expr: str, tz: str) -> Cron:
    try:
        return Cron(expr, tz)
    except ScheduleError:
        assume(False)
        raise


def _ours(cron: Cron, start: int, end: int, limit: int) -> list[int]:
    """Our occurrences in ``(start, end]``, at most ``limit`` of them."""
    out = []
    for occurrence in islice(cron.after(start), limit):
        if occurrence > end:
            break
        out.append(occurrence)
    return out


def _is_fixed_time(expr: str) -> bool:
    fields = expr.split()
    return len(fields) == 5 and not fields[0].startswith("*") and not fields[1].startswith("*")


# --- cronsim, public API -------------------------------------------------------------


def cronsim_occurrences(expr: str, tz: str, start: int, end: int) -> Iterator[int]:
    """cronsim's occurrences in ``(start, end]``, each once (a skipped fixed time runs once)."""
    last = start
    for moment in CronSim(expr, to_datetime(start).astimezone(ZoneInfo(tz))):
        occurrence = from_datetime(moment)
        if occurrence > end:
            return
        if occurrence > last:
            last = occurrence
            yield occurrence


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(
    expr=expressions(),
    tz=st.sampled_from(ZONES),
    transition=st.sampled_from(TRANSITIONS),
    shift=st.one_of(st.integers(-2 * DAY_MS, DAY_MS), st.integers(-2 * HOUR_MS, 2 * HOUR_MS)),
)
def test_occurrences_agree_with_cronsim_where_it_shares_the_rule(
    expr: str, tz: str, transition: int, shift: int
) -> None:
    assume(_is_fixed_time(expr) or tz != "Australia/Lord_Howe")
    cron = _cron(expr, tz)
    start = transition + shift
    ours = _ours(cron, start, start + 3 * DAY_MS, 400)
    end = ours[-1] if len(ours) == 400 else start + 3 * DAY_MS
    assert list(map(iso, ours)) == list(map(iso, cronsim_occurrences(expr, tz, start, end)))


DAYS_ONLY = st.tuples(DAYS, MONTHS, WEEKDAYS).map(lambda t: f"0 0 {' '.join(t)}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    expr=DAYS_ONLY,
    start=st.integers(
        from_datetime(datetime(2000, 1, 1, tzinfo=UTC)),
        from_datetime(datetime(2040, 1, 1, tzinfo=UTC)),
    ),
)
def test_matching_days_agree_with_cronsim_over_years(expr: str, start: int) -> None:
    cron = _cron(expr, "UTC")
    ours = list(islice(cron.after(start), 60))
    theirs = islice(CronSim(expr, to_datetime(start)), 60)
    assert list(map(iso, ours)) == [iso(from_datetime(moment)) for moment in theirs]


# --- brute force ---------------------------------------------------------------------


def _seconds_of(expr: str) -> list[int]:
    """The seconds a 6-field expression runs at in a minute (0 for five fields)."""
    fields = expr.split()
    if len(fields) == 5:
        return [0]
    start = datetime(2000, 1, 1, tzinfo=UTC) - timedelta(seconds=1)
    found = []
    for moment in CronSim(f"{fields[0]} * * * * *", start):
        if moment.minute:
            return found
        found.append(moment.second)
    return found


def _wall_minutes(expr: str, lo: datetime, hi: datetime) -> set[datetime]:
    """The matching wall minutes in ``[lo, hi]`` (naive), from cronsim evaluated in UTC."""
    five = " ".join(expr.split()[-5:])
    walls = set()
    for moment in CronSim(five, lo.replace(tzinfo=UTC) - timedelta(minutes=1)):
        if moment.replace(tzinfo=None) > hi:
            return walls
        walls.add(moment.replace(tzinfo=None))
    return walls


def brute_force(expr: str, tz: str, start: int, end: int) -> list[int]:
    """The occurrences in ``(start, end]`` by the documented rule, minute by minute."""
    zone = ZoneInfo(tz)
    first, last = to_datetime(start - start % MINUTE_MS), to_datetime(end)
    walls = _wall_minutes(expr, (first - timedelta(days=1)).replace(tzinfo=None),
                          (last + timedelta(days=1)).replace(tzinfo=None))  # fmt: skip
    if _is_fixed_time(expr):
        found = {from_datetime(_first_pass(wall, zone)) for wall in walls}
    else:
        found = set()
        moment = first
        while moment <= last:
            if moment.astimezone(zone).replace(tzinfo=None) in walls:
                found.update(from_datetime(moment) + s * 1000 for s in _seconds_of(expr))
            moment += timedelta(minutes=1)
    return sorted(o for o in found if start < o <= end)


def _first_pass(wall: datetime, zone: ZoneInfo) -> datetime:
    while wall.replace(tzinfo=zone).astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
        wall += timedelta(minutes=1)
    return wall.replace(tzinfo=zone, fold=0)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(
    expr=expressions(),
    tz=st.sampled_from(ZONES),
    transition=st.sampled_from(TRANSITIONS),
    shift=st.one_of(st.integers(-DAY_MS, 2 * HOUR_MS), st.integers(-2 * HOUR_MS, 2 * HOUR_MS)),
)
def test_occurrences_equal_a_minute_by_minute_walk_of_the_documented_rule(
    expr: str, tz: str, transition: int, shift: int
) -> None:
    cron = _cron(expr, tz)
    start = transition + shift
    end = start + DAY_MS
    ours = _ours(cron, start, end, 200_000)
    assert list(map(iso, ours)) == list(map(iso, brute_force(expr, tz, start, end)))


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("America/Havana", "2001-04-01"),  # 00:00 → 01:00: midnight is skipped
        ("America/Santiago", "2017-08-13"),  # 00:00 → 01:00
        ("America/St_Johns", "2003-10-26"),  # 00:01 NDT → 23:01 NST the day before
        ("Pacific/Apia", "2011-12-30"),  # the whole day is skipped
        ("Africa/Cairo", "2030-04-26"),  # 00:00 → 01:00 on the last Friday of April
    ],
)
@pytest.mark.parametrize(
    "expr",
    [
        "*/15 0 * * *",
        "0 */2 * * *",
        "5 */2 * * *",
        "0-59/10 * * * 0",
        "30 5 0,1,2 L * 0",
        "0 0 * * *",
        "5 0 * * *",
        "0 12 * * *",
    ],
)
def test_changes_at_midnight_follow_the_rule_as_the_brute_force_does(
    tz: str, day: str, expr: str
) -> None:
    start = from_datetime(datetime.fromisoformat(f"{day}T00:00:00+00:00")) - DAY_MS
    end = start + 3 * DAY_MS
    ours = _ours(Cron(expr, tz), start, end, 10_000)
    assert list(map(iso, ours)) == list(map(iso, brute_force(expr, tz, start, end)))


def test_offset_changes_are_found_to_the_second() -> None:
    zone = ZoneInfo("Australia/Lord_Howe")
    spring = from_datetime(datetime(2026, 10, 3, 15, 30, tzinfo=UTC)) // 1000
    autumn = from_datetime(datetime(2026, 4, 4, 15, 0, tzinfo=UTC)) // 1000
    assert next_change_s(zone, spring - 200 * 86_400, spring + 10) == autumn
    assert next_change_s(zone, spring - 100 * 86_400, spring + 10) == spring
    assert offset_s(zone, spring - 1) == 37_800
    assert offset_s(zone, spring) == 39_600
    assert next_change_s(ZoneInfo("Asia/Kathmandu"), spring, spring + 400 * 86_400) is None


def test_cron_repr_and_equality_ignore_the_parsed_pattern() -> None:
    assert repr(Cron("0 2 * * *", "UTC")) == "Cron(expr='0 2 * * *', tz='UTC', day_and=None)"
    assert Cron("@daily", "UTC") != Cron("0 0 * * *", "UTC")  # the expression as written


# --- parsing -------------------------------------------------------------------------


def walls(expr: str, day_and: bool | None = None, count: int = 4) -> list[str]:
    """The first matching wall times from 2026-01-01 00:00 on, as ISO strings."""
    after = from_datetime(datetime(2026, 1, 1, tzinfo=UTC)) // 1000 - 1
    moments = islice(CronPattern.parse(expr, day_and).walls(after), count)
    return [iso(m * 1000)[:19] for m in moments]


def test_names_and_seven_for_sunday_read_as_debian_cron_reads_them() -> None:
    sundays = ["2026-01-04T00:00:00", "2026-01-11T00:00:00"]
    for weekday in ("0", "7", "SUN", "sun", "Sun"):
        assert walls(f"0 0 * * {weekday}", count=2) == sundays
    assert walls("0 0 1 jan-mar *", count=4)[-1] == "2027-01-01T00:00:00"


def test_a_step_after_a_single_value_runs_from_it_to_the_end_of_the_range() -> None:
    assert walls("50/4 0 * * *", count=4) == [
        "2026-01-01T00:50:00",
        "2026-01-01T00:54:00",
        "2026-01-01T00:58:00",
        "2026-01-02T00:50:00",
    ]


def test_a_step_over_a_range_of_one_value_is_that_value_alone() -> None:
    # A range stops at its own end, even when it starts there: 0-0/2 is minute 0 only.
    assert walls("0-0/2 * * * *", count=2) == ["2026-01-01T00:00:00", "2026-01-01T01:00:00"]
    assert walls("7-7/5 3 * * *", count=2) == ["2026-01-01T03:07:00", "2026-01-02T03:07:00"]


def test_a_step_over_every_weekday_counts_sunday_once() -> None:
    # */2 over 0-7 is 0,2,4,6: Sunday, Tuesday, Thursday, Saturday.
    assert walls("0 0 * * */2", count=4) == [
        "2026-01-01T00:00:00",  # Thursday
        "2026-01-03T00:00:00",
        "2026-01-04T00:00:00",
        "2026-01-06T00:00:00",
    ]


def test_the_fifth_weekday_of_a_month_runs_only_in_months_that_have_one() -> None:
    # Fifth Saturdays of 2026: 31 January, 30 May, 29 August, 31 October.
    assert walls("0 0 * * 6#5") == [
        "2026-01-31T00:00:00",
        "2026-05-30T00:00:00",
        "2026-08-29T00:00:00",
        "2026-10-31T00:00:00",
    ]


def test_the_dst_rule_depends_on_how_minute_and_hour_are_written() -> None:
    assert not CronPattern.parse("30 2 * * *").real_time
    assert not CronPattern.parse("0-59 0-23 * * *").real_time  # no leading *
    assert not CronPattern.parse("@daily").real_time
    assert CronPattern.parse("*/15 2 * * *").real_time
    assert CronPattern.parse("0 */2 * * *").real_time
    assert CronPattern.parse("@hourly").real_time
    assert CronPattern.parse("0 30 2 * * *").real_time  # six fields


@pytest.mark.parametrize(
    ("expr", "day_and", "wording"),
    [
        ("0 0 30 2 *", None, "bad day-of-month"),  # Debian cron's check
        ("0 0 31 4,6 *", True, "bad day-of-month"),
        ("0 0 31W 4 *", None, "never matches a date"),
        ("0 0 30 2 1", True, "bad day-of-month"),
        ("0 0 28 2 1#5", True, "never matches a date"),  # the 28th is never a 5th Monday
        ("* * * * 5L#2", None, "bad day-of-week"),
        ("* * * * 8#1", None, "bad day-of-week"),
        ("* * * * 1#6", None, "bad day-of-week"),
        ("* * * * FRIL", None, "bad day-of-week"),
        ("* * L/2 * *", None, None),
        ("* * LW * 1", None, None),
        ("* * 1 * * * *", None, "expected 5 fields"),
        ("@every 5m", None, "unsupported alias @every"),
        ("* * ? * *", None, "bad day-of-month"),
        ("* * * FOO *", None, "bad month"),
        ("1-2-3 * * * *", None, "bad minute"),
        ("*/x * * * *", None, "bad minute"),
        ("-1 * * * *", None, "bad minute"),
    ],
)
def test_refusals_are_worded_as_debian_cron_words_them(
    expr: str, day_and: bool | None, wording: str | None
) -> None:
    if wording is None:
        CronPattern.parse(expr, day_and)
        return
    with pytest.raises(CronError, match=wording):
        CronPattern.parse(expr, day_and)


def test_a_date_that_comes_once_in_decades_is_accepted() -> None:
    # 29 February on a Monday: 2016, 2044, 2072.
    assert walls("0 0 29 2 1", day_and=True, count=2) == [
        "2044-02-29T00:00:00",
        "2072-02-29T00:00:00",
    ]


def test_explicit_or_of_day_fields_applies_even_with_a_star() -> None:
    # day_and=False: the 30th OR any weekday, so every day of February matches.
    assert walls("0 0 30,31 2 *", day_and=False, count=2) == [
        "2026-02-01T00:00:00",
        "2026-02-02T00:00:00",
    ]


def test_nearest_weekday_with_a_day_february_lacks_still_runs_in_february() -> None:
    assert walls("0 0 30,15W 2 *", count=2) == ["2026-02-16T00:00:00", "2027-02-15T00:00:00"]


def test_a_pattern_is_an_immutable_hashable_value() -> None:
    assert CronPattern.parse("0 2 * * *") == CronPattern.parse("0 2 * * *")
    assert hash(CronPattern.parse("@daily")) == hash(CronPattern.parse("0 0 * * *"))
    assert CronPattern.parse("0 0 13 * 5") != CronPattern.parse("0 0 13 * 5", day_and=True)
