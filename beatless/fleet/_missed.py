"""Missed firings: which occurrences of the last hour nobody sent in time, read from the
history the nodes keep, and the sweep by which one node in the fleet counts each.

A missed firing is found from the history (:func:`missed_occurrences`); the sweep
(:func:`sweep_missed`) claims each once more under a marker id of its own, so one node
counts, logs and records it. The status report reads the same to show the missed count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from beatless.core.triggers import Trigger, occurrence_key
from beatless.errors import StoreError
from beatless.fleet._notes import (
    SYNC_EVERY_MS,
    TENANTS_PUBLISHED,
    HistoryItem,
    batch_items,
    entry_note,
    fan_out_history_kind,
    history_kind,
    read_history,
    strongest,
    trigger_of,
    windowed_of,
)
from beatless.fleet._schema import Skipped
from beatless.schedule.entry import Schedule, base_address, tenant_address
from beatless.schedule.firing import Firing, firing_id, missed_id
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import (
    NEVER_LATE_MS,
    TOLERANCE_MS,
    ClaimRequest,
    ClaimStore,
    Outcome,
)

HOUR_MS = 3_600_000
TENANTS_SHOWN = TENANTS_PUBLISHED
"""For a fan-out entry, the history of at most this many of its tenants is read."""
SWEEP_ENTRIES = 1_000
"""A node's missed-firing sweep reads the history of at most this many entries: a bigger
schedule is swept a part of this many at a time, the next part at the next sweep
(:func:`sweep_views`)."""
MARKER_MEMORY_MS = 2 * HOUR_MS
"""A missed marker outlives the hour over which missed firings are judged."""
MARKER_LEASE_MS = 30_000
SWEEP_CHUNK = 256
"""Markers claimed (and committed) per store call: after a long outage a sweep may find
thousands of missed firings, and one call for all of them could outlast the store's
timeout (RabbitMQ claims each marker on a queue of its own)."""


@dataclass(frozen=True, slots=True)
class EntryView:
    """An entry as the status sees it: from the schedule, or as the nodes published it."""

    name: str
    address: str
    describe: str
    trigger: Trigger | None
    jitter_ms: int
    max_late_ms: int
    tenants: tuple[str, ...] | None
    """The tenants whose history is read; ``None`` for an entry without fan-out."""
    fan_out: str | None
    """``None``, or how the fan-out is declared (``callable``, ``N tenants``)."""
    enabled: bool = True
    """``False``: the entry is known but schedules nothing (nothing of it is missed)."""

    def key(self, occurrence_ms: int) -> int | str:
        """What the firing id of an occurrence is derived from (its trigger's key)."""
        return (
            occurrence_ms if self.trigger is None else occurrence_key(self.trigger, occurrence_ms)
        )

    @classmethod
    def of(cls, note: Mapping[str, Any]) -> EntryView:
        tenants = note.get("tenants")
        listed = tuple(str(t) for t in tenants) if isinstance(tenants, list | tuple) else None
        return cls(
            name=str(note["entry"]),
            address=str(note["address"]),
            describe=str(note.get("describe", "")),
            trigger=windowed_of(trigger_of(note.get("trigger") or {}), note),
            jitter_ms=int(note.get("jitter_ms", 0)),
            max_late_ms=int(note.get("max_late_ms", 0)),
            tenants=None if tenants is None else (listed or ())[:TENANTS_SHOWN],
            fan_out=None
            if tenants is None
            else (
                "callable"
                if listed is None
                else f"{note.get('tenant_count') or len(listed)} tenants"
            ),
            enabled=note.get("enabled", True) is not False,
        )

    def addresses(self) -> list[tuple[str, str | None]]:
        if self.tenants is None:
            return [(self.address, None)]
        return [(tenant_address(self.address, t), t) for t in self.tenants]


def entry_views(schedule: Schedule) -> list[EntryView]:
    return [EntryView.of(entry_note(schedule, entry)) for entry in schedule.entries]


def sweep_views(schedule: Schedule, part: int) -> list[EntryView]:
    """The entries without fan-out a sweep reads, of ``schedule``: part ``part`` (taken
    round) of those cut in parts of ``SWEEP_ENTRIES``, in the schedule's order. Sweeps of
    parts 0, 1, 2 ... read every entry in turn."""
    plain = [entry for entry in schedule.entries if entry.tenants is None]
    parts = max(1, -(-len(plain) // SWEEP_ENTRIES))
    first = part % parts * SWEEP_ENTRIES
    return [EntryView.of(entry_note(schedule, e)) for e in plain[first : first + SWEEP_ENTRIES]]


def sweep_part(now_ms: int, every_ms: int, phase: int, node: str, peers: Set[str]) -> int:
    """The part (of :func:`sweep_views`) ``node`` sweeps at ``now_ms``, when it sweeps
    once in each period of ``every_ms`` placed on the clock by its ``phase``: in its
    period ``r``, part ``r × n + i``, ``n`` being the nodes of ``peers`` (the members
    running its schedule) with ``node``, and ``i`` its place among them by name.

    Each period the ``n`` nodes read ``n`` parts that follow each other, the next period
    the next ``n``: the fleet reads every part of a schedule of ``P`` parts within
    ``⌈P / n⌉ + 1`` periods, whatever the nodes' phases, while its members hold (a node
    that joins or leaves shifts the places, and a part may wait one turn more)."""
    ranked = sorted(peers | {node})
    period = (now_ms + phase % every_ms) // every_ms
    return period * len(ranked) + ranked.index(node)


def history_items(
    view: EntryView, history: Mapping[str, Mapping[str, str]], skipped: Skipped | None = None
) -> list[HistoryItem]:
    """The firings of ``view`` in the history, each once with its strongest outcome."""
    items = []
    for address, _ in view.addresses():
        items += read_history(address, history.get(history_kind(address), {}), skipped)
    return sorted(strongest(items), key=lambda i: (i.occurrence_ms, i.at_ms))


def missed_occurrences(
    view: EntryView, items: Sequence[HistoryItem], now_ms: int, counted: Set[int] = frozenset()
) -> list[int]:
    """The occurrences of the last hour with a firing nobody sent in time: those the nodes
    counted (``counted``, their missed-count notes, kept for the hour whatever the history
    still holds), those the history records missed, and those it should hold and does
    not (not counted yet)."""
    hour_ago = now_ms - HOUR_MS
    missed = {o for o in counted if hour_ago <= o <= now_ms}
    missed.update(
        i.occurrence_ms
        for i in items
        if i.outcome == DecisionOutcome.MISSED and i.occurrence_ms >= hour_ago
    )
    if view.trigger is None or view.fan_out or not items or not view.enabled:
        return sorted(missed)
    # Judged from the oldest item kept on (the history holds the latest of each address),
    # and only once an item decided without a commit has had a sync to be posted.
    settled = now_ms - (view.max_late_ms + view.jitter_ms + TOLERANCE_MS + 2 * SYNC_EVERY_MS)
    start = max(hour_ago, items[0].occurrence_ms)
    known = {i.id for i in items}
    spans = [i for i in items if i.coalesced is not None]
    for occurrence in view.trigger.after(start - 1):
        if occurrence > settled:
            break
        if firing_id(view.address, view.key(occurrence)) not in known and not any(
            i.covers(occurrence) for i in spans
        ):
            missed.add(occurrence)
    return sorted(missed)


def sweep_missed(
    store: ClaimStore,
    schedule: Schedule,
    node: str,
    now_ms: int,
    skipped: Skipped | None = None,
    *,
    part: int = 0,
) -> list[tuple[EntryView, list[int]]]:
    """The missed firings of ``schedule`` that this node is the first in the fleet to
    find: per entry of the part ``part`` of the schedule (:func:`sweep_views`), their
    occurrences.

    Each missed firing found in the history (:func:`missed_occurrences`, entries without fan-out)
    is claimed once more under a marker id of its own, never late and remembered
    ``MARKER_MEMORY_MS``: one node in the fleet wins each marker, and only that node
    counts, logs and records the firing missed. History notes that do not fit their
    schema are told to ``skipped``. Raises :class:`~beatless.errors.StoreError` when the
    store fails.
    """
    views = sweep_views(schedule, part)
    if not views:
        return []
    history = store.read_logs([history_kind(v.address) for v in views])
    found: list[tuple[EntryView, int]] = []
    for view in views:
        items = history_items(view, history, skipped)
        recorded = {i.occurrence_ms for i in items if i.outcome == DecisionOutcome.MISSED}
        fresh = [o for o in missed_occurrences(view, items, now_ms) if o not in recorded]
        found.extend((view, occurrence) for occurrence in fresh)
    if not found:
        return []
    requests = [
        ClaimRequest(
            id=missed_id(firing_id(view.address, view.key(occurrence))),
            address=view.address,
            occurrence_ms=occurrence,
            max_late_ms=NEVER_LATE_MS,
            memory_ms=MARKER_MEMORY_MS,
            release_ms=now_ms,
        )
        for view, occurrence in found
    ]
    outcomes = _claim_markers(store, requests, node)
    mine: dict[str, tuple[EntryView, list[int]]] = {}
    for (view, occurrence), outcome in zip(found, outcomes, strict=False):
        if outcome.is_won:
            mine.setdefault(view.name, (view, []))[1].append(occurrence)
    return list(mine.values())


def _claim_markers(store: ClaimStore, requests: Sequence[ClaimRequest], node: str) -> list[Outcome]:
    """Claim and commit the markers, :data:`SWEEP_CHUNK` per call; the outcomes of the
    chunks done. A store error in a later chunk ends the sweep with what the earlier ones
    won (the rest are found again at the next sweep); in the first, it is raised."""
    outcomes: list[Outcome] = []
    for start in range(0, len(requests), SWEEP_CHUNK):
        chunk = requests[start : start + SWEEP_CHUNK]
        try:
            said = store.claim(chunk, node=node, lease_ms=MARKER_LEASE_MS)
            won = [r.id for r, o in zip(chunk, said, strict=True) if o.is_won]
            if won:
                store.commit(won, node=node)
        except StoreError:
            if not outcomes:
                raise
            break
        outcomes.extend(said)
    return outcomes


def sent_in_history(store: ClaimStore, firings: Sequence[Firing]) -> set[str]:
    """The ids of ``firings`` that the history records sent (``won`` or ``takeover``, by
    any node): their addresses' history notes, and for a fan-out tenant its occurrence's
    batch notes, read in one call. Raises :class:`~beatless.errors.StoreError` when the
    store cannot be read."""
    batches = {
        firing.id: fan_out_history_kind(
            base_address(firing.address, firing.tenant), firing.occurrence_ms
        )
        for firing in firings
        if firing.tenant is not None
    }
    kinds = {history_kind(firing.address): None for firing in firings}
    notes = store.read_notes([*kinds, *dict.fromkeys(batches.values())])
    items: list[HistoryItem] = []
    for firing in firings:
        items += read_history(firing.address, notes.get(history_kind(firing.address), {}))
        if firing.tenant is not None:
            base = base_address(firing.address, firing.tenant)
            for text in notes.get(batches[firing.id], {}).values():
                items += batch_items(base, text, firing.tenant)
    wanted = {firing.id for firing in firings}
    return {i.id for i in items if i.id in wanted and i.outcome in DecisionOutcome.SENT}
