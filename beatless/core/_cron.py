"""Cron expressions: parsed once, then occurrences iterated forward in a time zone.

Grammar, as Debian cron reads it: five fields ``minute hour day-of-month month
day-of-week``, or six with ``second`` first; ``*``, lists ``a,b``, ranges ``a-b`` and
steps ``*/n``, ``a/n``, ``a-b/n``; month and weekday names (``JAN``, ``MON``), any case;
``0`` and ``7`` are both Sunday. Day-of-month also takes ``L`` (the last day), ``LW``
(the last weekday) and ``nW`` (the weekday nearest day n, never leaving the month);
day-of-week takes ``5L`` (the last Friday) and ``5#3`` (the third Friday). The aliases
``@hourly`` … ``@yearly`` expand first.

Days: day-of-month and day-of-week combine with OR unless either field starts with
``*`` (Debian cron), or as ``day_and`` says (Celery's crontab: AND).

Daylight saving time, Debian cron's rule: a five-field expression whose minute and hour
fields do not start with ``*`` is a *fixed-time* job. A wall time skipped by a change
runs once, at the first whole minute after the gap (the transition); a repeated one runs
once, at its first pass. Any other expression follows *real time*: it runs at every
instant whose local wall time matches, so a skipped wall time never runs and a repeated
one runs at both passes.

Wall times are counted as seconds from 1970-01-01 00:00 local time, instants as seconds
from the Unix epoch; an instant's wall time is the instant plus the zone's UTC offset.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import MAXYEAR, UTC, date, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from beatless.core._time import EPOCH, SAMPLE_S, next_change_s, offset_s

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
DAY_S = 86_400
FOLD_S = 2 * DAY_S
"""More than any change of a UTC offset: this long after a change, a wall time has one instant."""
_NEVER = 2**62
"""``until`` when there is none: later than any instant a datetime can hold."""
GIVE_UP_MONTHS = 400 * 12
"""Months without a matching day after which iteration stops (the calendar repeats every
400 years; :meth:`CronPattern.parse` refuses expressions that never match)."""

_SECOND, _MINUTE, _HOUR, _DAY, _MONTH, _DOW = range(6)
_NAMES = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")
_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_WEEKDAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_LONGEST = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_NEAREST = re.compile(r"^([0-9]{1,2})W$")
# Terms that are not plain numbers, encoded as negative numbers inside a parsed field.
_LAST, _LAST_WEEKDAY = -1, -2  # day-of-month L and LW
_LAST_KIND = -10  # day-of-week dL is _LAST_KIND - d
_NTH = -100  # day-of-week d#n is _NTH * n - d
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_NAIVE_EPOCH = datetime(1970, 1, 1)
_ONE_SECOND = timedelta(seconds=1)
PARSED_KEPT = 65_536
"""Expressions (and fields) whose parsed form is kept, for the next entry that uses one."""


class CronError(ValueError):
    """An expression that cannot be read or never matches, worded as Debian cron does."""


def _bad(field: int) -> CronError:
    return CronError(f"bad {_NAMES[field]}")


# --- parsing -------------------------------------------------------------------------


def _number(field: int, text: str) -> int:
    if not text or any(ch not in "0123456789" for ch in text):
        raise _bad(field)
    return int(text)


def _value(field: int, text: str) -> int:
    """One value of a field: a number in its range, or a month or weekday name."""
    if field == _MONTH and text in _MONTH_NAMES:
        return _MONTH_NAMES.index(text) + 1
    if field == _DOW and text in _WEEKDAY_NAMES:
        return _WEEKDAY_NAMES.index(text)
    value = _number(field, text)
    low, high = _RANGES[field]
    if not low <= value <= high:
        raise _bad(field)
    return value


def _parse(field: int, text: str) -> set[int]:
    """The values of one field (special terms encoded as negative numbers)."""
    low, high = _RANGES[field]
    if text == "*":
        return set(range(low, high + 1))
    if "," in text:
        values: set[int] = set()
        for term in text.split(","):
            values |= _parse(field, term)
        return values
    if field == _DOW and ("L" in text or "#" in text):
        return {_special_weekday(text)}
    if "/" in text:
        return _parse_step(field, *text.split("/", 1))
    if "-" in text:
        first, last = (_value(field, part) for part in text.split("-", 1))
        if last < first:
            raise _bad(field)
        return set(range(first, last + 1))
    return {_single(field, text)}


def _single(field: int, text: str) -> int:
    """One value, or day-of-month ``L`` or ``LW``."""
    if field == _DAY and text in ("L", "LW"):
        return _LAST if text == "L" else _LAST_WEEKDAY
    return _value(field, text)


def _special_weekday(text: str) -> int:
    """``dL`` (the last weekday d of the month) or ``d#n`` (the n-th), encoded."""
    if "L" in text:
        if not text[:-1].isdigit():
            raise _bad(_DOW)
        return _LAST_KIND - _value(_DOW, text[:-1])
    term, nth = text.split("#", 1)
    n = _number(_DOW, nth)
    if not 1 <= n <= 5:
        raise _bad(_DOW)
    return _NTH * n - _value(_DOW, term)


