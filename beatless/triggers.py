"""Triggers: immutable values that turn an instant into the next occurrences.

An occurrence is a pure function of the trigger and the instant, in integer Unix epoch
milliseconds (UTC). Two nodes started at different times agree on every occurrence.

DST rule (Debian cron's, as cronsim evaluates it): a 5-field expression with a fixed
minute and hour that falls in a skipped hour runs once at the transition; one that
falls in a repeated hour runs once, at the first pass; expressions with a ``*`` in the
minute or hour field, and 6-field expressions, follow real time.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from beatless.durations import DurationLike, as_timedelta, describe, to_ms
from beatless.errors import ConfigError, ScheduleError
from beatless.firing import EPOCH, from_datetime, to_datetime

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_NEAREST_WEEKDAY = re.compile(r"^(\d{1,2})W$")


@runtime_checkable
class Trigger(Protocol):
    """What makes occurrences. Implementations are frozen, hashable values."""

    def after(self, instant_ms: int) -> Iterator[int]:
        """Occurrences strictly after ``instant_ms``, ascending, in epoch milliseconds."""
        ...

    def min_gap_ms(self) -> int:
        """The shortest gap between two consecutive occurrences (over at least a year)."""
        ...

    def describe(self) -> str:
        """A short human form: ``cron '0 2 * * *' in Europe/Berlin``, ``every 30s``."""
        ...


def zone(name: str | ZoneInfo) -> ZoneInfo:
    """A ZoneInfo for an IANA name, with a ConfigError for an unknown one."""
    if isinstance(name, ZoneInfo):
        return name
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"unknown time zone {name!r}: use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from exc


@dataclass(frozen=True, slots=True)
class Every:
    """Occurrences at ``anchor + k × interval`` for every integer k.

    The anchor defaults to the Unix epoch, so every node agrees on every slot whatever
    its start time. Sub-second intervals are allowed; the resolution is 1 ms.
    """

    interval: timedelta
    anchor: datetime = EPOCH
    interval_ms: int = field(init=False, repr=False, compare=False)
    anchor_ms: int = field(init=False, repr=False, compare=False)

    def __init__(self, interval: DurationLike, anchor: datetime | None = None) -> None:
        delta = as_timedelta(interval, name="every")
        if to_ms(delta) <= 0:
            raise ScheduleError(f"every: the interval must be at least 1ms, got {delta!r}")
        anchor = EPOCH if anchor is None else anchor
        if anchor.tzinfo is None or anchor.utcoffset() is None:
            raise ConfigError(f"every: the anchor {anchor.isoformat()} must be timezone-aware")
        object.__setattr__(self, "interval", delta)
        object.__setattr__(self, "anchor", anchor.astimezone(UTC))
        object.__setattr__(self, "interval_ms", to_ms(delta))
        object.__setattr__(self, "anchor_ms", from_datetime(anchor))

    def after(self, instant_ms: int) -> Iterator[int]:
        k = (instant_ms - self.anchor_ms) // self.interval_ms + 1
        slot = self.anchor_ms + k * self.interval_ms
        while True:
            yield slot
            slot += self.interval_ms

    def min_gap_ms(self) -> int:
        return self.interval_ms

    def describe(self) -> str:
        text = f"every {describe(self.interval)}"
        if self.anchor_ms:
            text += f" from {self.anchor.isoformat()}"
        return text


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression evaluated in a time zone.

    Five fields, six with seconds first, the ``@hourly``-style aliases, ``L``, ``LW``,
    ``nW`` (nearest weekday) and ``#``. ``day_and=True`` makes day-of-month AND
    day-of-week both required, as Celery's ``crontab`` does; by default the two combine
    as in Debian cron (OR, unless either field starts with ``*``).

    ``tz=None`` means "the schedule's time zone"; a :class:`~beatless.Schedule` binds it.
    """

    expr: str
    tz: str | None = None
    day_and: bool | None = None

    def __post_init__(self) -> None:
        expr = " ".join(self.expr.split())
        object.__setattr__(self, "expr", expr)
        if self.tz is not None:
            zone(self.tz)
        it = self._sim(datetime(2000, 1, 1, tzinfo=UTC))
        try:
            next(it)
        except StopIteration:
            raise ScheduleError(
                f"cron {expr!r}: the expression never matches a date (checked 50 years)"
            ) from None

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.tz or "UTC")

    def bind(self, tz: str) -> Cron:
        """This cron in ``tz`` if it names no zone of its own."""
        return self if self.tz is not None else Cron(self.expr, tz, day_and=self.day_and)

    def after(self, instant_ms: int) -> Iterator[int]:
        start = to_datetime(instant_ms).astimezone(self.zone)
        last = instant_ms
        for moment in self._sim(start):
            occurrence = from_datetime(moment)
            if occurrence > last:  # a guard: never repeat or step back across a DST change
                last = occurrence
                yield occurrence

    def _sim(self, start: datetime) -> _CronSim:
        try:
            return _CronSim(self.expr, start, self.day_and)
        except CronSimError as exc:
            raise ScheduleError(f"cron {self.expr!r}: {_debian_wording(exc)}") from None

    def min_gap_ms(self) -> int:
        from beatless.gaps import cron_min_gap_ms

        return cron_min_gap_ms(self)

    def describe(self) -> str:
        text = f"cron {self.expr!r} in {self.tz or 'UTC'}"
        return text + (" (day-of-month AND day-of-week)" if self.day_and else "")


