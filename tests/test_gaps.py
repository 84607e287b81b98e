"""The shortest gap between cron occurrences, checked against a brute-force reference."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from beatless.core._gaps import DAY_MS, YEAR_MS, min_gap_ms
from beatless.core.triggers import Cron
from beatless.errors import ScheduleError
from beatless.schedule.firing import from_datetime

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]
# Mid-transition days of 2026 in the zones above, as UTC dates: the interesting starts.
TRANSITION_DAYS = [
    datetime(2026, 3, 8, tzinfo=UTC),  # New York springs forward
    datetime(2026, 3, 29, tzinfo=UTC),  # Berlin springs forward
    datetime(2026, 4, 4, tzinfo=UTC),  # Lord Howe falls back 30 min
    datetime(2026, 10, 3, tzinfo=UTC),  # Lord Howe springs forward 30 min
    datetime(2026, 10, 25, tzinfo=UTC),  # Berlin falls back
    datetime(2026, 11, 1, tzinfo=UTC),  # New York falls back
]
START_2026 = from_datetime(datetime(2026, 1, 1, tzinfo=UTC))


def brute_min_gap_ms(cron: Cron, start_ms: int, horizon_ms: int) -> int:
    """Every occurrence in ``(start, start + horizon]``, consecutive gaps, the smallest."""
    best = None
    prev = None
    for occurrence in cron.after(start_ms):
        if occurrence > start_ms + horizon_ms:
            break
        if prev is not None:
            best = occurrence - prev if best is None else min(best, occurrence - prev)
        prev = occurrence
    return horizon_ms if best is None else best


def _values(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    step = st.integers(2, max(2, (high - low) // 2))
    return st.one_of(
        value.map(str),
        st.lists(value, min_size=2, max_size=3, unique=True).map(
            lambda vs: ",".join(map(str, sorted(vs)))
        ),
        st.tuples(value, value, step).map(lambda t: f"{min(t[:2])}-{max(t[:2])}/{t[2]}"),
        step.map(lambda s: f"*/{s}"),
    )


SECONDS = st.sampled_from(["0", "30", "0,30", "*/20", "10-50/20"])
MINUTES = st.one_of(st.just("*"), _values(0, 59))
HOURS = st.one_of(st.just("*"), _values(0, 23), st.sampled_from(["1,2", "2", "2,3", "1-3"]))
DAYS = st.one_of(
    st.just("*"),
    _values(1, 31),
    st.sampled_from(["L", "LW", "1W", "15W", "31W", "1,15W"]),
)
MONTHS = st.sampled_from(["*", "*", "3,4", "10,11", "3", "4", "10", "11", "*/2"])
WEEKDAYS = st.sampled_from(["*", "*", "*", "0", "SUN", "1-5", "5L", "0#1", "6#2", "1,3"])


@st.composite
def expressions(draw: st.DrawFn) -> tuple[str, bool | None]:
    fields = [draw(MINUTES), draw(HOURS), draw(DAYS), draw(MONTHS), draw(WEEKDAYS)]
    if draw(st.booleans()):
        fields.insert(0, draw(SECONDS))
    return " ".join(fields), draw(st.sampled_from([None, True]))


def cron_min_gap_ms(cron: Cron, start_ms: int, *, horizon_ms: int = YEAR_MS) -> int:
    return min_gap_ms(cron.pattern, cron.zone, start_ms, horizon_ms=horizon_ms)


def _cost(cron: Cron, horizon_ms: int) -> int:
    """Roughly how many occurrences the brute force would walk."""
    pattern = cron.pattern
    per_day = len(pattern.seconds) * len(pattern.minutes) * len(pattern.hours)
    return per_day * (horizon_ms // DAY_MS + 1)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(
    expression=expressions(),
    tz=st.sampled_from(ZONES),
    day=st.sampled_from(TRANSITION_DAYS),
    shift_ms=st.integers(-20 * DAY_MS, 2 * DAY_MS),
    horizon_days=st.integers(3, 40),
)
def test_min_gap_equals_the_brute_force_around_transitions(
    expression: tuple[str, bool | None], tz: str, day: datetime, shift_ms: int, horizon_days: int
) -> None:
    expr, day_and = expression
    try:
        cron = Cron(expr, tz, day_and=day_and)
    except ScheduleError:
        assume(False)
        raise
    horizon = horizon_days * DAY_MS
    assume(_cost(cron, horizon) <= 12_000)
    start = from_datetime(day) + shift_ms
    assert cron_min_gap_ms(cron, start, horizon_ms=horizon) == brute_min_gap_ms(
        cron, start, horizon
    )


@pytest.mark.parametrize(
    ("expr", "tz", "expected_ms"),
    [
        ("0 */2 * * *", "Europe/Berlin", 3_600_000),  # autumn: 02:00 CEST, 02:00 CET
        ("30 2,3 * * *", "Europe/Berlin", 1_800_000),  # spring: 02:30 runs at 03:00 CEST
        ("30 2 * * *", "Europe/Berlin", 84_600_000),  # spring: 23h30 between two runs
        # New York repeats 01:00-02:00 and skips 02:00-03:00: even hours stay 2h+ apart.
        ("0 */2 * * *", "America/New_York", 7_200_000),
        ("0 2 * * *", "Australia/Lord_Howe", 84_600_000),  # 30-minute shift
        ("0 * * * *", "UTC", 3_600_000),
        ("0 0 L * *", "UTC", 28 * DAY_MS),
        ("0 0 1W * *", "UTC", 28 * DAY_MS),  # Mon 2 Feb → Mon 2 Mar 2026 (1 Feb a Sunday)
        ("0 0 13 * 5", "UTC", DAY_MS),  # Debian OR: Thursday 13th, Friday 14th
        ("0 3 * * 6,0", "Europe/Berlin", DAY_MS - 3_600_000),  # Sat 28 → Sun 29 March
        ("0 9 * * 1#1", "UTC", 28 * DAY_MS),
        ("0 12 1 1 *", "UTC", YEAR_MS),  # one occurrence in the horizon: the horizon
    ],
)
def test_min_gap_of_tricky_expressions_over_a_year_matches_the_brute_force(
    expr: str, tz: str, expected_ms: int
) -> None:
    cron = Cron(expr, tz)
    start = from_datetime(datetime(2026, 1, 10, 13, 17, tzinfo=UTC))
    assert cron_min_gap_ms(cron, start) == expected_ms
    assert brute_min_gap_ms(cron, start, YEAR_MS) == expected_ms


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("America/New_York", TRANSITION_DAYS[0]),
        ("Europe/Berlin", TRANSITION_DAYS[1]),
        ("Australia/Lord_Howe", TRANSITION_DAYS[2]),
        ("Australia/Lord_Howe", TRANSITION_DAYS[3]),
        ("Europe/Berlin", TRANSITION_DAYS[4]),
        ("America/New_York", TRANSITION_DAYS[5]),
    ],
)
@pytest.mark.parametrize("expr", ["*/20 * * * * *", "7,37 */3 * * * *", "*/10 1-3 * * *"])
def test_dense_real_time_expressions_match_the_brute_force_over_transition_days(
    expr: str, tz: str, day: datetime
) -> None:
    cron = Cron(expr, tz)
    start = from_datetime(day) - DAY_MS // 2
    assert cron_min_gap_ms(cron, start, horizon_ms=2 * DAY_MS) == brute_min_gap_ms(
        cron, start, 2 * DAY_MS
    )


def test_day_and_intersects_day_of_month_with_day_of_week() -> None:
    cron = Cron("0 0 13 * 5", "UTC", day_and=True)  # Friday the 13th: Feb, Mar, Nov 2026
    start = from_datetime(datetime(2026, 1, 1, tzinfo=UTC))
    gap = cron_min_gap_ms(cron, start)
    assert gap == 28 * DAY_MS
    assert gap == brute_min_gap_ms(cron, start, YEAR_MS)


def test_min_gap_counts_only_occurrences_after_the_start() -> None:
    cron = Cron("0,1 12 * * *", "UTC")
    start = from_datetime(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    # 12:01 today, then 12:00 and 12:01 tomorrow: the shortest gap is one minute.
    assert cron_min_gap_ms(cron, start, horizon_ms=DAY_MS) == 23 * 3_600_000 + 59 * 60_000
    assert cron_min_gap_ms(cron, start, horizon_ms=2 * DAY_MS) == 60_000


@pytest.mark.parametrize(
    ("expr", "expected_ms"), [("* * * * * *", 1_000), ("*/5 * * * *", 300_000)]
)
def test_dense_expressions_take_milliseconds_not_a_year_of_iteration(
    expr: str, expected_ms: int
) -> None:
    cron = Cron(expr, "Europe/Berlin")
    began = time.process_time()  # CPU time: other processes' load does not count
    gap = cron_min_gap_ms(cron, START_2026)
    elapsed = time.process_time() - began
    assert gap == expected_ms
    assert elapsed < 0.25, f"{expr!r} took {elapsed * 1000:.1f} ms of CPU"


def test_min_gap_defaults_to_a_horizon_starting_now() -> None:
    assert Cron("0 */2 * * *", "Europe/Berlin").min_gap_ms() == 3_600_000
    assert Cron("*/10 * * * *", "UTC").min_gap_ms() == 600_000
