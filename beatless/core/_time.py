"""Instants and zone offsets: epoch milliseconds, aware datetimes, UTC-offset changes.

Instants are integer Unix epoch milliseconds (or whole seconds, where a cron works in
seconds) and aware UTC datetimes; naive datetimes are refused.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from beatless.errors import ConfigError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
OFFSETS_KEPT = 4_096
"""Instants whose UTC offset :func:`offset_s` keeps, per zone."""
CHANGES_KEPT = 8_192
"""Searches for a change of UTC offset whose answer :func:`next_change_s` keeps."""
SAMPLE_S = 86_400
"""Offsets are sampled this often to find their changes. In the tz database two changes
of a zone's UTC offset are always more than three days apart, so no change is missed."""
_SECOND = timedelta(seconds=1)


def to_datetime(ms: int) -> datetime:
    """An aware UTC datetime for integer epoch milliseconds."""
    return EPOCH + timedelta(milliseconds=ms)


def from_datetime(instant: datetime) -> int:
    """Integer epoch milliseconds for an aware datetime; naive datetimes are refused."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"naive datetime {instant.isoformat()}: give an aware instant")
    delta = instant - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000 + delta.microseconds // 1_000


InstantLike = datetime | int | str
"""An instant as users give it: an aware datetime, integer epoch milliseconds, or ISO 8601
text with a ``Z`` or a UTC offset."""


def as_instant(value: object, *, name: str = "instant") -> int:
    """Integer epoch milliseconds of an instant (:data:`InstantLike`), rounded down; see
    :func:`as_datetime` for what is refused."""
    return from_datetime(as_datetime(value, name=name))


def as_datetime(value: object, *, name: str = "instant") -> datetime:
    """An instant (:data:`InstantLike`) as an aware datetime, exactly as given; a naive
    datetime, text without an offset or anything else is a :class:`ConfigError` naming
    ``name``: every node must read the same instant, whatever its own zone."""
    given = value
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConfigError(
                f"{name}: cannot read {given!r} as an ISO 8601 instant (e.g. 2026-11-29T02:00:00Z)"
            ) from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            shown = repr(given) if isinstance(given, str) else value.isoformat()
            raise ConfigError(
                f"{name}: {shown} has no UTC offset; add 'Z' or '+01:00' (or give an aware "
                f"datetime) so every node reads the same instant"
            )
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return to_datetime(value)
        except OverflowError:
            raise ConfigError(f"{name}: {value} epoch milliseconds is out of range") from None
    raise ConfigError(
        f"{name}: expected an aware datetime, epoch milliseconds or ISO 8601 text, got "
        f"{type(value).__name__} {value!r:.60}"
    )


@lru_cache(maxsize=4_096)
def iso(ms: int) -> str:
    """UTC ISO 8601 with milliseconds and a ``Z``: ``2026-11-29T02:00:00.000Z``. Kept for
    a while: the firings of one occurrence (a burst, a fan-out) ask it of one instant."""
    return to_datetime(ms).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1_000:03d}Z"


@lru_cache(maxsize=OFFSETS_KEPT)
def offset_s(tz: ZoneInfo, instant_s: int) -> int:
    """The UTC offset of ``tz`` at an instant (epoch seconds), in whole seconds. Kept
    for a while: a node asks it of the same few instants for each of its crons."""
    try:
        moment = datetime.fromtimestamp(instant_s, tz)
    except (OverflowError, OSError, ValueError):  # outside the platform's time_t
        moment = (EPOCH + timedelta(seconds=instant_s)).astimezone(tz)
    offset = moment.utcoffset()
    return 0 if offset is None else offset // _SECOND


def next_change_s(tz: ZoneInfo, after_s: int, until_s: int) -> int | None:
    """The first second in ``(after_s, until_s]`` whose UTC offset differs from
    ``after_s``'s, or None when the offset holds over the whole span.

    What a search found is kept for the next that starts at the same instant in the same
    zone, whatever its end: a node's crons all start from one instant, and a monthly one
    looks a month ahead where an hourly one looks a day."""
    key = (tz, after_s)
    scanned, change = _changes.get(key, (after_s, None))
    if change is not None or until_s <= scanned:
        return change if change is not None and change <= until_s else None
    before, lo = offset_s(tz, after_s), scanned
    while lo < until_s:
        hi = min(lo + SAMPLE_S, until_s)
        if offset_s(tz, hi) != before:
            change = _bisect_change(tz, lo, hi, before)
            break
        lo = hi
    if len(_changes) >= CHANGES_KEPT:
        _changes.clear()
    _changes[key] = (until_s, change)
    return change


_changes: dict[tuple[ZoneInfo, int], tuple[int, int | None]] = {}
"""Per zone and start of a search: how far it looked, and the change it found there."""


def _bisect_change(tz: ZoneInfo, lo: int, hi: int, before: int) -> int:
    """The first second in ``(lo, hi]`` whose offset differs from ``before`` (``hi``'s does)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offset_s(tz, mid) == before:
            lo = mid
        else:
            hi = mid
    return hi