def _debian_wording(exc: CronSimError) -> str:
    text = str(exc)
    if text == "Wrong number of fields":
        return "bad expression: expected 5 fields (6 with seconds first) or an @alias"
    return text.lower()


class _CronSim(CronSim):
    """cronsim plus aliases, ``nW`` in day-of-month and an explicit day_and."""

    def __init__(self, expr: str, start: datetime, day_and: bool | None) -> None:
        expr = ALIASES.get(expr.lower(), expr)
        if expr.startswith("@"):
            raise CronSimError(f"Unsupported alias {expr}")
        fields = expr.split()
        self.nearest: set[int] = set()
        dom_index = 3 if len(fields) == 6 else 2
        only_nearest = False
        if len(fields) in (5, 6) and "W" in fields[dom_index].upper().replace("LW", ""):
            fields[dom_index], only_nearest = self._take_nearest(fields[dom_index])
        super().__init__(" ".join(fields), start)
        if only_nearest:  # "L" only stood in for an empty day-of-month list
            self.days = set()
        if day_and is not None:
            self.day_and = day_and
        elif self.nearest:
            self.day_and = fields[dom_index + 2].startswith("*")

    def _take_nearest(self, dom: str) -> tuple[str, bool]:
        """Move the ``nW`` terms into ``self.nearest``: the rest, and whether none is left."""
        rest = []
        for term in dom.upper().split(","):
            match = _NEAREST_WEEKDAY.match(term)
            if match is None:
                rest.append(term)
                continue
            day = int(match.group(1))
            if not 1 <= day <= 31:
                raise CronSimError("Bad day-of-month")
            self.nearest.add(day)
        return (",".join(rest), False) if rest else ("L", True)

    def tick(self, seconds: int = 1) -> None:
        """cronsim's step, shortened to end at a UTC-offset change that it would cross.

        cronsim steps an hour (or a jump of whole minutes) in real time and reads the wall
        clock after; across a 30-minute shift (Australia/Lord_Howe) that lands half an hour
        off and skips real wall times. Stopping at the change lets the fields be re-read.
        """
        if seconds > 60 and self.tick_direction == 1 and self.dt.tzinfo not in (None, UTC):
            seconds = _until_offset_change(self.dt, seconds)
        super().tick(seconds)

    def advance_hour(self) -> bool:
        """cronsim's, except that each step ends at the next wall-clock hour."""
        if self.dt.hour in self.hours:
            return False
        self.dt = self.dt.replace(minute=0, second=0)
        while self.dt.hour not in self.hours:
            self.tick(seconds=3600 - self.dt.minute * 60 - self.dt.second)
            if self.dt.hour == 0:
                break
        return True

    def match_dom(self, d: date) -> bool:
        if super().match_dom(d):
            return True
        return bool(self.nearest) and d.day in _nearest_weekdays(d.year, d.month, self.nearest)


def _until_offset_change(moment: datetime, seconds: int) -> int:
    """``seconds``, or fewer: the whole seconds from ``moment`` to its zone's next offset change."""
    start, offset = moment.astimezone(UTC), moment.utcoffset()

    def same(step: int) -> bool:
        return (start + timedelta(seconds=step)).astimezone(moment.tzinfo).utcoffset() == offset

    if same(seconds):
        return seconds
    lo, hi = 0, seconds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if same(mid) else (lo, mid)
    return hi


def _nearest_weekdays(year: int, month: int, days: set[int]) -> set[int]:
    """Quartz's ``nW``: the weekday nearest to day n, never leaving the month."""
    last = calendar.monthrange(year, month)[1]
    out = set()
    for wanted in days:
        if wanted > last:
            continue
        day, weekday = wanted, calendar.weekday(year, month, wanted)
        if weekday == 5:  # Saturday: Friday before, or Monday after on the 1st
            day = wanted - 1 if wanted > 1 else wanted + 2
        elif weekday == 6:  # Sunday: Monday after, or Friday before on the last day
            day = wanted + 1 if wanted < last else wanted - 2
        out.add(day)
    return out