def _parse_step(field: int, term: str, step_text: str) -> set[int]:
    """``term/step``: every step-th value of the term (``a-a/n`` is ``a`` alone), or of the
    range from a single value (``a/n``: ``a``, ``a + n``, ... up to the field's last)."""
    step = _number(field, step_text)
    if step == 0:
        raise _bad(field)
    values = _parse(field, term)
    if values in ({_LAST}, {_LAST_WEEKDAY}):
        return values
    if "-" not in term and "*" not in term:
        return set(range(min(values), _RANGES[field][1] + 1, step))
    return set(sorted(values)[::step])


def _take_nearest(dom: str) -> tuple[str | None, frozenset[int]]:
    """Split the ``nW`` terms off a day-of-month field: the rest (None if no term is
    left) and the days n."""
    if "W" not in dom.replace("LW", ""):
        return dom, frozenset()
    rest, nearest = [], set()
    for term in dom.split(","):
        match = _NEAREST.match(term)
        if match is None:
            rest.append(term)
            continue
        day = int(match.group(1))
        if not 1 <= day <= 31:
            raise _bad(_DAY)
        nearest.add(day)
    return (",".join(rest) if rest else None), frozenset(nearest)


def _fields(expr: str) -> tuple[list[str], bool]:
    """Six upper-case fields (``0`` seconds added to five), after expanding an alias, and
    whether the expression has its own seconds field."""
    text = ALIASES.get(expr.lower(), expr)
    if text.startswith("@"):
        raise CronError(f"unsupported alias {text.lower()}")
    fields = text.upper().split()
    if len(fields) not in (5, 6):
        raise CronError("bad expression: expected 5 fields (6 with seconds first) or an @alias")
    return (fields, True) if len(fields) == 6 else (["0", *fields], False)


# --- days ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Days:
    """Which dates match: the month, and day-of-month with day-of-week (OR, or AND)."""

    months: frozenset[int]
    days: frozenset[int]
    """Days of the month 1-31, with ``_LAST`` and ``_LAST_WEEKDAY``."""
    nearest: frozenset[int]
    """The n of the ``nW`` terms."""
    weekdays: frozenset[int]
    """0 (Sunday) - 7 (Sunday), with the encoded ``dL`` and ``d#n`` terms."""
    day_and: bool

    def ever_matches(self) -> bool:
        """Whether any date matches: every month starts on every weekday, Februaries of
        both lengths, within the 400-year cycle of the calendar."""
        return any(
            _month_days(self, month, first_weekday, length)
            for month in self.months
            for length in ((28, 29) if month == 2 else (_LONGEST[month],))
            for first_weekday in range(7)
        )

    def from_day(self, first: int) -> Iterator[int]:
        """The matching days from day ``first`` on, as days since 1970-01-01."""
        start = date.fromordinal(_EPOCH_ORDINAL + first)
        year, month, idle = start.year, start.month, 0
        while idle < GIVE_UP_MONTHS and year <= MAXYEAR:
            first_weekday, length = calendar.monthrange(year, month)
            days = _month_days(self, month, first_weekday, length)
            idle = 0 if days else idle + 1
            before_first = date(year, month, 1).toordinal() - _EPOCH_ORDINAL - 1
            for day in days:
                if before_first + day >= first:
                    yield before_first + day
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)


