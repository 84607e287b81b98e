"""What a change of live entries would do to the firings, worked out before it is made.

:func:`make_plan` compares, over a window from the fence, the occurrences of the live
entries now with those of the entries asked for. Offline and deterministic: it reads
nothing but the two sets of entries and the instants it is given, writes nothing, and
gives the same plan on every machine. By the rules of issue 24, occurrences at or after
the fence run under the new definition and those before it under the old one, so only
occurrences from the fence on are compared:

* **added**: occurrences of the new definition that the old one did not have;
* **removed**: occurrences of the old definition that the new one does not have (a
  deleted entry's, or those a new trigger drops);
* **moved**: an entry whose trigger changed, its removed and added occurrences paired in
  order (``old → new``), the rest left as added or removed;
* **changed**: entries whose occurrences stay (same firing ids, claimed once) but whose
  task, args, kwargs or options change at the fence;
* **straddling**: occurrences just before the fence whose release (occurrence + offset,
  the entry's jitter) falls at or after it: they run under the old definition (rule 3);
* **dst**: for each cron entry put, the UTC-offset changes of its zone in the window that
  skip or repeat a wall time it matches, and what runs then
  (:class:`~beatless.core._dst.DstNote`).

A plan names the revision it was made against, so :meth:`beatless.live.Live.apply`
refuses it (:class:`~beatless.errors.StaleRevision`) once another change came first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from beatless.core._dst import DstNote, dst_notes
from beatless.core.triggers import Cron, occurrence_key
from beatless.live.codec import entry_from_json
from beatless.live.revisions import Change, State, diff
from beatless.schedule.entry import Entry, address_segment, canonical, tenant_address
from beatless.schedule.firing import offset_ms

LIMIT = 10_000
"""The most occurrences of one entry a plan looks at, so that an every-second entry over
a week stays cheap; a plan that reached it says so (``truncated``)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The effect of making the live entries equal to a set of entries."""

    namespace: str
    base_revision: int
    changes: tuple[Change, ...]
    start_ms: int
    fence_ms: int
    end_ms: int
    added: tuple[tuple[str, int], ...] = ()
    removed: tuple[tuple[str, int], ...] = ()
    moved: tuple[tuple[str, int, int], ...] = ()
    changed: tuple[str, ...] = ()
    straddling: tuple[tuple[str, int, int], ...] = ()
    """``(name, occurrence_ms, release_ms)``."""
    truncated: tuple[str, ...] = field(default=())
    dst: tuple[tuple[str, DstNote], ...] = ()
    """``(name, note)``: wall times of a cron entry put that DST skips or repeats."""

    @property
    def is_empty(self) -> bool:
        return not self.changes

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "base_revision": self.base_revision,
            "changes": [c.to_json() for c in self.changes],
            "start_ms": self.start_ms,
            "fence_ms": self.fence_ms,
            "end_ms": self.end_ms,
            "added": [list(a) for a in self.added],
            "removed": [list(r) for r in self.removed],
            "moved": [list(m) for m in self.moved],
            "changed": list(self.changed),
            "straddling": [list(s) for s in self.straddling],
            "truncated": list(self.truncated),
            "dst": [{"name": name, **note.to_json()} for name, note in self.dst],
        }


def make_plan(
    namespace: str,
    base_revision: int,
    current: State,
    target: State,
    *,
    start_ms: int,
    fence_ms: int,
    end_ms: int,
    timezone: str = "UTC",
) -> Plan:
    """The plan of changing ``current`` into ``target`` with a fence at ``fence_ms``,
    over ``[fence_ms, end_ms)`` (and the straddling occurrences before it)."""
    changes = tuple(diff(current, target))
    added: list[tuple[str, int]] = []
    removed: list[tuple[str, int]] = []
    moved: list[tuple[str, int, int]] = []
    changed: list[str] = []
    straddling: list[tuple[str, int, int]] = []
    truncated: list[str] = []
    dst: list[tuple[str, DstNote]] = []
    for change in changes:
        old = _entry(current.get(change.name), timezone)
        new = _entry(change.entry, timezone)
        before = _occurrences(old, fence_ms - 1, end_ms, truncated)
        after = _occurrences(new, fence_ms - 1, end_ms, truncated)
        gone = [o for o in before if o not in set(after)]
        came = [o for o in after if o not in set(before)]
        pairs = min(len(gone), len(came)) if old is not None and new is not None else 0
        moved += [(change.name, a, b) for a, b in zip(gone[:pairs], came[:pairs], strict=True)]
        removed += [(change.name, o) for o in gone[pairs:]]
        added += [(change.name, o) for o in came[pairs:]]
        if old is not None and new is not None and not gone and not came:
            changed.append(change.name)
        if old is not None:
            straddling += _straddling(namespace, old, start_ms, fence_ms)
        if new is not None and isinstance(new.trigger, Cron):
            dst += [(change.name, note) for note in dst_notes(new.trigger, fence_ms, end_ms)]
    return Plan(
        namespace=namespace,
        base_revision=base_revision,
        changes=changes,
        start_ms=start_ms,
        fence_ms=fence_ms,
        end_ms=end_ms,
        added=tuple(added),
        removed=tuple(removed),
        moved=tuple(moved),
        changed=tuple(changed),
        straddling=tuple(straddling),
        truncated=tuple(dict.fromkeys(truncated)),
        dst=tuple(dst),
    )


def _entry(data: Mapping[str, Any] | None, timezone: str) -> Entry | None:
    if data is None:
        return None
    entry = entry_from_json(data)
    trigger = entry.trigger
    bind = getattr(trigger, "bind", None)
    return entry.replace(trigger=bind(timezone)) if bind is not None else entry


def _occurrences(
    entry: Entry | None, after_ms: int, end_ms: int, truncated: list[str]
) -> list[int]:
    if entry is None or not entry.enabled:
        return []
    found: list[int] = []
    for occurrence in entry.windowed.after(after_ms):
        if occurrence >= end_ms:
            break
        if len(found) == LIMIT:
            truncated.append(entry.name)
            break
        found.append(occurrence)
    return found


def _straddling(
    namespace: str, entry: Entry, start_ms: int, fence_ms: int
) -> Iterator[tuple[str, int, int]]:
    """Occurrences before the fence (and after ``start_ms - jitter``) released at or after it."""
    window = entry.jitter_ms
    if not window or not entry.enabled:
        return
    base = f"{namespace}/{address_segment(entry.name)}"
    addresses = (
        [base]
        if entry.tenants is None
        else [tenant_address(base, t) for t in entry.tenant_list() or ()]
    )
    for occurrence in entry.windowed.after(min(start_ms, fence_ms) - window - 1):
        if occurrence >= fence_ms:
            break
        for address in addresses:
            key = occurrence_key(entry.trigger, occurrence)
            release = occurrence + offset_ms(address, key, window)
            if release >= fence_ms:
                yield entry.name, occurrence, release


def same(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    return canonical(a) == canonical(b)
