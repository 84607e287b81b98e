"""What a node tells the fleet through the claim store's notes, and reads back.

Every node keeps, in the store it claims from (:class:`~beatless.stores.base.Note`):

* its **registry record** (kind ``beatless/{namespace}/nodes``, key: the node name),
  posted every ``REGISTRY_EVERY_MS`` and living ``REGISTRY_TTL_MS``: who it is, the
  schedule fingerprint and tzdata it runs, its clock offset to the store, when its loop
  last woke and whether the loop still runs, its counters. A node that stops posting
  leaves the registry when its record runs out;
* the **entries** it schedules (kind ``beatless/{namespace}/entries``), so that
  ``beatless status`` can show a fleet's entries from the store alone;
* the **history** of each address (kind ``beatless/history/{address}``, key: the firing
  id, or ``{id}.{outcome}`` for a node's own decision: :func:`history_key`), bounded to
  the last ``HISTORY_KEEP`` firings and ``HISTORY_TTL_MS``: written by the node that
  decided the firing (the winner, or the node that counted it missed), read as each
  firing's strongest outcome (:data:`HISTORY_STRENGTH`, :func:`strongest`). A
  sent firing's note goes with the store call that makes its claim final (the commit,
  or the atomic claim script: :meth:`Scheduler.history_notes
  <beatless.scheduler.Scheduler.history_notes>`); the rest at the next sync, in one post
  per second for all addresses;
* the **fan-out history**: the tenants of a fan-out beyond the ``TENANTS_PUBLISHED``
  that ``status`` shows have no history of their own. Their firings go into *batch
  notes* of their occurrence (kind ``beatless/fan-out-history/{entry address}@{occurrence
  ms}``, key ``{occurrence ms}.{node}.{first firing id}``): one note per store call and
  node, listing ``[tenant, outcome, lateness_ms]`` per firing, living as long as the last
  ``HISTORY_KEEP`` occurrences (never more than ``HISTORY_TTL_MS``). A burst of ten
  thousand tenants writes a few notes, not ten thousand histories, and a big fan-out's
  history costs about 25 bytes per firing instead of a few hundred;
* the **missed counts** of each address (kind ``beatless/missed/{address}``): the missed
  firings a node counted, one note per sweep (:class:`MissedRecord`), living past the
  hour over which ``status`` counts them, so that count does not shrink as the history
  rolls over.

Nodes read the registry as they post, and WARN (rate-limited) when live nodes disagree
on the schedule fingerprint or the tzdata version, or when a node's clock is more than
``OFFSET_WARN_MS`` from the store's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from beatless._clockwatch import WARN_MS as OFFSET_WARN_MS
from beatless._controls import (
    RUN_NOW_TTL_MS,
    Control,
    capped_ttl,
    controls_kind,
    json_text,
    read_controls,
    read_requests,
    refreshed,
    run_now_kind,
)
from beatless._logtext import ERROR_LIMIT, WarnEvery, shown
from beatless._schema import (
    BATCH_NOTE,
    HISTORY_ITEM,
    INSTANT_MAX_MS,
    MISSED_RECORD,
    NODE_RECORD,
    BadNote,
    Skipped,
    family,
    parse_each,
)
from beatless.entry import tenant_address
from beatless.errors import StoreError
from beatless.firing import firing_id, iso
from beatless.stats import SkippedNotes
from beatless.stores.base import NOTE_VALUE_LIMIT, Note, NoteItem, StoreFacts
from beatless.triggers import Cron, Every, Trigger, tzdata_version

if TYPE_CHECKING:
    from beatless.entry import Entry, Schedule
    from beatless.firing import Firing
    from beatless.scheduler import Decision, Scheduler

logger = logging.getLogger("beatless.fleet")

SYNC_EVERY_MS = 1_000
"""How often a node posts its history and checks what is due below."""
FACTS_EVERY_MS = 10_000
"""How often a node reads all of the store's settings (:meth:`ClaimStore.facts
<beatless.stores.base.ClaimStore.facts>`); at the other syncs it reads only those that can
make a running store lose claims (:meth:`~beatless.stores.base.ClaimStore.quick_facts`)."""
REGISTRY_EVERY_MS = 5_000
REGISTRY_TTL_MS = 15_000
"""A node that has not posted for this long has left the registry."""
ENTRIES_EVERY_MS = 60_000
ENTRIES_TTL_MS = 300_000
HISTORY_KEEP = 50
HISTORY_TTL_MS = 24 * 3_600_000
"""A firing stays in the history this long after its occurrence."""
MIN_HISTORY_TTL_MS = 60_000
HISTORY_BUFFER = 20_000
"""At most this many history items wait for a post; beyond, the oldest are dropped."""
MISSED_SWEEP_EVERY_MS = 30_000
"""How often a node looks for missed firings in the history of its entries."""
STALL_MS = 5_000
"""A node whose loop has not woken for this long is reported stalled."""
DRIFT_WARN_EVERY_MS = 300_000
SKIPPED_WARN_EVERY_MS = 300_000
"""A note skipped for not fitting its schema is told at most this often per kind and key."""

HISTORY_STRENGTH = {
    "won": 4,
    "takeover": 4,
    "forgotten": 3,
    "skipped_overlap": 3,
    "paused": 2,
    "missed": 1,
}
"""The one order of the outcomes a firing may have in the history, strongest highest: what
the history tells of a firing is its strongest outcome. A sent firing (``won``,
``takeover``) is what happened, whatever a node that did not send it decided; then what
its claim decided without a send; then ``paused`` (a node chose not to claim it); then
``missed`` (no claim was found in time)."""
HISTORY_OUTCOMES = frozenset(HISTORY_STRENGTH)
"""The decisions a node writes into an address's history: those only it made. ``lost`` and
``held`` belong to another node's history item; a node-side ``late`` is only this node's
view (another node may have sent the firing)."""
CLAIM_DECIDED = frozenset({"won", "takeover", "forgotten", "skipped_overlap"})
"""The outcomes a claim decides: one of them at most per firing in the whole fleet (the
store answers it to one node), so their notes share the firing's key. The others
(``paused``, ``missed``) are a node's own decision, which another node may contradict:
each has a key of its own (:func:`history_key`), so that no note of a weaker outcome ever
replaces a stronger one, on any store, and readers take the strongest
(:func:`strongest`)."""

SENT = frozenset({"won", "takeover"})
TEMPLATE_OUTCOME = "{{outcome}}"
TEMPLATE_AT = -1_000_001
TEMPLATE_LATENESS = -1_000_002
"""Stand-ins for what a claim script decides, replaced by its placeholders."""


def nodes_kind(namespace: str) -> str:
    return f"beatless/{namespace}/nodes"


def progress_kind(namespace: str) -> str:
    """The kind of the preferred claimers' progress notes (:mod:`beatless._prefer`)."""
    return f"beatless/{namespace}/progress"


def entries_kind(namespace: str) -> str:
    return f"beatless/{namespace}/entries"


def history_kind(address: str) -> str:
    return f"beatless/history/{address}"


def history_key(firing_id: str, outcome: str) -> str:
    """The key of a firing's note in its address's history: the firing id for an outcome
    its claim decided, ``{id}.{outcome}`` for a node's own decision (see
    :data:`CLAIM_DECIDED`)."""
    return firing_id if outcome in CLAIM_DECIDED else f"{firing_id}.{outcome}"


def missed_kind(address: str) -> str:
    """The kind of the missed-count notes of an address (:class:`MissedRecord`)."""
    return f"beatless/missed/{address}"


def fan_out_history_kind(base: str, occurrence_ms: int) -> str:
    """The kind of the batch notes of one occurrence of the fan-out entry at ``base``."""
    return f"beatless/fan-out-history/{base}@{occurrence_ms}"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node's registry record."""

    node: str
    host: str
    pid: int
    version: str
    framework: str
    store: str
    fingerprint: str
    tzdata: str
    clock_offset_ms: int | None
    last_wake_ms: int | None
    """When the node's loop last woke, on the node's clock; ``None`` before its first wake."""
    posted_ms: int
    started_ms: int
    loop_alive: bool
    entries: int
    counters: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    """How many times this node's scheduler process died and was started again (the
    Dramatiq supervisor); 0 elsewhere."""
    last_failure: str | None = None
    """How the scheduler process last died (``killed by SIGKILL``), if it did."""
    last_failure_ms: int | None = None
    store_verdict: str | None = None
    """What the node last read of the store's settings (:meth:`StoreFacts.summary
    <beatless.stores.base.StoreFacts.summary>`): ``ok``, ``warn: appendonly no``,
    ``refuse: maxmemory-policy allkeys-lru`` (claims stopped)."""

    def to_json(self) -> str:
        return json_text(asdict(self))

    @classmethod
    def parse(cls, text: str) -> NodeRecord:
        """The record, checked against :data:`~beatless._schema.NODE_RECORD` (fields a
        record has not take their defaults); raises :class:`~beatless._schema.BadNote`."""
        return cls(**NODE_RECORD.load(text))

    @classmethod
    def from_json(cls, text: str) -> NodeRecord | None:
        """The record, or ``None`` for one that does not fit its schema."""
        try:
            return cls.parse(text)
        except BadNote:
            return None

    def health(self) -> str | None:
        """What is wrong with this node's scheduler, judged on its own clock; ``None`` if
        nothing is."""
        if not self.loop_alive:
            return "its scheduler loop is not running"
        if self.last_wake_ms is None:
            return "its scheduler loop has not woken yet" if self._age_ms > STALL_MS else None
        stalled = self.posted_ms - self.last_wake_ms
        if stalled > STALL_MS:
            return f"its scheduler loop has not woken for {stalled / 1_000:.1f}s"
        return None

    @property
    def _age_ms(self) -> int:
        return self.posted_ms - self.started_ms


@dataclass(frozen=True, slots=True)
class HistoryItem:
    """One firing in an address's history."""

    id: str
    entry: str
    tenant: str | None
    occurrence_ms: int
    release_ms: int
    node: str
    outcome: str
    lateness_ms: int
    """From the release to the decision (for a win: the enqueue), on the deciding node."""
    at_ms: int
    manual: bool = False
    coalesced: tuple[int, int] | None = None
    """For a firing sent by the catch-up policy ``latest``: the first and last occurrence of
    the address it coalesced (left unclaimed), which are therefore not missed."""

    def to_json(self) -> str:
        # Field by field rather than asdict (which deep-copies): one item per firing sent,
        # so this is on the path of a burst.
        return json_text({name: getattr(self, name) for name in self.__dataclass_fields__})

    def covers(self, occurrence_ms: int) -> bool:
        """Whether ``occurrence_ms`` was coalesced into this firing."""
        return self.coalesced is not None and (
            self.coalesced[0] <= occurrence_ms <= self.coalesced[1]
        )

    @classmethod
    def parse(cls, text: str) -> HistoryItem:
        """The item, checked against :data:`~beatless._schema.HISTORY_ITEM`; raises
        :class:`~beatless._schema.BadNote`."""
        return cls(**HISTORY_ITEM.load(text))

    @classmethod
    def from_json(cls, text: str) -> HistoryItem | None:
        """The item, or ``None`` for one that does not fit its schema."""
        try:
            return cls.parse(text)
        except BadNote:
            return None

    @classmethod
    def of(cls, decision: Decision, coalesced: tuple[int, int] | None = None) -> HistoryItem:
        firing = decision.firing
        return cls(
            id=firing.id,
            entry=firing.entry.name,
            tenant=firing.tenant,
            occurrence_ms=firing.occurrence_ms,
            release_ms=firing.release_ms,
            node=decision.node,
            outcome=decision.outcome,
            lateness_ms=decision.lateness_ms,
            at_ms=firing.release_ms + decision.lateness_ms,
            manual=firing.manual,
            coalesced=coalesced,
        )


def strongest(items: Iterable[HistoryItem]) -> list[HistoryItem]:
    """One item per firing, in the order their firings first appear: the one of its
    strongest outcome (:data:`HISTORY_STRENGTH`; an outcome this version does not know is
    the weakest), the latest decided of equals. What every reader of a history shows."""
    best: dict[str, HistoryItem] = {}
    for item in items:
        held = best.get(item.id)
        if held is None or _rank(item) > _rank(held):
            best[item.id] = item
    return list(best.values())


def _rank(item: HistoryItem) -> tuple[int, int]:
    return HISTORY_STRENGTH.get(item.outcome, 0), item.at_ms


MISSED_LIFE_MS = 3_600_000 + 300_000
"""How long after its last occurrence a missed-count note lives: past the hour over which
``status`` counts missed firings."""
MISSED_PER_NOTE = 1_000
"""The most occurrences one missed-count note lists (14 bytes each: within a note's value)."""
MISSED_KEEP = 1_000
"""The most missed-count notes an address keeps (an hour of sweeps of many nodes)."""


@dataclass(frozen=True, slots=True)
class MissedRecord:
    """Missed firings of one address that one node's sweep found and counted: a note of
    its own (kind :func:`missed_kind`, key ``{first occurrence}.{node}``) that lives until
    its occurrences are more than an hour old, so the count of the last hour does not
    depend on what the history (its last ``HISTORY_KEEP`` firings) still holds. Each
    missed firing is counted by one node in the fleet, so the records of an address never
    list an occurrence twice."""

    node: str
    occurrences: tuple[int, ...]

    def to_json(self) -> str:
        return json_text({"v": 1, "node": self.node, "occurrences": list(self.occurrences)})

    @classmethod
    def parse(cls, text: str) -> MissedRecord:
        """The record, checked against :data:`~beatless._schema.MISSED_RECORD`; raises
        :class:`~beatless._schema.BadNote`."""
        data = MISSED_RECORD.load(text)
        return cls(data["node"], tuple(data["occurrences"]))


def read_missed(kind: str, notes: Mapping[str, str], skipped: Skipped | None = None) -> set[int]:
    """The occurrences the missed-count notes of one address (``kind``) list; a note that
    does not fit its schema is told to ``skipped``."""
    records = parse_each(kind, notes, MissedRecord.parse, skipped)
    return {o for _, record in records for o in record.occurrences}


def trigger_spec(trigger: Trigger) -> dict[str, Any]:
    """A trigger as plain data, so that a reader without the schedule can rebuild it."""
    if isinstance(trigger, Every):
        return {"every_ms": trigger.interval_ms, "anchor_ms": trigger.anchor_ms}
    if isinstance(trigger, Cron):
        return {"cron": trigger.expr, "tz": trigger.tz, "day_and": trigger.day_and}
    return {"describe": trigger.describe()}


def trigger_of(spec: Mapping[str, Any]) -> Trigger | None:
    """The trigger :func:`trigger_spec` wrote, or ``None`` for one it cannot rebuild."""
    from datetime import timedelta

    try:
        if "every_ms" in spec:
            anchor = datetime.fromtimestamp(spec.get("anchor_ms", 0) / 1_000, UTC)
            return Every(timedelta(milliseconds=int(spec["every_ms"])), anchor)
        if "cron" in spec:
            return Cron(str(spec["cron"]), spec.get("tz"), day_and=spec.get("day_and"))
    except Exception:
        return None
    return None


TENANTS_PUBLISHED = 20
"""Of a fan-out's tenants, the entry note lists this many (and their count): a note is
small, and ``status`` shows the history of no more."""


BATCH_ITEM_LIMIT = 1_000
"""A tenant name longer than this many characters keeps a history of its own."""


def _batch_head(entry: str, node: str, occurrence_ms: int, coalesced: object) -> str:
    """A batch note's value up to its ``at_ms`` and ``items``, which follow."""
    head = {"entry": entry, "node": node, "occurrence_ms": occurrence_ms, "coalesced": coalesced}
    return json_text(head)[:-1]


def _item_start(tenant: str) -> str:
    return "[" + json.dumps(tenant)


def _chunks(members: list[HistoryItem], room: int) -> Iterator[tuple[str, list[str]]]:
    """The batch items of ``members`` in chunks of at most ``room`` bytes (commas
    included), each with the id of its first member."""
    chunk: list[str] = []
    first, used = members[0].id, 0
    for member in members:
        text = f'{_item_start(member.tenant or "")},"{member.outcome}",{member.lateness_ms}]'
        size = len(text.encode()) + 1
        if chunk and used + size > room:
            yield first, chunk
            chunk, first, used = [], member.id, 0
        chunk.append(text)
        used += size
    yield first, chunk


def batch_items(base: str, text: str, tenant: str | None = None) -> list[HistoryItem]:
    """The history items of one batch note of the fan-out entry at ``base`` (those of
    ``tenant`` alone, if given); none for a note that does not fit its schema."""
    try:
        return parse_batch(base, text, tenant)
    except BadNote:
        return []


def parse_batch(base: str, text: str, tenant: str | None = None) -> list[HistoryItem]:
    """:func:`batch_items`, checked against :data:`~beatless._schema.BATCH_NOTE`; raises
    :class:`~beatless._schema.BadNote`."""
    if tenant is not None and json.dumps(tenant) not in text:
        return []
    data = BATCH_NOTE.load(text)
    entry, node, occurrence, at = data["entry"], data["node"], data["occurrence_ms"], data["at_ms"]
    items = []
    for name, outcome, lateness in data["items"]:
        if tenant is not None and name != tenant:
            continue
        if not 0 <= at - lateness <= INSTANT_MAX_MS:
            raise BadNote(f"tenant {json.dumps(name[:80])}: lateness {lateness}ms is out of range")
        items.append(
            HistoryItem(
                id=firing_id(tenant_address(base, name), occurrence),
                entry=entry,
                tenant=name,
                occurrence_ms=occurrence,
                release_ms=at - lateness,
                node=node,
                outcome=outcome,
                lateness_ms=lateness,
                at_ms=at,
                coalesced=data.get("coalesced"),
            )
        )
    return items


def entry_note(schedule: Schedule, entry: Entry) -> dict[str, Any]:
    """What the fleet publishes of one entry."""
    tenants = entry.tenants
    listed = None if tenants is None or callable(tenants) else tuple(tenants)
    return {
        "entry": entry.name,
        "address": schedule.address(entry),
        "task": entry.task,
        "trigger": trigger_spec(entry.trigger),
        "describe": entry.trigger.describe(),
        "jitter_ms": entry.jitter_ms,
        "max_late_ms": entry.max_late_ms,
        "tenants": None if tenants is None else _published(listed),
        "tenant_count": None if listed is None else len(listed),
        "catch_up": entry.catch_up,
        "overlap": entry.overlap,
        "fingerprint": schedule.fingerprint,
    }


DRIFT_SHOWN = 5
"""Values and node names a drift problem lists; the rest are counted."""


def _published(tenants: tuple[str, ...] | None) -> list[str] | str:
    return "callable" if tenants is None else list(tenants[:TENANTS_PUBLISHED])


def drift(records: Iterable[NodeRecord]) -> list[str]:
    """What live nodes disagree on, one line each: schedule fingerprint, tzdata, and
    clocks more than ``OFFSET_WARN_MS`` from the store's. Node names and the values
    compared come from the store: each is escaped and cut as a log line shows it, so a
    problem is one line of bounded length whatever a registry note holds."""
    records = sorted(records, key=lambda r: r.node)
    problems = []
    for what, values in (
        ("schedule fingerprint", {r.node: r.fingerprint for r in records}),
        ("tzdata version", {r.node: r.tzdata for r in records}),
    ):
        groups: dict[str, list[str]] = {}
        for node, value in values.items():
            groups.setdefault(value, []).append(node)
        if len(groups) > 1:
            told = "; ".join(
                f"{shown(value, quoted=False)} on {_nodes_shown(nodes)}"
                for value, nodes in sorted(groups.items())[:DRIFT_SHOWN]
            )
            more = len(groups) - DRIFT_SHOWN
            told += f"; {more} more" if more > 0 else ""
            problems.append(f"live nodes run different {what}s: {told}")
    for record in records:
        offset = record.clock_offset_ms
        if offset is not None and abs(offset) > OFFSET_WARN_MS:
            problems.append(
                f"node {shown(record.node, quoted=False)}: clock {-offset:+d}ms from the "
                f"store's (over {OFFSET_WARN_MS}ms)"
            )
    return problems


def _nodes_shown(nodes: list[str]) -> str:
    told = ", ".join(shown(node, quoted=False) for node in nodes[:DRIFT_SHOWN])
    more = len(nodes) - DRIFT_SHOWN
    return told + (f" and {more} more" if more > 0 else "")


def read_registry(
    notes: Mapping[str, str], namespace: str, skipped: Skipped | None = None
) -> list[NodeRecord]:
    """The records of ``namespace``'s registry notes that fit their schema; the others
    are told to ``skipped``."""
    return [r for _, r in parse_each(nodes_kind(namespace), notes, NodeRecord.parse, skipped)]


def read_history(
    address: str, notes: Mapping[str, str], skipped: Skipped | None = None
) -> list[HistoryItem]:
    """The items of ``address``'s history notes that fit their schema; the others are
    told to ``skipped``."""
    return [i for _, i in parse_each(history_kind(address), notes, HistoryItem.parse, skipped)]


class Board:
    """One node's side of the notes: registry, entries, history, drift warnings.

    :meth:`sync` does what is due; :meth:`start` runs it every second in a thread of its
    own, so that the registry shows a node whose loop died or hangs as such.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        framework: str = "standalone",
        loop_alive: Callable[[], bool] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store
        self.framework = framework
        self.namespace = scheduler.schedule.namespace
        self._loop_alive = loop_alive or (lambda: True)
        self._pending: deque[tuple[str, HistoryItem]] = deque(maxlen=HISTORY_BUFFER)
        """History items to post at the next sync, each with its address."""
        self._pending_missed: list[Note] = []
        """Missed-count notes to post at the next sync, with the history."""
        entries = scheduler.schedule.entries
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
        self._lock = threading.Lock()
        self._registry_ms: int | None = None
        self._swept_ms: int | None = None
        self._entries_ms: int | None = None
        self._warned = WarnEvery()
        self.skipped = SkippedNotes()
        """The notes read that did not fit their schema (:meth:`skip`)."""
        self.last_wake_ms: int | None = None
        self.restarts = 0
        self.last_failure: str | None = None
        self.last_failure_ms: int | None = None
        self.registry: list[NodeRecord] = []
        """The live nodes as this node last read them (every ``REGISTRY_EVERY_MS``)."""
        self.controls: dict[str, Control] = {}
        """The controls of this namespace by entry, as last read (every sync)."""
        self._run_now: list[Control] = []
        self._seen_requests: dict[str, int] = {}
        """Run-now requests already taken, with when they were first seen."""
        self.host = socket.gethostname()
        self.started_ms = scheduler.now_ms()
        from beatless import __version__

        self.version = __version__
        self.tzdata = tzdata_version()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.store_facts: StoreFacts | None = None
        """The store's settings as the last sync read them (:meth:`watch_store`)."""
        self._facts_ms: int | None = None
        self._full_seen = 0

    def woke(self, now_ms: int) -> None:
        """The loop calls this at every wake."""
        self.last_wake_ms = now_ms

    def record(self, decision: Decision, coalesced: tuple[int, int] | None = None) -> None:
        """Keep a decision for the history, if it is one this node writes."""
        if decision.outcome in HISTORY_OUTCOMES:
            item = HistoryItem.of(decision, coalesced if decision.outcome in SENT else None)
            self.record_item(decision.firing.address, item)

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
        groups: dict[tuple[str, str, int, tuple[int, int] | None, str], list[HistoryItem]] = {}
        for address, item in items:
            if self.batched(item.entry, item.tenant, item.manual) and item.tenant is not None:
                base = address[: -len(item.tenant) - 1]
                group = (base, item.entry, item.occurrence_ms, item.coalesced, item.node)
                groups.setdefault(group, []).append(item)
            else:
                notes.append(self.history_note(address, item))
        for (base, entry, occurrence, coalesced, node), members in groups.items():
            at = max(m.at_ms for m in members)
            head = f'{_batch_head(entry, node, occurrence, coalesced)},"at_ms":{at},"items":['
            for first, texts in _chunks(members, NOTE_VALUE_LIMIT - len(head.encode()) - 2):
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
        return Note(history_kind(address), key, value, self._ttl(ttl), HISTORY_KEEP)

    def missed_notes(self, address: str, occurrences: Sequence[int], now_ms: int) -> list[Note]:
        """The missed-count notes of ``occurrences`` of ``address``, found missed by this
        node at ``now_ms`` (:class:`MissedRecord`)."""
        ordered = sorted(occurrences)
        notes = []
        for start in range(0, len(ordered), MISSED_PER_NOTE):
            chunk = tuple(ordered[start : start + MISSED_PER_NOTE])
            ttl = max(chunk[-1] + MISSED_LIFE_MS - now_ms, MIN_HISTORY_TTL_MS)
            value = MissedRecord(self.scheduler.node, chunk).to_json()
            key = f"{chunk[0]}.{self.scheduler.node}"
            notes.append(Note(missed_kind(address), key, value, self._ttl(ttl), MISSED_KEEP))
        return notes

    def history_template(
        self, firing: Firing, now_ms: int, coalesced: tuple[int, int] | None = None
    ) -> Note | NoteItem:
        """The history note of ``firing`` for a claim script to complete: its value has
        ``{{outcome}}``, ``{{at_ms}}`` and ``{{lateness_ms}}`` where the script's decision
        goes (:meth:`beatless.stores.redis.RedisStore.claim_and_push`); for a
        :meth:`batched` tenant, its item in the batch note of its occurrence. ``coalesced``
        is kept whatever the script decides: it is only read from a sent firing's item."""
        if self.batched(firing.entry.name, firing.tenant, firing.manual):
            return NoteItem(
                self._batch_template(firing, now_ms, coalesced), _item_start(firing.tenant or "")
            )
        item = HistoryItem(
            id=firing.id,
            entry=firing.entry.name,
            tenant=firing.tenant,
            occurrence_ms=firing.occurrence_ms,
            release_ms=firing.release_ms,
            node=self.scheduler.node,
            outcome=TEMPLATE_OUTCOME,
            lateness_ms=TEMPLATE_LATENESS,
            at_ms=TEMPLATE_AT,
            manual=firing.manual,
            coalesced=coalesced,
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
        base = firing.address[: -len(tenant) - 1]
        cached = (base, firing.occurrence_ms, coalesced)
        template = self._templates.get(cached)
        if template is None:
            if len(self._templates) >= 64:
                self._templates.clear()
            node = self.scheduler.node
            head = _batch_head(firing.entry.name, node, firing.occurrence_ms, coalesced)
            value = head + ',"at_ms":{{at_ms}},"items":[{{items}}]}'
            key = f"{firing.occurrence_ms}.{node}"
            template = self._batch(
                firing.entry.name, base, firing.occurrence_ms, at_ms=now_ms, key=key, value=value
            )
            self._templates[cached] = template
        return template

    def node_record(self, now_ms: int) -> NodeRecord:
        scheduler = self.scheduler
        counters: dict[str, int] = {}
        for stats in scheduler.stats.values():
            for name, value in stats.as_dict().items():
                if isinstance(value, int) and not name.startswith("lateness"):
                    counters[name] = counters.get(name, 0) + value
        counters["skipped_notes"] = self.skipped.total
        return NodeRecord(
            node=scheduler.node,
            host=self.host,
            pid=os.getpid(),
            version=self.version,
            framework=self.framework,
            store=self.store.name,
            fingerprint=scheduler.schedule.fingerprint,
            tzdata=self.tzdata,
            clock_offset_ms=scheduler.clockwatch.offset_ms,
            last_wake_ms=self.last_wake_ms,
            posted_ms=now_ms,
            started_ms=self.started_ms,
            loop_alive=self._loop_alive(),
            entries=len(scheduler.schedule.entries),
            counters=counters,
            restarts=self.restarts,
            last_failure=self.last_failure,
            last_failure_ms=self.last_failure_ms,
            store_verdict=None if self.store_facts is None else self.store_facts.summary(),
        )

    def sync(self, now_ms: int | None = None) -> None:
        """Post the history waiting, and the registry record and entries when due; read
        the registry and warn about drift. A store error is logged (rate-limited) and the
        history kept for the next sync."""
        now = self.scheduler.now_ms() if now_ms is None else now_ms
        self.watch_store(now)
        with self._lock:
            history = list(self._pending)
            self._pending.clear()
            missed, self._pending_missed = self._pending_missed, []
        notes = self.history_notes(history) + missed
        registry_due = self._registry_ms is None or now - self._registry_ms >= REGISTRY_EVERY_MS
        if registry_due:
            record = self.node_record(now)
            notes.append(
                Note(
                    nodes_kind(self.namespace),
                    record.node,
                    record.to_json(),
                    self._ttl(REGISTRY_TTL_MS),
                )
            )
        progress = self.scheduler.preference.note(refresh=registry_due)
        if progress is not None:
            notes.append(Note(*progress, self._ttl(REGISTRY_TTL_MS)))
        if self._entries_ms is None or now - self._entries_ms >= ENTRIES_EVERY_MS:
            notes.extend(self._entry_notes())
            self._entries_ms = now
        try:
            if notes:
                self.store.post(notes)
            self._read(now, registry_due)
            if self._swept_ms is None or now - self._swept_ms >= MISSED_SWEEP_EVERY_MS:
                self._swept_ms = now
                self._sweep_missed(now)
        except StoreError as exc:
            self._requeue(history, missed)
            if self._may_warn("store", 60_000, now):
                logger.warning(
                    "node %s: registry and history not written to the claim store (%s); "
                    "retried every second",
                    shown(self.scheduler.node, quoted=False),
                    exc,
                )

    def watch_store(self, now: int) -> None:
        """Read the store's settings again (:meth:`ClaimStore.watch
        <beatless.stores.base.ClaimStore.watch>`): all of them every ``FACTS_EVERY_MS``
        and at once after a claim or commit was refused as full, the quick ones at the
        other syncs. A refused one stops the claims until it is fixed, said at WARNING
        once a minute while it holds."""
        was = None if self.store_facts is None else self.store.refusal
        full = sum(stats.store_full for stats in list(self.scheduler.stats.values()))
        due = self._facts_ms is None or now - self._facts_ms >= FACTS_EVERY_MS
        quick = not due and full == self._full_seen
        try:
            self.store_facts = self.store.watch(quick=quick)
        except StoreError as exc:
            logger.debug("store settings not read: %s", exc)
            return
        if not quick:
            self._facts_ms, self._full_seen = now, full
        refusal = self.store.refusal
        if refusal is not None and (self._may_warn("refused", 60_000, now) or was is None):
            logger.warning(
                "node %s: claims stopped: %s", shown(self.scheduler.node, quoted=False), refusal
            )
        elif refusal is None and was is not None:
            logger.warning(
                "node %s: claims resumed: the store's settings are %s",
                shown(self.scheduler.node, quoted=False),
                self.store_facts.summary(),
            )

    def _ttl(self, ttl_ms: int) -> int:
        return capped_ttl(ttl_ms, self.store.notes_live_ms)

    def _requeue(self, history: list[tuple[str, HistoryItem]], missed: list[Note]) -> None:
        """Put the history and missed counts of a failed post back, before what came
        since."""
        with self._lock:
            self._pending.extendleft(reversed(history))
            self._pending_missed[:0] = missed

    def _entry_notes(self) -> list[Note]:
        schedule = self.scheduler.schedule
        kind = entries_kind(self.namespace)
        return [
            Note(
                kind, entry.name, json_text(entry_note(schedule, entry)), self._ttl(ENTRIES_TTL_MS)
            )
            for entry in schedule.entries
        ]

    def _read(self, now: int, registry_due: bool) -> None:
        """Read the controls and the preferred claimers' progress (every sync) and the
        registry (when due), in one call."""
        preference = self.scheduler.preference
        kinds = [controls_kind(self.namespace), run_now_kind(self.namespace)]
        if preference.enabled:
            kinds.append(preference.kind)
        if registry_due:
            kinds.append(nodes_kind(self.namespace))
        notes = self.store.read_notes(kinds)
        self.controls = read_controls(notes[kinds[0]], self.namespace, self)
        again = [
            note
            for control in self.controls.values()
            if (note := refreshed(self.namespace, control, now, self.store.notes_live_ms))
        ]
        if again:
            self.store.post(again)
        self._take_requests(notes[kinds[1]], now)
        if preference.enabled:
            preference.read(notes[preference.kind], self)
        if registry_due:
            self._registry_ms = now
            self.registry = read_registry(notes[nodes_kind(self.namespace)], self.namespace, self)
            preference.registry = self.registry
            for problem in drift(self.registry):
                if self._may_warn(problem, DRIFT_WARN_EVERY_MS, now):
                    logger.warning("namespace %s: %s", shown(self.namespace), problem)

    def _take_requests(self, notes: Mapping[str, str], now: int) -> None:
        """Queue the run-now requests not seen before, once each."""
        unseen = {key: text for key, text in notes.items() if key not in self._seen_requests}
        self._seen_requests.update(dict.fromkeys(unseen, now))
        requests = read_requests(unseen, self.namespace, self).values()
        fresh = [control for control in requests if control.action == "run-now"]
        with self._lock:
            self._run_now.extend(sorted(fresh, key=lambda c: c.at_ms))
        for key, seen in list(self._seen_requests.items()):
            if now - seen > RUN_NOW_TTL_MS:
                del self._seen_requests[key]

    def _sweep_missed(self, now: int) -> None:
        """Count, log and record the missed firings this node is first to find; each is
        counted by one node in the fleet (:func:`beatless.status.sweep_missed`)."""
        from beatless.firing import Firing
        from beatless.scheduler import Decision
        from beatless.status import sweep_missed

        scheduler = self.scheduler
        schedule = scheduler.schedule
        for view, occurrences in sweep_missed(self.store, schedule, scheduler.node, now, self):
            entry = schedule.entry(view.name)
            for occurrence in occurrences:
                firing = Firing.of(entry, None, view.address, occurrence)
                decision = Decision(firing, "missed", scheduler.node, now - firing.release_ms)
                self.record_item(firing.address, HistoryItem.of(decision))
            # Counted apart from the history, which keeps only its last firings: posted
            # with these items at the next sync.
            with self._lock:
                self._pending_missed.extend(self.missed_notes(view.address, occurrences, now))
            scheduler.stats[entry.name].missed += len(occurrences)
            logger.warning(
                "entry %s: %d firing(s) from %s to %s missed: no node claimed them within "
                "max_late (every node down, frozen or cut off from the store?); counted once "
                "in the fleet, by this node",
                shown(entry.name),
                len(occurrences),
                iso(min(occurrences)),
                iso(max(occurrences)),
            )

    def take_run_now(self) -> list[Control]:
        """The run-now requests read since the last call."""
        with self._lock:
            taken, self._run_now = self._run_now, []
        return taken

    def paused(self, entry: str, now_ms: int) -> Control | None:
        """The pause that holds ``entry`` at ``now_ms``, if any."""
        control = self.controls.get(entry)
        return control if control is not None and control.pauses(now_ms) else None

    def _may_warn(self, key: str, every_ms: int, now: int) -> bool:
        return self._warned.allows(key, every_ms, now)

    def skip(self, kind: str, key: str, text: str, reason: str) -> None:
        """A note read does not fit its schema (:class:`~beatless._schema.Skipped`): count
        it once, and warn once per kind and key (at most every ``SKIPPED_WARN_EVERY_MS``)."""
        if not self.skipped.add(family(kind), kind, key, text):
            return
        if self._may_warn(
            f"skipped\0{kind}\0{key}", SKIPPED_WARN_EVERY_MS, self.scheduler.now_ms()
        ):
            logger.warning(
                "node %s: note %s of kind %s in the claim store skipped: %s; it is not a "
                "record this version can read (written by hand, by another version or a "
                "bug?): delete it, or let its writer post it again",
                shown(self.scheduler.node, quoted=False),
                shown(key),
                shown(kind),
                shown(reason, quoted=False, limit=ERROR_LIMIT),
            )

    # -- running --------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"beatless-board-{self.scheduler.node}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.sync()
            except Exception:
                if self._may_warn("exception", 300_000, self.scheduler.now_ms()):
                    logger.exception("registry and history sync failed; retried every second")
            self._stop.wait(max(0.0, SYNC_EVERY_MS / 1_000 - (time.monotonic() - began)))

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread after a last sync, so the history of the last wakes is kept."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout)
        try:
            self.sync()
        except Exception:
            logger.debug("last registry sync failed", exc_info=True)
