"""The history a node writes (:mod:`beatless.fleet._notes`): the part of its board that
turns decisions into notes.

A decision this node alone makes is kept as a history item and posted at the board's next
sync (:meth:`HistoryWriter.record`), or written with the store call that decided it (the
two-phase commit: :meth:`HistoryWriter.decision_notes`; a claim script:
:meth:`HistoryWriter.history_template`). The items of a fan-out's tenants that ``status``
does not show go into one batch note per occurrence and node; a ``missed`` firing is
counted in a missed-count note too, kept for the hour whatever the history keeps.

An address's history notes are *logged* (:attr:`~beatless.stores.base.Note.logged`: on
Redis one append to the address's log, instead of a hash field, its index and a sweep)
while every live node reads logs (:attr:`HistoryWriter.logs_history`); with a node of an
earlier beatless in the registry, which reads notes kept in place only, they are written
in place, as that node writes them, so that its status and its missed sweep see every
firing.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence

from beatless.fleet._controls import capped_ttl
from beatless.fleet._notes import (
    BATCH_ITEM_LIMIT,
    HISTORY_KEEP,
    HISTORY_TTL_MS,
    MIN_HISTORY_TTL_MS,
    MISSED_KEEP,
    MISSED_LIFE_MS,
    MISSED_PER_NOTE,
    TEMPLATE_AT,
    TEMPLATE_LATENESS,
    TEMPLATE_OUTCOME,
    TENANTS_PUBLISHED,
    BatchMember,
    HistoryItem,
    MissedRecord,
    NodeRecord,
    batch_chunks,
    batch_head,
    fan_out_history_kind,
    history_key,
    history_kind,
    item_start,
    missed_kind,
)
from beatless.node._view import LoopView
from beatless.schedule.entry import base_address
from beatless.schedule.firing import Decision, Firing
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import NOTE_VALUE_LIMIT, Note, NoteItem

# An Enum class's attribute is a slow look-up on Python 3.11 (EnumType.__getattr__): the
# path of every claim names these through module names.
_HISTORY, _SENT = DecisionOutcome.HISTORY, DecisionOutcome.SENT

HISTORY_BUFFER = 20_000
"""At most this many history items wait for a post; beyond, the oldest are dropped."""

_Group = tuple[str, str, int, "tuple[int, int] | None", str]
"""The firings of one batch note: the fan-out's address, entry, occurrence, what it
coalesced and the node."""


class HistoryWriter:
    """The history notes of the node of ``loop``, and those waiting for the next sync
    (the board's thread posts them: :meth:`take_pending`)."""

    def __init__(self, loop: LoopView) -> None:
        self.loop = loop
        self.store = loop.store
        self._lock = threading.Lock()
        """Guards what the loop and the board's thread share (the items waiting here, and
        the board's own)."""
        self._pending: deque[tuple[str, HistoryItem]] = deque(maxlen=HISTORY_BUFFER)
        """History items to post at the next sync, each with its address."""
        self._pending_missed: list[Note] = []
        """Missed-count notes to post at the next sync, with the history."""
        entries = loop.schedule.entries
        self._shown = {
            e.name: frozenset(e.tenants[:TENANTS_PUBLISHED])
            for e in entries
            if e.tenants is not None and not callable(e.tenants)
        }
        """The tenants of each fan-out that keep a history of their own (status shows them)."""
        self._batch_life = {
            e.name: min(HISTORY_TTL_MS, HISTORY_KEEP * max(e.trigger.min_gap_ms(), 1))
            for e in entries
            if e.tenants is not None
        }
        """How long after its occurrence a fan-out's batch notes live: its last
        ``HISTORY_KEEP`` occurrences, at most ``HISTORY_TTL_MS``."""
        self._templates: dict[tuple[str, int, tuple[int, int] | None], Note] = {}
        self.logs_history = False
        """Whether the history notes of addresses are logged: every live node reads logs
        (set from the registry, :meth:`fleet_reads_logs`; until it is read, in place)."""
        self._layout_read = False

    def fleet_reads_logs(self, registry: Sequence[NodeRecord], *, others_read: bool = True) -> bool:
        """Log the history from now on if every node of ``registry`` (the live nodes, this
        one among them) reads logs and ``others_read`` (no node outside it, of an earlier
        beatless, is known live); in place otherwise. Whether that is news: a change, or
        in place at the first registry read."""
        logs = bool(registry) and others_read and all(r.reads_logs for r in registry)
        news = logs != self.logs_history or (not logs and not self._layout_read)
        self.logs_history, self._layout_read = logs, True
        return news

    def record(self, decision: Decision, coalesced: tuple[int, int] | None = None) -> None:
        """Keep a decision for the history, if it is one this node writes."""
        outcome = decision.outcome
        if outcome in _HISTORY:
            item = self.history_item(decision, coalesced if outcome in _SENT else None)
            self.record_item(decision.firing.address, item)
        if outcome == "missed":
            # Counted for the hour as the sweep's finds are, whatever the history keeps.
            firing = decision.firing
            decided_ms = firing.release_ms + decision.lateness_ms
            notes = self.missed_notes(firing.address, [firing.occurrence_ms], decided_ms)
            with self._lock:
                self._pending_missed.extend(notes)

    def history_item(
        self, decision: Decision, coalesced: tuple[int, int] | None = None
    ) -> HistoryItem:
        """The history item of ``decision``, with the live revision its firing ran under
        (the loop's thread only: it reads the loop's live spans)."""
        firing = decision.firing
        revision = self.loop.live.revision_at(firing.entry, firing.occurrence_ms)
        return HistoryItem.of(decision, coalesced, revision)

    def record_item(self, address: str, item: HistoryItem) -> None:
        """Post ``item`` at the next sync."""
        with self._lock:
            self._pending.append((address, item))

    def batched(self, entry: str, tenant: str | None, manual: bool = False) -> bool:
        """Whether a firing's history goes into its occurrence's batch notes: a fan-out
        tenant that ``status`` does not show, in a scheduled (not manual) firing."""
        return (
            tenant is not None
            and not manual
            and tenant not in self._shown.get(entry, ())
            and len(tenant) <= BATCH_ITEM_LIMIT
        )

    def history_notes(self, items: Iterable[tuple[str, HistoryItem]]) -> list[Note]:
        """The notes of ``items`` (each with its address): a note each in its address's
        history, but one batch note per fan-out occurrence and node for the items of
        :meth:`batched` tenants (more when one would pass ``NOTE_VALUE_LIMIT``)."""
        notes: list[Note] = []
        groups: dict[_Group, list[BatchMember]] = {}
        for address, item in items:
            tenant = item.tenant
            if tenant is not None and self.batched(item.entry, tenant, item.manual):
                base = base_address(address, tenant)
                group = (base, item.entry, item.occurrence_ms, item.coalesced, item.node)
                member = (item.id, tenant, item.outcome, item.lateness_ms, item.at_ms)
                groups.setdefault(group, []).append(member)
            else:
                notes.append(self.history_note(address, item))
        notes.extend(self._batch_notes(groups))
        return notes

    def decision_notes(
        self, decided: Iterable[tuple[Firing, str, tuple[int, int] | None]], now_ms: int
    ) -> list[Note]:
        """The notes of this node's decisions ``decided`` at ``now_ms`` (each firing with
        its outcome and what it coalesced), as :meth:`history_notes` writes their items;
        the firing of a batch note is written into it without an item of its own."""
        node = self.loop.node
        notes: list[Note] = []
        groups: dict[_Group, list[BatchMember]] = {}
        for firing, outcome, coalesced in decided:
            tenant, entry = firing.tenant, firing.entry.name
            lateness = now_ms - firing.release_ms
            if tenant is not None and self.batched(entry, tenant, firing.manual):
                base = base_address(firing.address, tenant)
                group = (base, entry, firing.occurrence_ms, coalesced, node)
                groups.setdefault(group, []).append((firing.id, tenant, outcome, lateness, now_ms))
            else:
                item = self.history_item(Decision(firing, outcome, node, lateness), coalesced)
                notes.append(self.history_note(firing.address, item))
        notes.extend(self._batch_notes(groups))
        return notes

    def _batch_notes(self, groups: dict[_Group, list[BatchMember]]) -> list[Note]:
        """The batch notes of the ``groups`` of :meth:`history_notes`."""
        notes: list[Note] = []
        for (base, entry, occurrence, coalesced, node), members in groups.items():
            at = max(m[4] for m in members)
            head = f'{batch_head(entry, node, occurrence, coalesced)},"at_ms":{at},"items":['
            for first, texts in batch_chunks(members, NOTE_VALUE_LIMIT - len(head.encode()) - 2):
                notes.append(
                    self._batch(
                        entry,
                        base,
                        occurrence,
                        at_ms=at,
                        key=f"{occurrence}.{node}.{first}",
                        value=head + ",".join(texts) + "]}",
                    )
                )
        return notes

    def _batch(
        self, entry: str, base: str, occurrence_ms: int, *, at_ms: int, key: str, value: str
    ) -> Note:
        """A batch note of ``entry``'s occurrence, posted at ``at_ms``."""
        life = self._batch_life.get(entry, HISTORY_TTL_MS)
        ttl = max(occurrence_ms + life - at_ms, MIN_HISTORY_TTL_MS)
        return Note(fan_out_history_kind(base, occurrence_ms), key, value, self._ttl(ttl))

    def history_note(self, address: str, item: HistoryItem, text: str | None = None) -> Note:
        """The note of ``item`` in the history of ``address`` (its value ``text`` if given,
        the item's JSON otherwise), under its :func:`history_key`."""
        value = item.to_json() if text is None else text
        key = history_key(item.id, item.outcome)
        return self._history_note(address, key, item.occurrence_ms, item.at_ms, value)

    def _history_note(
        self, address: str, key: str, occurrence_ms: int, at_ms: int, value: str
    ) -> Note:
        # Living from the occurrence, not the post, the notes of an address expire in the
        # order of their occurrences, so its bound keeps the latest HISTORY_KEEP of them
        # (a firing recorded missed long after its occurrence does not outlive later ones).
        ttl = max(occurrence_ms + HISTORY_TTL_MS - at_ms, MIN_HISTORY_TTL_MS)
        kind = history_kind(address)
        return Note(kind, key, value, self._ttl(ttl), HISTORY_KEEP, self.logs_history)

    def missed_notes(self, address: str, occurrences: Sequence[int], now_ms: int) -> list[Note]:
        """The missed-count notes of ``occurrences`` of ``address``, found missed by this
        node at ``now_ms`` (:class:`MissedRecord`)."""
        ordered = sorted(occurrences)
        notes = []
        for start in range(0, len(ordered), MISSED_PER_NOTE):
            chunk = tuple(ordered[start : start + MISSED_PER_NOTE])
            ttl = max(chunk[-1] + MISSED_LIFE_MS - now_ms, MIN_HISTORY_TTL_MS)
            value = MissedRecord(self.loop.node, chunk).to_json()
            key = f"{chunk[0]}.{self.loop.node}"
            notes.append(Note(missed_kind(address), key, value, self._ttl(ttl), MISSED_KEEP))
        return notes

    def history_template(
        self, firing: Firing, now_ms: int, coalesced: tuple[int, int] | None = None
    ) -> Note | NoteItem:
        """The history note of ``firing`` for a claim script to complete: its value has
        ``{{outcome}}``, ``{{at_ms}}`` and ``{{lateness_ms}}`` where the script's decision
        goes (:meth:`beatless.stores.redis.store.RedisStore.claim_and_push`); for a
        :meth:`batched` tenant, its item in the batch note of its occurrence. ``coalesced``
        is kept whatever the script decides: it is only read from a sent firing's item."""
        if self.batched(firing.entry.name, firing.tenant, firing.manual):
            return NoteItem(
                self._batch_template(firing, now_ms, coalesced), item_start(firing.tenant or "")
            )
        item = HistoryItem(
            id=firing.id,
            entry=firing.entry.name,
            tenant=firing.tenant,
            occurrence_ms=firing.occurrence_ms,
            release_ms=firing.release_ms,
            node=self.loop.node,
            outcome=TEMPLATE_OUTCOME,
            lateness_ms=TEMPLATE_LATENESS,
            at_ms=TEMPLATE_AT,
            manual=firing.manual,
            coalesced=coalesced,
            revision=self.loop.live.revision_at(firing.entry, firing.occurrence_ms),
        )
        text = (
            item.to_json()
            .replace(f'"at_ms":{TEMPLATE_AT}', '"at_ms":{{at_ms}}')
            .replace(f'"lateness_ms":{TEMPLATE_LATENESS}', '"lateness_ms":{{lateness_ms}}')
        )
        return self._history_note(firing.address, firing.id, firing.occurrence_ms, now_ms, text)

    def _batch_template(
        self, firing: Firing, now_ms: int, coalesced: tuple[int, int] | None
    ) -> Note:
        """The batch note of ``firing``'s occurrence for a claim script to fill in: the
        same object for every firing of the occurrence, so a script writes one."""
        tenant = firing.tenant or ""
        base = base_address(firing.address, tenant)
        cached = (base, firing.occurrence_ms, coalesced)
        template = self._templates.get(cached)
        if template is None:
            if len(self._templates) >= 64:
                self._templates.clear()
            node = self.loop.node
            head = batch_head(firing.entry.name, node, firing.occurrence_ms, coalesced)
            value = head + ',"at_ms":{{at_ms}},"items":[{{items}}]}'
            key = f"{firing.occurrence_ms}.{node}"
            template = self._batch(
                firing.entry.name, base, firing.occurrence_ms, at_ms=now_ms, key=key, value=value
            )
            self._templates[cached] = template
        return template

    def _ttl(self, ttl_ms: int) -> int:
        return capped_ttl(ttl_ms, self.store.notes_live_ms)

    def take_pending(self) -> tuple[list[tuple[str, HistoryItem]], list[Note]]:
        """The history items (each with its address) and missed-count notes waiting, taken
        for a post (:meth:`requeue` puts them back if it fails)."""
        with self._lock:
            history = list(self._pending)
            self._pending.clear()
            missed, self._pending_missed = self._pending_missed, []
        return history, missed

    def requeue(self, history: list[tuple[str, HistoryItem]], missed: list[Note]) -> None:
        """Put the history and missed counts of a failed post back, before what came
        since."""
        with self._lock:
            self._pending.extendleft(reversed(history))
            self._pending_missed[:0] = missed
