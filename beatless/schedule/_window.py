"""What an entry's window and ``enabled`` leave out, said in words for ``next``, ``explain``
and the status: the window holds ``start_at`` and ends before ``end_at``
(:attr:`Entry.windowed <beatless.schedule.entry.Entry.windowed>`); a disabled entry is known
but schedules nothing."""

from __future__ import annotations

from beatless.core._time import from_datetime, iso
from beatless.core.triggers import At
from beatless.schedule.entry import Entry


def unscheduled(entry: Entry, occurrence_ms: int) -> str | None:
    """Why an occurrence of the entry's trigger is not scheduled (``None``: it is): the
    entry is disabled, or the occurrence is before its window starts or at or after its
    end."""
    if not entry.enabled:
        return "the entry is disabled: it schedules nothing"
    if entry.start_at is not None and occurrence_ms < from_datetime(entry.start_at):
        return f"before the entry's window starts at {iso(from_datetime(entry.start_at))}"
    if entry.end_at is not None and occurrence_ms >= from_datetime(entry.end_at):
        return f"at or after the end of the entry's window, {iso(from_datetime(entry.end_at))}"
    return None


def silence(entry: Entry, after_ms: int) -> str | None:
    """Why the entry has no occurrence after ``after_ms`` (``None``: it has one): it is
    disabled, its window ended, or its one-off is past or outside its window."""
    if not entry.enabled:
        return "disabled: known, but it schedules nothing"
    if next(entry.windowed.after(after_ms), None) is not None:
        return None
    end = None if entry.end_at is None else from_datetime(entry.end_at)
    if end is not None and end <= after_ms + 1:
        return f"window ended at {iso(end)}: no occurrence after it"
    if isinstance(entry.trigger, At):
        return _one_off(entry, entry.trigger.instant_ms, after_ms)
    if end is not None:
        return f"no occurrence before its window ends at {iso(end)}"
    return "no occurrence to come"


def _one_off(entry: Entry, instant: int, after_ms: int) -> str:
    """Why a one-off has no occurrence after ``after_ms``: past, or outside its window."""
    if instant > after_ms:
        return f"one-off at {iso(instant)}: {unscheduled(entry, instant)}"
    until = instant + entry.max_late_ms
    if after_ms < until:
        return (
            f"one-off at {iso(instant)}: past; sent once, by the node that claims it before "
            f"{iso(until)} (max_late), then never again"
        )
    return f"one-off at {iso(instant)}: past max_late; never fired again"
