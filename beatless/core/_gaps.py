"""The shortest gap between consecutive occurrences of a cron trigger.

Rule 6 needs it at start-up for every cron entry with a jitter, so it must take
milliseconds, not the seconds a year of ``* * * * *`` takes to iterate. The horizon
``(start, start + horizon]`` is cut into pieces on the real (UTC) time line:

- **calm pieces**, where the zone's UTC offset is constant. There the occurrences are
  the matching local days × the time-of-day set, so the gaps are computed from the day
  pattern: the shortest gap inside a day, and between consecutive matching days
  ``days apart × 24h + first time − last time``.
- **transition windows**, a few hours either side of each UTC-offset change. There the
  occurrences are simulated with the trigger itself, so the DST rule (a skipped fixed
  time runs at the transition, a repeated one runs once, ``*`` fields follow real time)
  gives exactly the gaps the loop will see.

The answer is the smallest gap between consecutive occurrences inside the horizon,
including the gaps across piece boundaries; with fewer than two occurrences in the
horizon it is the horizon itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from zoneinfo import ZoneInfo

from beatless.core._cron import CronPattern, Days
from beatless.core._time import next_change_s, offset_s

SECOND_MS = 1_000
HOUR_MS = 3_600_000
DAY_S = 86_400
DAY_MS = DAY_S * SECOND_MS
YEAR_MS = 366 * DAY_MS
FIXED_TIME_MARGIN_MS = HOUR_MS
"""How far beyond the shifted wall-clock span a window reaches for fixed-time expressions."""
REAL_TIME_MARGIN_MS = 10 * 60_000
"""How far either side of a transition a window reaches for expressions in real time."""
PIECES_KEPT = 256
"""Horizons (zone, start, end) whose cutting into pieces is kept."""
DAYS_KEPT = 16_384
"""Day patterns whose matching days over a piece are kept (many crons share them)."""


def min_gap_ms(
    cron: CronPattern, tz: ZoneInfo, start_ms: int | None = None, *, horizon_ms: int = YEAR_MS
) -> int:
    """The shortest gap between consecutive occurrences in ``(start, start + horizon]``.

    ``start_ms`` defaults to now. Returns ``horizon_ms`` when fewer than two occurrences
    fall inside the horizon.
    """
    start = int(time.time() * 1000) if start_ms is None else start_ms
    end = start + horizon_ms
    pattern = _DayPattern.of(cron)
    pieces = _pieces(tz, start, end, real_time=cron.real_time)
    calm = {
        i: pattern.run(lo, hi, off) for i, (lo, hi, off) in enumerate(pieces) if off is not None
    }
    best = min((r.gap for r in calm.values() if r and r.gap is not None), default=None)
    if best is not None and best <= _floor_ms(cron, pieces):
        return best
    runs = [
        calm[i] if i in calm else _simulated(pattern, tz, lo, hi)
        for i, (lo, hi, _) in enumerate(pieces)
    ]
    gap = _combine(runs)
    return horizon_ms if gap is None else gap


@dataclass(frozen=True, slots=True)
class _Run:
    """The occurrences of one piece: the first, the last and the shortest gap between them."""

    first: int
    last: int
    gap: int | None


def _combine(runs: Sequence[_Run | None]) -> int | None:
    """The shortest gap over consecutive pieces, counting the gaps across their boundaries."""
    gaps: list[int] = []
    last: int | None = None
    for run in runs:
        if run is None:
            continue
        if run.gap is not None:
            gaps.append(run.gap)
        if last is not None:
            gaps.append(run.first - last)
        last = run.last
    return min(gaps, default=None)


def floor_ms(
    cron: CronPattern, tz: ZoneInfo, start_ms: int | None = None, *, horizon_ms: int = YEAR_MS
) -> int:
    """A gap that no two consecutive occurrences in ``(start, start + horizon]`` are
    closer than, known without looking for the shortest (see :func:`min_gap_ms`, which
    is never below it)."""
    start = int(time.time() * 1000) if start_ms is None else start_ms
    return _floor_ms(cron, _pieces(tz, start, start + horizon_ms, real_time=cron.real_time))


def _floor_ms(cron: CronPattern, pieces: Sequence[tuple[int, int, int | None]]) -> int:
    """No gap can be shorter: 1 s, or 1 min for five fields in whole-minute offsets."""
    whole_minutes = all(off is None or off % 60_000 == 0 for _, _, off in pieces)
    return 60_000 if not cron.has_seconds and whole_minutes else SECOND_MS


def _simulated(pattern: _DayPattern, tz: ZoneInfo, lo: int, hi: int) -> _Run | None:
    """The occurrences in ``(lo, hi]`` as the trigger produces them."""
    if _no_wall_time(pattern, tz, lo, hi):
        return None
    cron = pattern.cron
    first = last = None
    gap: int | None = None
    for occurrence in cron.occurrences(lo, tz, hi):
        if occurrence > hi:
            break
        if last is not None:
            step = occurrence - last
            gap = step if gap is None else min(gap, step)
        else:
            first = occurrence
        last = occurrence
    if first is None or last is None:
        return None
    return _Run(first, last, gap)


def _no_wall_time(pattern: _DayPattern, tz: ZoneInfo, lo: int, hi: int) -> bool:
    """Whether a window ``(lo, hi]`` with one change of UTC offset surely has no
    occurrence: no time of a matching day falls where the wall clock stands at an instant
    of the window, with the offset before the change or after it. (A wall time skipped by
    the change, which a fixed-time cron runs after the gap, is between the two.) Most
    crons have none in the small hours of a change, and need no simulation there."""
    walls = _window_walls(tz, lo, hi)
    if walls is None:
        return False
    first, last = walls
    for day in _matching_days(pattern.cron.days, first // DAY_S, last // DAY_S)[0]:
        midnight = day * DAY_S
        lo_s, hi_s = max(0, first - midnight), min(DAY_S - 1, last - midnight)
        if next(pattern.times(lo_s, hi_s), None) is not None:
            return False
    return True


@lru_cache(maxsize=PIECES_KEPT)
def _window_walls(tz: ZoneInfo, lo: int, hi: int) -> tuple[int, int] | None:
    """The wall times (in seconds) that instants of ``(lo, hi]`` may show, when it holds
    one change of UTC offset (None otherwise)."""
    lo_s, hi_s = lo // SECOND_MS, -(-hi // SECOND_MS)
    change = next_change_s(tz, lo_s, hi_s)
    if change is None or next_change_s(tz, change, hi_s) is not None:
        return None
    offsets = offset_s(tz, lo_s), offset_s(tz, change)
    return lo_s + min(offsets), hi_s + max(offsets)


@lru_cache(maxsize=PIECES_KEPT)
def _pieces(
    tz: ZoneInfo, start: int, end: int, *, real_time: bool
) -> tuple[tuple[int, int, int | None], ...]:
    """``(lo, hi, offset)`` pieces covering ``(start, end]``; ``offset`` None for a window.

    In real time the occurrences change pattern at the transition itself; a fixed-time
    expression runs its skipped or repeated wall times within the shift either side.
    Kept for the next cron in the same zone over the same horizon.
    """
    windows: list[list[int]] = []
    for moment, shift in _transitions(tz, start, end):
        reach = REAL_TIME_MARGIN_MS if real_time else shift + FIXED_TIME_MARGIN_MS
        lo, hi = max(start, moment - reach), min(end, moment + reach)
        if windows and lo <= windows[-1][1]:
            windows[-1][1] = hi
        else:
            windows.append([lo, hi])
    pieces: list[tuple[int, int, int | None]] = []
    cursor = start
    for lo, hi in windows:
        if lo > cursor:
            pieces.append((cursor, lo, _offset_ms(tz, lo)))
        pieces.append((lo, hi, None))
        cursor = hi
    if end > cursor:
        pieces.append((cursor, end, _offset_ms(tz, end)))
    return tuple(pieces)


def _transitions(tz: ZoneInfo, start: int, end: int) -> Iterator[tuple[int, int]]:
    """Each UTC-offset change in ``(start, end]``: its instant and the size of the shift."""
    at, end_s = start // SECOND_MS, end // SECOND_MS
    while (change := next_change_s(tz, at, end_s)) is not None:
        yield change * SECOND_MS, abs(offset_s(tz, change) - offset_s(tz, at)) * SECOND_MS
        at = change


def _offset_ms(tz: ZoneInfo, instant_ms: int) -> int:
    return offset_s(tz, instant_ms // SECOND_MS) * SECOND_MS


class _DayPattern:
    """The parsed fields of a cron: which local days match and the time-of-day set, with
    the first and last time of a day and the shortest gap within one."""

    __slots__ = ("cron", "day_gap_ms", "first", "hours", "last", "minutes", "seconds")

    def __init__(self, cron: CronPattern) -> None:
        self.cron = cron
        self.hours, self.minutes, self.seconds = cron.hours, cron.minutes, cron.seconds
        self.first = self.hours[0] * 3600 + self.minutes[0] * 60 + self.seconds[0]
        """The first time of a day, in seconds after its midnight."""
        self.last = self.hours[-1] * 3600 + self.minutes[-1] * 60 + self.seconds[-1]
        gap = self.day_gap()
        self.day_gap_ms = None if gap is None else gap * SECOND_MS

    @classmethod
    def of(cls, cron: CronPattern) -> _DayPattern:
        return cls(cron)

    def day_gap(self) -> int | None:
        """The shortest gap between two times of one day, in seconds (None for one time)."""
        gaps = []
        if len(self.seconds) > 1:
            gaps.append(_min_step(self.seconds))
        if len(self.minutes) > 1:
            gaps.append(60 * _min_step(self.minutes) + self.seconds[0] - self.seconds[-1])
        if len(self.hours) > 1:
            wrap = self.minutes[0] * 60 + self.seconds[0] - self.minutes[-1] * 60
            gaps.append(3600 * _min_step(self.hours) + wrap - self.seconds[-1])
        return min(gaps, default=None)

    def times(self, lo: int, hi: int, *, reverse: bool = False) -> Iterator[int]:
        """The times of day in ``[lo, hi]`` seconds, ascending (or descending)."""
        order = reversed if reverse else iter
        for h in order(self.hours):
            if lo <= h * 3600 + 3599 and h * 3600 <= hi:
                for m in order(self.minutes):
                    base = h * 3600 + m * 60
                    if lo <= base + 59 and base <= hi:
                        yield from (base + s for s in order(self.seconds) if lo <= base + s <= hi)

    def run(self, lo: int, hi: int, offset: int) -> _Run | None:
        """The occurrences in ``(lo, hi]`` of a piece whose UTC offset is ``offset``."""
        return _CalmRun(self, lo + offset, hi + offset).collect(offset)


@lru_cache(maxsize=DAYS_KEPT)
def _matching_days(days: Days, first: int, last: int) -> tuple[tuple[int, ...], int | None]:
    """The days from ``first`` to ``last`` (days since 1970-01-01) that ``days`` matches,
    and the fewest days between two consecutive ones of them but the first and the last
    (None when fewer than two are left)."""
    found: list[int] = []
    for index in days.from_day(first):
        if index > last:
            break
        found.append(index)
    inner = found[1:-1]
    step = min((b - a for a, b in pairwise(inner)), default=None)
    return tuple(found), step


def _min_step(values: Sequence[int]) -> int:
    return min(b - a for a, b in pairwise(values))


class _CalmRun:
    """Walks the local days of a calm piece, wall-clock ``(lo, hi]`` in epoch ms."""

    def __init__(self, pattern: _DayPattern, lo: int, hi: int) -> None:
        self.pattern, self.lo, self.hi = pattern, lo, hi
        self.day_gap_ms = pattern.day_gap_ms
        self.first: int | None = None
        self.last: int | None = None
        self.gap: int | None = None

    def collect(self, offset: int) -> _Run | None:
        days, inner_step = _matching_days(
            self.pattern.cron.days, self.lo // DAY_MS, self.hi // DAY_MS
        )
        if not days:
            return None
        self._day(days[0] * DAY_MS)
        if len(days) > 2:
            self._whole_days(days[1], days[-2], inner_step)
        if len(days) > 1:
            self._day(days[-1] * DAY_MS)
        if self.first is None or self.last is None:
            return None
        return _Run(self.first - offset, self.last - offset, self.gap)

    def _whole_days(self, first_day: int, last_day: int, step: int | None) -> None:
        """Add the matching days from ``first_day`` to ``last_day``, each inside the piece
        from its midnight to its end, consecutive ones at least ``step`` days apart (None:
        one day): as :meth:`_day` for each, in one step."""
        pattern = self.pattern
        gap = self.day_gap_ms
        if step is not None:
            across = step * DAY_MS + (pattern.first - pattern.last) * SECOND_MS
            gap = across if gap is None else min(gap, across)
        self._add(first_day * DAY_MS, pattern.first, pattern.first, gap)
        self.last = last_day * DAY_MS + pattern.last * SECOND_MS

    def _day(self, midnight: int) -> None:
        """Add one matching day: its times inside the piece, in whole seconds."""
        lo_s = max(0, -(-(self.lo + 1 - midnight) // SECOND_MS))
        hi_s = min(86_399, (self.hi - midnight) // SECOND_MS)
        pattern = self.pattern
        if lo_s <= pattern.first and pattern.last <= hi_s:
            self._add(midnight, pattern.first, pattern.last, self.day_gap_ms)
            return
        first = next(pattern.times(lo_s, hi_s), None)
        last = next(pattern.times(lo_s, hi_s, reverse=True), None)
        if first is not None and last is not None:
            self._add(midnight, first, last, self._partial_gap(lo_s, hi_s))

    def _partial_gap(self, lo_s: int, hi_s: int) -> int | None:
        """The shortest gap inside part of a day; stops early at the whole-day shortest."""
        best: int | None = None
        prev = None
        for moment in self.pattern.times(lo_s, hi_s):
            if prev is not None:
                step = (moment - prev) * SECOND_MS
                best = step if best is None else min(best, step)
                if best == self.day_gap_ms:
                    break
            prev = moment
        return best

    def _add(self, midnight: int, first_s: int, last_s: int, gap: int | None) -> None:
        """Extend the run by one day's occurrences, ``first_s``..``last_s`` after midnight."""
        first, last = midnight + first_s * SECOND_MS, midnight + last_s * SECOND_MS
        candidates = [g for g in (gap, self.gap) if g is not None]
        if self.last is not None:
            candidates.append(first - self.last)
        self.gap = min(candidates, default=None)
        self.first = first if self.first is None else self.first
        self.last = last
