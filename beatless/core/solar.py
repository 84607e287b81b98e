"""The :class:`Solar` trigger: a solar event (sunrise, sunset, solar noon, dawn and dusk)
at a place, every day it happens, as Celery's ``solar`` schedule computes it.

The instants come from ``ephem`` (the ``solar`` extra: ``pip install 'beatless[solar]'``)
with Celery's observer: no refraction (pressure 0), elevation 0, and per event the
horizon, the ``ephem`` method and whether the sun's centre or its upper limb counts
(:data:`EVENTS`).

**One firing per day and event, whatever the float arithmetic.** Two nodes may compute
the same sunrise a millisecond apart (another ``ephem`` build, another libm). The firing
id of a solar occurrence is therefore derived from its *key*, ``{event}/{local solar
date}``, not from its instant (:meth:`Solar.key`): both nodes claim the same firing, and
each acts on the instant it computed. The local solar date is the date in local mean
solar time (UTC + longitude × 4 min) with the day boundary moved 6 h away from where the
event can fall: a rising (dawn, sunrise) happens between true solar midnight and noon,
so its day starts at 18:00 the evening before; a setting (sunset, dusk) between noon and
midnight, so its day starts at 06:00; solar noon's day starts at midnight. The true solar
time differs from the mean by at most 17 minutes, so every event is hours away from its
day's boundary, and an instant off by a millisecond — or by an hour — keeps its key.

**Days without the event.** Where the sun does not cross the event's horizon on a date
(polar day or night, or the short summer nights without astronomical darkness), that
date has no occurrence; the next date that has one is the next occurrence. At the poles
some events happen once a year; a trigger searches :data:`SEARCH_DAYS` days ahead before
it says it has no more occurrences.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from beatless.core._drivers import driver
from beatless.core._time import EPOCH
from beatless.errors import ConfigError

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

EVENTS: dict[str, tuple[str, str, bool]] = {
    # event: (ephem method, horizon in degrees, use the sun's centre) as celery.schedules.solar
    "dawn_astronomical": ("next_rising", "-18", True),
    "dawn_nautical": ("next_rising", "-12", True),
    "dawn_civil": ("next_rising", "-6", True),
    "sunrise": ("next_rising", "-0:34", False),
    "solar_noon": ("next_transit", "0", False),
    "sunset": ("next_setting", "-0:34", False),
    "dusk_civil": ("next_setting", "-6", True),
    "dusk_nautical": ("next_setting", "-12", True),
    "dusk_astronomical": ("next_setting", "-18", True),
}
"""Celery's solar events, with how each is computed."""

_DAY_STARTS_MS = {"next_rising": -6 * HOUR_MS, "next_transit": 0, "next_setting": 6 * HOUR_MS}
"""Per method, where an event's day starts in local mean solar time, from midnight: 6 h
or more from any instant the event can fall on."""

SEARCH_DAYS = 732
"""How many days ahead an event is looked for before the trigger ends (at the poles some
happen once a year)."""

MIN_GAP_MS = 11 * HOUR_MS
"""The shortest gap taken between two occurrences of a solar event: consecutive days'
events are each within their own day, 12 h 34 min wide at most (half a day plus the
equation of time, both sides), so no two are closer than 11 h."""

_EPHEM_UNIX_DAYS = 25567.5
"""The Unix epoch in ephem's dates (days from 1899-12-31 12:00 UTC)."""

NEEDED_BY = "the solar trigger"


def ephem_version() -> str | None:
    """The installed ``ephem`` version (``4.2.1``), or ``None`` without it. Nodes whose
    versions differ may compute a solar event a little apart: the firing is the same
    (its id comes from the day and event), the instant it is released at may not be."""
    try:
        return importlib.metadata.version("ephem")
    except importlib.metadata.PackageNotFoundError:
        return None


def _degrees(value: object, bound: int) -> bool:
    """Whether ``value`` is a number (not a bool) from ``-bound`` to ``bound``."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and -bound <= value <= bound
    )


def _ephem() -> Any:
    return driver("ephem", NEEDED_BY)


@dataclass(frozen=True, slots=True)
class Solar:
    """Every occurrence of the solar ``event`` (one of :data:`EVENTS`, Celery's names)
    at latitude ``lat`` and longitude ``lon`` (degrees, north and east positive), one a
    day at most. Needs ``ephem`` (``pip install 'beatless[solar]'``): without it, making
    one is a :class:`~beatless.errors.ConfigError` naming the extra."""

    event: str
    lat: float
    lon: float

    def __post_init__(self) -> None:
        if self.event not in EVENTS:
            raise ConfigError(
                f"solar: unknown event {self.event!r}; use one of {', '.join(EVENTS)}"
            )
        for name, value, bound in (("latitude", self.lat, 90), ("longitude", self.lon, 180)):
            if not _degrees(value, bound):
                raise ConfigError(
                    f"solar {self.event}: {name} must be a number of degrees from {-bound} "
                    f"to {bound}, got {value!r}"
                )
        object.__setattr__(self, "lat", float(self.lat))
        object.__setattr__(self, "lon", float(self.lon))
        _ephem()  # a clear error now, rather than at the first occurrence

    @property
    def _day_start_ms(self) -> int:
        """Where a day of this event starts, in UTC epoch ms after midnight UTC of that
        date: local midnight of the longitude, moved by the event's day start."""
        return _DAY_STARTS_MS[EVENTS[self.event][0]] - round(self.lon * 240_000)

    def day_of(self, instant_ms: int) -> int:
        """The local solar date (days since 1970-01-01) whose day holds ``instant_ms``."""
        return (instant_ms - self._day_start_ms) // DAY_MS

    def key(self, occurrence_ms: int) -> str:
        """What the firing id of an occurrence is derived from instead of its instant:
        ``sunrise/2026-06-21`` (the event and its local solar date)."""
        day = EPOCH.date() + timedelta(days=self.day_of(occurrence_ms))
        return f"{self.event}/{day.isoformat()}"

    def on_day(self, day: int) -> int | None:
        """The event's instant (epoch ms) on the local solar date ``day``, or ``None``
        when the sun does not reach its horizon that day."""
        ephem = _ephem()
        method, horizon, use_center = EVENTS[self.event]
        start = day * DAY_MS + self._day_start_ms
        observer = ephem.Observer()
        observer.lat, observer.lon = str(self.lat), str(self.lon)
        observer.elevation, observer.pressure, observer.horizon = 0, 0, horizon
        options = {"use_center": True} if use_center else {}
        try:
            found = getattr(observer, method)(
                ephem.Sun(), start=ephem.Date(start / DAY_MS + _EPHEM_UNIX_DAYS), **options
            )
        except ephem.CircumpolarError:
            return None
        instant = round((float(found) - _EPHEM_UNIX_DAYS) * DAY_MS)
        return instant if instant < start + DAY_MS else None

    def after(self, instant_ms: int) -> Iterator[int]:
        day = self.day_of(instant_ms)
        last_found = day
        while day - last_found <= SEARCH_DAYS:
            found = self.on_day(day)
            if found is not None and found > instant_ms:
                last_found = day
                yield found
            day += 1

    def min_gap_ms(self) -> int:
        return MIN_GAP_MS

    def describe(self) -> str:
        return f"solar {self.event} at {self.lat:g}, {self.lon:g}"
