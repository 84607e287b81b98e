"""Triggers: immutable values that turn an instant into the next occurrences.

:class:`Every` and :class:`Cron` recur; :class:`At` has one occurrence (a one-off); a
:class:`Windowed` trigger keeps another's occurrences within a window;
:class:`~beatless.core.solar.Solar` (a sibling module: it needs ``ephem``) follows the sun.

An occurrence is a pure function of the trigger and the instant, in integer Unix epoch
milliseconds (UTC). Two nodes started at different times agree on every occurrence.

DST rule (Debian cron's): a 5-field expression whose minute and hour fields do not start
with ``*`` runs a skipped wall time once, at the transition, and a repeated one once, at
the first pass; other expressions (``*``, ``*/15`` in the minute or hour, and 6-field
expressions) follow real time. The evaluator is :mod:`beatless.core._cron`.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import time
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol, runtime_checkable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from beatless.core._cron import CronError, CronPattern
from beatless.core._gaps import floor_ms, min_gap_ms
from beatless.core._time import EPOCH, InstantLike, as_instant, from_datetime, iso, to_datetime
from beatless.core.durations import DurationLike, as_timedelta, describe, to_ms
from beatless.errors import ConfigError, ScheduleError


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
    pattern: CronPattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        expr = " ".join(self.expr.split())
        object.__setattr__(self, "expr", expr)
        if self.tz is not None:
            zone(self.tz)
        try:
            pattern = CronPattern.parse(expr, self.day_and)
        except CronError as exc:
            raise ScheduleError(f"cron {expr!r}: {exc}") from None
        object.__setattr__(self, "pattern", pattern)

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.tz or "UTC")

    def bind(self, tz: str) -> Cron:
        """This cron in ``tz`` if it names no zone of its own."""
        if self.tz is not None:
            return self
        zone(tz)
        bound = object.__new__(Cron)  # the expression as read already: not parsed again
        for name, value in (("expr", self.expr), ("tz", tz), ("day_and", self.day_and)):
            object.__setattr__(bound, name, value)
        object.__setattr__(bound, "pattern", self.pattern)
        return bound

    def after(self, instant_ms: int) -> Iterator[int]:
        return self.pattern.occurrences(instant_ms, self.zone)

    def min_gap_ms(self) -> int:
        """Over the year from the current minute: the same for every entry with this
        trigger, computed once a minute (a schedule repeats its triggers)."""
        return _gap_from(self, _this_minute_ms())

    def shortest_possible_ms(self) -> int:
        """A gap no two occurrences are closer than, known from the expression and the
        zone alone: a minute for five fields in a zone whose UTC offsets are whole
        minutes, else a second (:func:`~beatless.core._gaps.floor_ms`)."""
        return _floor_from(self, _this_minute_ms())

    def describe(self) -> str:
        text = f"cron {self.expr!r} in {self.tz or 'UTC'}"
        return text + (" (day-of-month AND day-of-week)" if self.day_and else "")


GAPS_KEPT = 65_536
"""Crons whose shortest gap is kept (for the minute it was computed in)."""


def _this_minute_ms() -> int:
    """The start of the current minute, in epoch milliseconds: where the year over which
    a cron's gaps are measured starts."""
    return int(time.time()) // 60 * 60_000


@functools.lru_cache(maxsize=GAPS_KEPT)
def _gap_from(cron: Cron, start_ms: int) -> int:
    return min_gap_ms(cron.pattern, cron.zone, start_ms)


@functools.lru_cache(maxsize=GAPS_KEPT)
def _floor_from(cron: Cron, start_ms: int) -> int:
    return floor_ms(cron.pattern, cron.zone, start_ms)


NO_GAP_MS = 2**62
"""The shortest gap of a trigger with a single occurrence: longer than any other, so no
jitter is too wide for it."""


@dataclass(frozen=True, slots=True)
class At:
    """One occurrence, at ``instant``: an aware datetime, integer epoch milliseconds, or
    ISO 8601 text with a ``Z`` or an offset (naive instants are refused). Resolution 1 ms.

    Its firing id is derived from the address and the instant like every other, so the
    one firing is claimed once across nodes and restarts."""

    instant: datetime
    instant_ms: int = field(init=False, repr=False, compare=False)

    def __init__(self, instant: InstantLike) -> None:
        ms = as_instant(instant, name="at")
        object.__setattr__(self, "instant", to_datetime(ms))
        object.__setattr__(self, "instant_ms", ms)

    def after(self, instant_ms: int) -> Iterator[int]:
        return iter((self.instant_ms,) if self.instant_ms > instant_ms else ())

    def min_gap_ms(self) -> int:
        return NO_GAP_MS

    def describe(self) -> str:
        return f"at {iso(self.instant_ms)}"


@dataclass(frozen=True, slots=True)
class Windowed:
    """The occurrences of ``trigger`` from ``start_ms`` (inclusive) to ``end_ms``
    (exclusive), both epoch milliseconds; ``None`` leaves that side open. Ids and offsets
    are those of ``trigger``'s occurrences: a window only leaves some out."""

    trigger: Trigger
    start_ms: int | None = None
    end_ms: int | None = None

    def __post_init__(self) -> None:
        if self.start_ms is not None and self.end_ms is not None and self.end_ms <= self.start_ms:
            raise ConfigError(
                f"window: the end {iso(self.end_ms)} must be after the start "
                f"{iso(self.start_ms)} (the start is in the window, the end is not)"
            )

    def after(self, instant_ms: int) -> Iterator[int]:
        if self.start_ms is not None:
            instant_ms = max(instant_ms, self.start_ms - 1)
        found = self.trigger.after(instant_ms)
        end = self.end_ms
        return found if end is None else itertools.takewhile(lambda o: o < end, found)

    def min_gap_ms(self) -> int:
        return self.trigger.min_gap_ms()

    def key(self, occurrence_ms: int) -> int | str:
        return occurrence_key(self.trigger, occurrence_ms)

    def describe(self) -> str:
        text = self.trigger.describe()
        if self.start_ms is not None:
            text += f" from {iso(self.start_ms)}"
        if self.end_ms is not None:
            text += f" until {iso(self.end_ms)}"
        return text


def occurrence_key(trigger: Trigger, occurrence_ms: int) -> int | str:
    """What the firing id of an occurrence is derived from: the occurrence itself, or, for
    a trigger with a ``key`` method (:class:`~beatless.core.solar.Solar`: its event and
    local solar date), that key, so that nodes whose arithmetic places the occurrence a
    millisecond apart still derive one id."""
    key = getattr(trigger, "key", None)
    return occurrence_ms if key is None else key(occurrence_ms)


def tzdata_version() -> str:
    """The version of the time-zone database that ``zoneinfo`` reads (``2025b``), from the
    first directory of ``zoneinfo.TZPATH`` that has ``tzdata.zi``, else the ``tzdata``
    package; ``unknown`` when neither says. Nodes whose versions differ may place a cron
    occurrence differently around a zone's rule change."""
    for root in zoneinfo.TZPATH:
        try:
            with (Path(root) / "tzdata.zi").open(encoding="utf-8") as file:
                first = file.readline()
        except OSError:
            continue
        if first.startswith("# version "):
            return first.removeprefix("# version ").strip()
    try:
        package = importlib.import_module("tzdata")
    except ImportError:
        return "unknown"
    return str(getattr(package, "IANA_VERSION", "unknown"))
