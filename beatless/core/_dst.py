"""DST notes: what a cron trigger does at each UTC-offset change of its zone in a window.

At a change, wall times are skipped (a gap: clocks go forward) or shown twice (a repeat:
clocks go back). The trigger's DST rule (:mod:`beatless.core.triggers`) decides what
runs: a fixed-time expression runs a skipped wall time once at the first whole minute
after the gap and a repeated one once, at the first pass; a real-time expression
(``*`` or ``*/n`` in the minute or hour, or six fields) follows real time, so a skipped
wall time does not run and a repeated one runs at both passes. :func:`dst_notes` reports,
for each change in a window where the expression matches an affected wall time, those
wall times and the instants the trigger itself gives them: it reads the trigger's own
occurrences, so a note says what nodes will do, not a second copy of the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import takewhile
from typing import Any

from beatless.core._time import iso, next_change_s, offset_s
from beatless.core.triggers import Cron

_NAIVE_EPOCH = datetime(1970, 1, 1)  # wall times are naive on purpose
GAP = "gap"
REPEAT = "repeat"


@dataclass(frozen=True, slots=True)
class DstNote:
    """Wall times a cron matches that a UTC-offset change skips (``gap``) or repeats."""

    kind: str
    zone: str
    change_ms: int
    """The instant of the change."""
    walls: tuple[str, ...]
    """The affected wall times the expression matches, local ISO (no offset)."""
    runs: tuple[int, ...]
    """The occurrences the trigger gives them (epoch ms): none for a skipped wall time of
    a real-time expression, one at the gap's end or the first pass for a fixed-time one,
    both passes of each repeated wall time for a real-time one."""
    fixed_time: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "zone": self.zone,
            "change": iso(self.change_ms),
            "walls": list(self.walls),
            "runs": [iso(ms) for ms in self.runs],
            "fixed_time": self.fixed_time,
        }

    def text(self) -> str:
        """One line: what the change does to the wall times and what runs."""
        walls = self.walls[0] if len(self.walls) == 1 else f"{len(self.walls)} wall times "
        walls += "" if len(self.walls) == 1 else f"{self.walls[0]} to {self.walls[-1]}"
        if self.kind == GAP:
            what = f"{walls} do{'es' if len(self.walls) == 1 else ''} not exist in {self.zone}"
            what += f" (clocks go forward at {iso(self.change_ms)})"
            if not self.runs:
                return f"{what}: not run (the expression follows real time)"
            return f"{what}: runs once, at {iso(self.runs[0])}"
        what = f"{walls} happen{'s' if len(self.walls) == 1 else ''} twice in {self.zone}"
        what += f" (clocks go back at {iso(self.change_ms)})"
        if self.fixed_time:
            return f"{what}: runs once, at the first pass, {', '.join(iso(r) for r in self.runs)}"
        return f"{what}: runs at both passes ({len(self.runs)} occurrences)"


def dst_notes(cron: Cron, start_ms: int, end_ms: int) -> list[DstNote]:
    """A note for each UTC-offset change of the cron's zone in ``(start_ms, end_ms]`` that
    skips or repeats a wall time the expression matches."""
    tz = cron.zone
    notes = []
    at, end_s = start_ms // 1000, end_ms // 1000
    while (change := next_change_s(tz, at, end_s)) is not None:
        note = _note(cron, change, offset_s(tz, change - 1), offset_s(tz, change))
        if note is not None:
            notes.append(note)
        at = change
    return notes


def _note(cron: Cron, change: int, before: int, after: int) -> DstNote | None:
    """The note of one change (epoch seconds) from offset ``before`` to ``after``."""
    lo, hi = change + min(before, after), change + max(before, after)  # wall seconds
    walls = list(takewhile(lambda wall: wall < hi, cron.pattern.walls(lo - 1)))
    if not walls:
        return None
    fixed = not cron.pattern.real_time
    runs: tuple[int, ...]
    if after > before:  # a gap: the walls have no instant
        kind = GAP
        runs = (next(iter(cron.after(change * 1000 - 1))),) if fixed else ()
    else:
        kind = REPEAT
        passes = {(wall - offset) * 1000 for wall in walls for offset in (before, after)}
        found = takewhile(lambda ms: ms < (change + hi - lo) * 1000, cron.after(min(passes) - 1))
        runs = tuple(ms for ms in found if ms in passes)
    return DstNote(
        kind=kind,
        zone=cron.tz or "UTC",
        change_ms=change * 1000,
        walls=tuple(_wall_text(wall, cron.pattern.has_seconds) for wall in walls),
        runs=runs,
        fixed_time=fixed,
    )


def _wall_text(wall: int, seconds: bool) -> str:
    return (_NAIVE_EPOCH + timedelta(seconds=wall)).isoformat(
        timespec="seconds" if seconds else "minutes"
    )