@lru_cache(maxsize=32_768)
def _month_days(days: Days, month: int, first_weekday: int, length: int) -> tuple[int, ...]:
    """The matching days of a month of ``length`` days whose 1st is ``first_weekday``
    (Monday 0). Nothing else about a month decides which of its days match."""
    if month not in days.months:
        return ()
    nearest = _nearest_weekdays(first_weekday, length, days.nearest)
    last_weekday = _nearest_weekdays(first_weekday, length, {length}).pop()
    out = []
    for day in range(1, length + 1):
        by_dom = (
            day in days.days
            or day in nearest
            or (day == length and _LAST in days.days)
            or (day == last_weekday and _LAST_WEEKDAY in days.days)
        )
        weekday = (first_weekday + day) % 7  # Sunday 0
        by_dow = (
            weekday in days.weekdays
            or weekday + 7 in days.weekdays
            or (day + 7 > length and _weekday_term(days.weekdays, _LAST_KIND, weekday))
            or _weekday_term(days.weekdays, _NTH * ((day + 6) // 7), weekday)
        )
        if (by_dom and by_dow) if days.day_and else (by_dom or by_dow):
            out.append(day)
    return tuple(out)


def _weekday_term(weekdays: frozenset[int], base: int, weekday: int) -> bool:
    """Whether ``base - weekday`` is a term, Sunday written as 0 or as 7."""
    return base - weekday in weekdays or (weekday == 0 and base - 7 in weekdays)


def _nearest_weekdays(
    first_weekday: int, length: int, wanted: set[int] | frozenset[int]
) -> set[int]:
    """Quartz's ``nW``: the weekday nearest to day n, never leaving the month."""
    out = set()
    for n in wanted:
        if n > length:
            continue
        day, weekday = n, (first_weekday + n - 1) % 7  # Monday 0
        if weekday == 5:  # Saturday: Friday before, or Monday after on the 1st
            day = day - 1 if day > 1 else day + 2
        elif weekday == 6:  # Sunday: Monday after, or Friday before on the last day
            day = day + 1 if day < length else day - 2
        out.add(day)
    return out


# --- the pattern ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CronPattern:
    """A parsed cron expression: the wall times it matches and the DST rule it follows."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: Days
    real_time: bool
    """False for a fixed-time job (see the module's DST rule)."""
    has_seconds: bool

    @classmethod
    def parse(cls, expr: str, day_and: bool | None = None) -> CronPattern:
        """Read ``expr``; ``day_and`` None combines the day fields as Debian cron does.

        Patterns are immutable: an expression read before gives the same pattern, and
        equal fields of different expressions share one value (a schedule of 100,000
        entries holds a few hundred distinct fields)."""
        return _parsed(expr, day_and)

    def occurrences(
        self, after_ms: int, tz: ZoneInfo, until_ms: int | None = None
    ) -> Iterator[int]:
        """The occurrences strictly after ``after_ms`` in ``tz``: ascending epoch ms. With
        ``until_ms``, the iteration may stop after the last one not later than it."""
        after_s, until_s = after_ms // 1000, _NEVER if until_ms is None else until_ms // 1000
        if self.real_time:
            instants = _real_time(self, after_s, until_s, tz)
        else:
            instants = _fixed_time(self, after_s, until_s, tz)
        last = after_ms
        for instant in instants:
            ms = instant * 1000
            if ms > last:  # a skipped or repeated fixed time runs once
                last = ms
                yield ms

    def walls(self, after: int) -> Iterator[int]:
        """The matching wall times strictly after the wall time ``after``, ascending."""
        first, lo = divmod(after + 1, DAY_S)
        for day in self.days.from_day(first):
            yield from self._times(day * DAY_S, lo if day == first else 0)

    def _times(self, midnight: int, lo: int) -> Iterator[int]:
        """One day's matching wall times from ``lo`` seconds after its midnight on."""
        seconds, minutes = self.seconds, self.minutes
        for hour in self.hours[bisect_left(self.hours, lo // 3600) :]:
            for minute in minutes:
                base = hour * 3600 + minute * 60
                if base >= lo:
                    at = midnight + base
                    for second in seconds:
                        yield at + second
                elif base + 59 >= lo:
                    yield from (midnight + base + s for s in seconds if base + s >= lo)


@lru_cache(maxsize=PARSED_KEPT)
def _parsed(expr: str, day_and: bool | None) -> CronPattern:
    fields, has_seconds = _fields(expr)
    dom, nearest = _take_nearest(fields[_DAY])
    seconds, minutes, hours = (_times_of(i, fields[i]) for i in range(3))
    if day_and is None:
        day_and = fields[_DOW].startswith("*") or (not nearest and fields[_DAY].startswith("*"))
    days = _days(dom, nearest, fields[_MONTH], fields[_DOW], day_and)
    real_time = has_seconds or any(fields[i].startswith("*") for i in (_MINUTE, _HOUR))
    return CronPattern(seconds, minutes, hours, days, real_time, has_seconds)


@lru_cache(maxsize=PARSED_KEPT)
def _times_of(field: int, text: str) -> tuple[int, ...]:
    """The sorted values of a second, minute or hour field."""
    return tuple(sorted(_parse(field, text)))


@lru_cache(maxsize=PARSED_KEPT)
def _values_of(field: int, text: str | None) -> frozenset[int]:
    """The values of a day-of-month (``None``: no term left), month or weekday field."""
    return frozenset() if text is None else frozenset(_parse(field, text))


@lru_cache(maxsize=PARSED_KEPT)
def _days(dom: str | None, nearest: frozenset[int], month: str, dow: str, day_and: bool) -> Days:
    """The days of the three day fields (``dom`` without its ``nW`` terms, ``nearest``
    their days), checked to match some date."""
    month_days = _values_of(_DAY, dom)
    days = Days(_values_of(_MONTH, month), month_days, nearest, _values_of(_DOW, dow), day_and)
    _check_days(days)
    return days


def _check_days(days: Days) -> None:
    """Refuse day fields that no date matches, in Debian cron's words where it has them."""
    plain = [day for day in days.days if day > 0]
    only_plain = bool(plain) and len(plain) == len(days.days) and not days.nearest
    if days.day_and and only_plain and min(plain) > max(_LONGEST[m] for m in days.months):
        raise _bad(_DAY)
    if not days.ever_matches():
        raise CronError("the expression never matches a date")


# --- occurrences in a zone -----------------------------------------------------------


class _Span:
    """Instants from ``start`` on over which ``tz`` keeps one UTC offset, found as needed."""

    __slots__ = ("checked", "end", "offset", "start", "tz")

    def __init__(self, tz: ZoneInfo, at: int, *, look_back: bool = False) -> None:
        self.tz, self.offset, self.start = tz, offset_s(tz, at), at
        if look_back and offset_s(tz, at - DAY_S) == offset_s(tz, at - FOLD_S) == self.offset:
            self.start = at - FOLD_S  # no change within FOLD_S before ``at`` (see SAMPLE_S)
        self.checked = at
        """The offset holds over ``[start, checked]``."""
        self.end: int | None = None
        """The first instant with another offset, once found."""

    def holds(self, instant: int) -> bool:
        """Whether ``instant`` (not before ``start``) still has the span's offset."""
        if instant <= self.checked:
            return True
        if self.end is None:
            until = max(instant, self.checked + SAMPLE_S)  # look a day ahead at least
            change = next_change_s(self.tz, self.checked, until)
            if change is None:
                self.checked = until
                return True
            self.end, self.checked = change, change - 1
        return instant < self.end


def _real_time(pattern: CronPattern, after_s: int, until_s: int, tz: ZoneInfo) -> Iterator[int]:
    """Every instant after ``after_s`` whose wall time matches: span by span of one offset."""
    start = after_s + 1
    while True:
        span = _Span(tz, start)
        for wall in pattern.walls(start + span.offset - 1):
            instant = wall - span.offset
            if instant > span.checked:
                if instant > until_s and span.holds(until_s):
                    return  # every instant up to ``until_s`` had this span's offset
                if not span.holds(instant):
                    break
            yield instant
        else:
            return  # the pattern gave up
        if span.end is None:  # never: ``holds`` failed, so the change is known
            return
        start = span.end


def _fixed_time(pattern: CronPattern, after_s: int, until_s: int, tz: ZoneInfo) -> Iterator[int]:
    """Each matching wall time after the wall time of ``after_s``, at its first pass; a
    skipped one at the first whole minute after the gap. May repeat or precede
    ``after_s`` (the caller keeps what is later than all before)."""
    span = _Span(tz, after_s, look_back=True)
    for wall in pattern.walls(after_s + span.offset):
        instant = wall - span.offset
        if instant > until_s + FOLD_S:
            return  # its instant, and every later one, is after ``until_s``
        if instant < span.start + FOLD_S or not span.holds(instant):
            instant = _first_pass(wall, tz)  # near a change: ask the zone
            if instant > span.checked and not span.holds(instant):
                span = _Span(tz, instant, look_back=True)
        yield instant


def _first_pass(wall: int, tz: ZoneInfo) -> int:
    """The instant of a wall time at its first pass; one skipped by a change moves on to
    the first whole minute that the wall clock shows after the gap."""
    naive = _NAIVE_EPOCH + timedelta(seconds=wall)
    local = naive.replace(tzinfo=tz)  # fold 0: the first pass
    instant = (local - EPOCH) // _ONE_SECOND
    if local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == naive:
        return instant
    # Skipped: read with the offset after the change (fold 1) it falls before the change,
    # with the one before (fold 0) after it.
    before = (naive.replace(tzinfo=tz, fold=1) - EPOCH) // _ONE_SECOND
    change = next_change_s(tz, before, instant)
    if change is None:  # never: the offset differs between the two readings
        return instant
    gap_end = change + offset_s(tz, change)  # the wall time at the change
    return change + (-gap_end) % 60
