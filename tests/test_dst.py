"""Cron across DST transitions: tables of UTC occurrences, with a reference timeline.

The rule (Debian cron's): a 5-field expression whose minute and hour fields do not start
with ``*`` runs once at the transition when its wall time is skipped, and once, at the
first pass, when its wall time is repeated. Other expressions (``*``, ``*/15`` in the
minute or hour field, and 6-field expressions) follow real time.

Reference timeline, 2026 (local wall time ← UTC):

Europe/Berlin, spring forward, Sun 29 March (02:00 CET → 03:00 CEST, 02:xx skipped)
    00:00Z = 01:00 CET    01:00Z = 03:00 CEST    02:00Z = 04:00 CEST
Europe/Berlin, fall back, Sun 25 October (03:00 CEST → 02:00 CET, 02:xx repeated)
    00:00Z = 02:00 CEST   01:00Z = 02:00 CET     02:00Z = 03:00 CET

America/New_York, spring forward, Sun 8 March (02:00 EST → 03:00 EDT, 02:xx skipped)
    06:00Z = 01:00 EST    07:00Z = 03:00 EDT     08:00Z = 04:00 EDT
America/New_York, fall back, Sun 1 November (02:00 EDT → 01:00 EST, 01:xx repeated)
    05:00Z = 01:00 EDT    06:00Z = 01:00 EST     07:00Z = 02:00 EST

Australia/Lord_Howe (+10:30 standard, +11:00 summer: a 30-minute shift)
fall back, Sun 5 April local (02:00 LHDT → 01:30 LHST, 01:30-01:59 repeated)
    4 Apr 14:00Z = 01:00 LHDT   14:30Z = 01:30 LHDT   15:00Z = 01:30 LHST   15:30Z = 02:00 LHST
spring forward, Sun 4 October local (02:00 LHST → 02:30 LHDT, 02:00-02:29 skipped)
    3 Oct 14:30Z = 01:00 LHST   15:00Z = 01:30 LHST   15:30Z = 02:30 LHDT   16:00Z = 03:00 LHDT

America/Havana, changes at midnight
spring forward, Sun 8 March (00:00 CST → 01:00 CDT, 00:xx skipped)
    7 Mar 05:00Z = 00:00 CST    8 Mar 04:59Z = 23:59 CST    05:00Z = 01:00 CDT
fall back, Sun 1 November (01:00 CDT → 00:00 CST, 00:xx repeated)
    1 Nov 04:00Z = 00:00 CDT    05:00Z = 00:00 CST    06:00Z = 01:00 CST

Asia/Kathmandu, +05:45 all year
    20:45Z = 02:30 the next day    00:15Z = 06:00
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

import pytest

from beatless.core.triggers import Cron
from beatless.schedule.firing import from_datetime, iso


def occurrences(expr: str, tz: str, after: str, count: int) -> list[str]:
    start = from_datetime(datetime.fromisoformat(after))
    return [iso(ms) for ms in islice(Cron(expr, tz).after(start), count)]


CASES = [
    # --- Europe/Berlin, spring forward ---------------------------------------------
    # 02:30 is skipped on the 29th: the fixed-time job runs once, at 03:00 CEST.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-27T23:00:00+00:00",
        ["2026-03-28T01:30:00.000Z", "2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"],
    ),
    # Every quarter hour in real time: 01:45 CET is followed by 03:00 CEST.
    (
        "*/15 * * * *",
        "Europe/Berlin",
        "2026-03-29T00:30:00+00:00",
        ["2026-03-29T00:45:00.000Z", "2026-03-29T01:00:00.000Z", "2026-03-29T01:15:00.000Z"],
    ),
    # 01:00 CET, then 03:00 CEST: one hour of real time apart.
    (
        "0 * * * *",
        "Europe/Berlin",
        "2026-03-28T23:30:00+00:00",
        ["2026-03-29T00:00:00.000Z", "2026-03-29T01:00:00.000Z", "2026-03-29T02:00:00.000Z"],
    ),
    # Six fields follow real time: 02:30:00 never happens on the 29th.
    (
        "0 30 2 * * *",
        "Europe/Berlin",
        "2026-03-27T23:00:00+00:00",
        ["2026-03-28T01:30:00.000Z", "2026-03-30T00:30:00.000Z"],
    ),
    # --- Europe/Berlin, fall back ----------------------------------------------------
    # 02:30 happens twice on the 25th: the fixed-time job runs once, at 02:30 CEST.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-23T23:00:00+00:00",
        ["2026-10-24T00:30:00.000Z", "2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"],
    ),
    # Real time: both passes of 02:xx, every 15 minutes without a hole or a repeat.
    (
        "*/15 * * * *",
        "Europe/Berlin",
        "2026-10-25T00:30:00+00:00",
        ["2026-10-25T00:45:00.000Z", "2026-10-25T01:00:00.000Z", "2026-10-25T01:15:00.000Z"],
    ),
    # 02:00 CEST, 02:00 CET, 03:00 CET: hourly in real time.
    (
        "0 * * * *",
        "Europe/Berlin",
        "2026-10-24T23:30:00+00:00",
        ["2026-10-25T00:00:00.000Z", "2026-10-25T01:00:00.000Z", "2026-10-25T02:00:00.000Z"],
    ),
    # From 02:10 CEST (first pass): 02:30 CEST is still to come.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-25T00:10:00+00:00",
        ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"],
    ),
    # From 02:10 CET (second pass): 02:30 ran at its first pass, so the next is tomorrow.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-25T01:10:00+00:00",
        ["2026-10-26T01:30:00.000Z", "2026-10-27T01:30:00.000Z"],
    ),
    # Six fields: 02:30:00 happens twice, so it runs twice.
    (
        "0 30 2 * * *",
        "Europe/Berlin",
        "2026-10-23T23:00:00+00:00",
        ["2026-10-24T00:30:00.000Z", "2026-10-25T00:30:00.000Z", "2026-10-25T01:30:00.000Z"],
    ),
    # --- America/New_York ----------------------------------------------------------
    # Spring: 02:30 EST skipped, runs once at 03:00 EDT.
    (
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T00:00:00+00:00",
        ["2026-03-07T07:30:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z"],
    ),
    (
        "*/15 * * * *",
        "America/New_York",
        "2026-03-08T06:30:00+00:00",
        ["2026-03-08T06:45:00.000Z", "2026-03-08T07:00:00.000Z", "2026-03-08T07:15:00.000Z"],
    ),
    # Fall: 01:30 repeated, runs once at 01:30 EDT.
    (
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T00:00:00+00:00",
        ["2026-10-31T05:30:00.000Z", "2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"],
    ),
    # From 01:10 EST (second pass): 01:30 ran at 01:30 EDT, so the next is tomorrow.
    (
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T06:10:00+00:00",
        ["2026-11-02T06:30:00.000Z"],
    ),
    # Hourly in real time: 01:00 EDT, 01:00 EST, 02:00 EST.
    (
        "0 * * * *",
        "America/New_York",
        "2026-11-01T04:30:00+00:00",
        ["2026-11-01T05:00:00.000Z", "2026-11-01T06:00:00.000Z", "2026-11-01T07:00:00.000Z"],
    ),
    (
        "0 30 1 * * *",
        "America/New_York",
        "2026-10-31T00:00:00+00:00",
        ["2026-10-31T05:30:00.000Z", "2026-11-01T05:30:00.000Z", "2026-11-01T06:30:00.000Z"],
    ),
    # --- Australia/Lord_Howe (30-minute shift) ------------------------------------------
    # Spring: 02:15 LHST skipped on 4 Oct, runs once at 02:30 LHDT (15:30Z).
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T00:00:00+00:00",
        ["2026-10-02T15:45:00.000Z", "2026-10-03T15:30:00.000Z", "2026-10-04T15:15:00.000Z"],
    ),
    # Real time: 01:45 LHST, then 02:30 LHDT, 02:45 LHDT.
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T15:00:00+00:00",
        ["2026-10-03T15:15:00.000Z", "2026-10-03T15:30:00.000Z", "2026-10-03T15:45:00.000Z"],
    ),
    # Whole wall hours: 01:00 LHST, (02:00 skipped), 03:00 LHDT: 90 minutes apart.
    (
        "0 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T14:00:00+00:00",
        ["2026-10-03T14:30:00.000Z", "2026-10-03T16:00:00.000Z", "2026-10-03T17:00:00.000Z"],
    ),
    # Fall: 01:45 repeated on 5 Apr, runs once at 01:45 LHDT (14:45Z).
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T00:00:00+00:00",
        ["2026-04-03T14:45:00.000Z", "2026-04-04T14:45:00.000Z", "2026-04-05T15:15:00.000Z"],
    ),
    # From 01:35 LHST (second pass): 01:45 ran at 01:45 LHDT, so the next is tomorrow.
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T15:05:00+00:00",
        ["2026-04-05T15:15:00.000Z"],
    ),
    # Real time: 01:45 LHDT, 01:30 LHST, 01:45 LHST, 02:00 LHST.
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T14:30:00+00:00",
        [
            "2026-04-04T14:45:00.000Z",
            "2026-04-04T15:00:00.000Z",
            "2026-04-04T15:15:00.000Z",
            "2026-04-04T15:30:00.000Z",
        ],
    ),
    # Whole wall hours: 01:00 LHDT, 02:00 LHST, 03:00 LHST (02:00 LHDT never shows).
    (
        "0 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T13:30:00+00:00",
        ["2026-04-04T14:00:00.000Z", "2026-04-04T15:30:00.000Z", "2026-04-04T16:30:00.000Z"],
    ),
    # Six fields: 01:45:00 happens twice on 5 Apr, so it runs twice.
    (
        "0 45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T00:00:00+00:00",
        ["2026-04-03T14:45:00.000Z", "2026-04-04T14:45:00.000Z", "2026-04-04T15:15:00.000Z"],
    ),
    # --- America/Havana (changes at midnight) --------------------------------------------
    # Midnight is skipped on 8 March: the fixed-time job runs once, at 01:00 CDT.
    (
        "0 0 * * *",
        "America/Havana",
        "2026-03-06T12:00:00+00:00",
        ["2026-03-07T05:00:00.000Z", "2026-03-08T05:00:00.000Z", "2026-03-09T04:00:00.000Z"],
    ),
    # Real time: no 00:xx on 8 March, so nothing that day.
    (
        "*/30 0 * * *",
        "America/Havana",
        "2026-03-06T12:00:00+00:00",
        [
            "2026-03-07T05:00:00.000Z",
            "2026-03-07T05:30:00.000Z",
            "2026-03-09T04:00:00.000Z",
            "2026-03-09T04:30:00.000Z",
        ],
    ),
    # 00:30 happens twice on 1 November: the fixed-time job runs once, at 00:30 CDT.
    (
        "30 0 * * *",
        "America/Havana",
        "2026-10-30T12:00:00+00:00",
        ["2026-10-31T04:30:00.000Z", "2026-11-01T04:30:00.000Z", "2026-11-02T05:30:00.000Z"],
    ),
    # Real time: both passes of 00:xx.
    (
        "*/30 0 * * *",
        "America/Havana",
        "2026-10-31T12:00:00+00:00",
        [
            "2026-11-01T04:00:00.000Z",
            "2026-11-01T04:30:00.000Z",
            "2026-11-01T05:00:00.000Z",
            "2026-11-01T05:30:00.000Z",
            "2026-11-02T05:00:00.000Z",
        ],
    ),
    # --- Asia/Kathmandu (a 45-minute offset, no DST) ------------------------------------
    (
        "30 2 * * *",
        "Asia/Kathmandu",
        "2026-03-28T00:00:00+00:00",
        ["2026-03-28T20:45:00.000Z", "2026-03-29T20:45:00.000Z"],
    ),
    (
        "*/20 * * * *",
        "Asia/Kathmandu",
        "2026-06-15T00:00:00+00:00",
        ["2026-06-15T00:15:00.000Z", "2026-06-15T00:35:00.000Z", "2026-06-15T00:55:00.000Z"],
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), CASES)
def test_occurrences_across_dst_follow_the_documented_rule(
    expr: str, tz: str, after: str, expected: list[str]
) -> None:
    assert occurrences(expr, tz, after, len(expected)) == expected


# --- An independent evaluator, written with zoneinfo only ------------------------------


def real_time(
    tz: str, start: datetime, end: datetime, minutes: set[int], hours: set[int]
) -> Iterator[datetime]:
    """Every UTC minute in ``[start, end)`` whose local wall time matches."""
    zone = ZoneInfo(tz)
    moment = start
    while moment < end:
        local = moment.astimezone(zone)
        if local.minute in minutes and local.hour in hours:
            yield moment
        moment += timedelta(minutes=1)


def fixed_time(tz: str, days: Iterable[date], hour: int, minute: int) -> list[datetime]:
    """One run per local day: a skipped wall time runs at the transition, a repeated one
    at its first pass (fold=0)."""
    zone = ZoneInfo(tz)
    runs = []
    for day in days:
        wall = datetime(day.year, day.month, day.day, hour, minute)
        while _is_skipped(wall, zone):
            wall += timedelta(minutes=1)
        runs.append(wall.replace(tzinfo=zone, fold=0).astimezone(UTC))
    return runs


def _is_skipped(wall: datetime, zone: ZoneInfo) -> bool:
    aware = wall.replace(tzinfo=zone)
    return aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall


def _isos(moments: Iterable[datetime]) -> list[str]:
    return [iso(from_datetime(m)) for m in moments]


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("Europe/Berlin", date(2026, 3, 29)),
        ("Europe/Berlin", date(2026, 10, 25)),
        ("America/New_York", date(2026, 3, 8)),
        ("America/New_York", date(2026, 11, 1)),
        ("Australia/Lord_Howe", date(2026, 4, 5)),
        ("Australia/Lord_Howe", date(2026, 10, 4)),
    ],
)
def test_real_time_expressions_agree_with_a_minute_by_minute_walk(tz: str, day: date) -> None:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC) - timedelta(hours=20)
    end = start + timedelta(hours=36)
    for expr, minutes, hours in [
        ("*/15 * * * *", {0, 15, 30, 45}, set(range(24))),
        ("0 * * * *", {0}, set(range(24))),
        ("10,40 */2 * * *", {10, 40}, set(range(0, 24, 2))),
        ("0 */20 1-3 * * *", set(range(0, 60, 20)), {1, 2, 3}),
    ]:
        expected = _isos(real_time(tz, start, end, minutes, hours))
        start_ms = from_datetime(start) - 1
        got = []
        for ms in Cron(expr, tz).after(start_ms):
            if ms >= from_datetime(end):
                break
            got.append(iso(ms))
        assert got == expected, expr


@pytest.mark.parametrize(
    ("tz", "day", "hour", "minute"),
    [
        ("Europe/Berlin", date(2026, 3, 29), 2, 30),  # skipped
        ("Europe/Berlin", date(2026, 10, 25), 2, 30),  # repeated
        ("America/New_York", date(2026, 3, 8), 2, 0),  # skipped
        ("America/New_York", date(2026, 11, 1), 1, 15),  # repeated
        ("Australia/Lord_Howe", date(2026, 10, 4), 2, 10),  # skipped
        ("Australia/Lord_Howe", date(2026, 4, 5), 1, 50),  # repeated
    ],
)
def test_fixed_time_jobs_run_once_per_day_as_the_hand_evaluator_says(
    tz: str, day: date, hour: int, minute: int
) -> None:
    days = [day + timedelta(days=n) for n in (-1, 0, 1)]
    expected = _isos(fixed_time(tz, days, hour, minute))
    local_midnight = datetime(days[0].year, days[0].month, days[0].day, tzinfo=ZoneInfo(tz))
    first = local_midnight.astimezone(UTC)
    got = occurrences(f"{minute} {hour} * * *", tz, first.isoformat(), 3)
    assert got == expected
    assert len(set(got)) == 3
