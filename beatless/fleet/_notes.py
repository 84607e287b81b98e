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
  <beatless.node.scheduler.Scheduler.history_notes>`); the rest at the next sync, in one post
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

This module is the formats alone: the kinds and keys, the records and how each is written
and read back. The node's thread that posts and reads them is :mod:`beatless.node._board`;
``beatless status`` reads them with :mod:`beatless.ops.status`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from typing import Any

from beatless.core._logtext import shown
from beatless.core.solar import Solar
from beatless.core.triggers import At, Cron, Every, Trigger, Windowed
from beatless.fleet._controls import json_text
from beatless.fleet._schema import (
    BATCH_NOTE,
    HISTORY_ITEM,
    INSTANT_MAX_MS,
    MISSED_RECORD,
    NODE_RECORD,
    BadNote,
    Skipped,
    parse_each,
)
from beatless.schedule.entry import Entry, Schedule, tenant_address
from beatless.schedule.firing import Decision, firing_id
from beatless.schedule.outcomes import DecisionOutcome

SYNC_EVERY_MS = 1_000
"""How often a node posts its history and checks what is due below."""
REGISTRY_EVERY_MS = 5_000
REGISTRY_TTL_MS = 15_000
"""A node that has not posted for this long has left the registry."""
ENTRIES_EVERY_MS = 60_000
ENTRIES_TTL_MS = 300_000
HISTORY_KEEP = 50
HISTORY_TTL_MS = 24 * 3_600_000
"""A firing stays in the history this long after its occurrence."""
MIN_HISTORY_TTL_MS = 60_000
STALL_MS = 5_000
"""A node whose loop has not woken for this long is reported stalled."""
OFFSET_WARN_MS = 1_000
"""A node's clock more than this far from the store's is told: by the node itself
(:mod:`beatless.node._clockwatch`), and by every node reading the registry (:func:`drift`)."""

HISTORY_STRENGTH: dict[str, int] = {
    DecisionOutcome.WON: 4,
    DecisionOutcome.TAKEOVER: 4,
    DecisionOutcome.FORGOTTEN: 3,
    DecisionOutcome.SKIPPED_OVERLAP: 3,
    DecisionOutcome.PAUSED: 2,
    DecisionOutcome.MISSED: 1,
}
"""The one order of the outcomes a firing may have in the history
(:attr:`DecisionOutcome.HISTORY <beatless.schedule.outcomes.DecisionOutcome.HISTORY>`),
strongest highest: what the history tells of a firing is its strongest outcome. A sent
firing (``won``, ``takeover``) is what happened, whatever a node that did not send it
decided; then what its claim decided without a send; then ``paused`` (a node chose not to
claim it); then ``missed`` (no claim was found in time)."""

TEMPLATE_OUTCOME = "{{outcome}}"
TEMPLATE_AT = -1_000_001
TEMPLATE_LATENESS = -1_000_002
"""Stand-ins for what a claim script decides, replaced by its placeholders."""


def nodes_kind(namespace: str) -> str:
    return f"beatless/{namespace}/nodes"


def progress_kind(namespace: str) -> str:
    """The kind of the preferred claimers' progress notes (:mod:`beatless.node._prefer`)."""
    return f"beatless/{namespace}/progress"


def entries_kind(namespace: str) -> str:
    return f"beatless/{namespace}/entries"


def history_kind(address: str) -> str:
    return f"beatless/history/{address}"


def history_key(firing_id: str, outcome: str) -> str:
    """The key of a firing's note in its address's history: the firing id for an outcome
    its claim decided, ``{id}.{outcome}`` for a node's own decision, which another node may
    contradict (see :attr:`DecisionOutcome.CLAIM_DECIDED
    <beatless.schedule.outcomes.DecisionOutcome.CLAIM_DECIDED>`): so no note of a weaker
    outcome ever replaces a stronger one, on any store, and readers take the strongest
    (:func:`strongest`)."""
    return firing_id if outcome in DecisionOutcome.CLAIM_DECIDED else f"{firing_id}.{outcome}"


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
    """Times the scheduler process died and was started again (Dramatiq's supervisor), or 0."""
    last_failure: str | None = None
    """How the scheduler process last died (``killed by SIGKILL``), if it did."""
    last_failure_ms: int | None = None
    store_verdict: str | None = None
    """What the node last read of the store's settings (:meth:`StoreFacts.summary
    <beatless.stores.base.StoreFacts.summary>`): ``ok``, ``warn: appendonly no``,
    ``refuse: maxmemory-policy allkeys-lru`` (claims stopped)."""
    live_revision: int | None = None
    """The live revision the node applied (``None``: it does not read live entries)."""
    live_hash: str | None = None
    """The first hex digits of the SHA-256 of the node's live entries at that revision."""
    live_lag_ms: int | None = None
    """Milliseconds (store clock) from that revision's commit to the node applying it."""
    live_overrides: str | None = None
    """Live entries written over a code entry's name, comma-separated: drift until the
    code catches up."""
    ephem: str | None = None
    """The ``ephem`` version the node computes solar events with (``None``: not installed);
    nodes on other versions claim the same solar firings (keyed by day) a little apart."""
    left_out: str | None = None
    """Entries of the node's schedule it does not run because each has a problem
    (``on_schedule_error = "consume"``), comma-separated."""
    reads_logs: bool = False
    """Whether the node reads logged history (``False`` in an earlier beatless's record)."""

    def to_json(self) -> str:
        return json_text(asdict(self))

    @property
    def schedule_fingerprint(self) -> str:
        """The code fingerprint + live revision + state hash: equal on nodes that run the
        same effective schedule."""
        if self.live_revision is None:
            return self.fingerprint
        return f"{self.fingerprint}+r{self.live_revision}.{self.live_hash}"

    @classmethod
    def parse(cls, text: str) -> NodeRecord:
        """The record, checked against :data:`~beatless.fleet._schema.NODE_RECORD` (fields a
        record has not take their defaults); raises :class:`~beatless.fleet._schema.BadNote`."""
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
    revision: int | None = None
    """The live revision whose definition the firing ran under (a live entry's, or a code
    entry's after a live one handed its name back); ``None``: a code entry, or not known
    (an item written before this field, a fan-out batch item). Written only when known."""

    def to_json(self) -> str:
        # Field by field rather than asdict (which deep-copies): one item per firing sent,
        # so this is on the path of a burst.
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.revision is None:
            del fields["revision"]
        return json_text(fields)

    def covers(self, occurrence_ms: int) -> bool:
        """Whether ``occurrence_ms`` was coalesced into this firing."""
        return self.coalesced is not None and (
            self.coalesced[0] <= occurrence_ms <= self.coalesced[1]
        )

    @classmethod
    def parse(cls, text: str) -> HistoryItem:
        """The item, checked against :data:`~beatless.fleet._schema.HISTORY_ITEM`; raises
        :class:`~beatless.fleet._schema.BadNote`."""
        if cls is HistoryItem:
            return _parsed_item(text)
        return cls(**HISTORY_ITEM.load(text))

    @classmethod
    def from_json(cls, text: str) -> HistoryItem | None:
        """The item, or ``None`` for one that does not fit its schema."""
        try:
            return cls.parse(text)
        except BadNote:
            return None

    @classmethod
    def of(
        cls,
        decision: Decision,
        coalesced: tuple[int, int] | None = None,
        revision: int | None = None,
    ) -> HistoryItem:
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
            revision=revision,
        )


PARSED_ITEMS_KEPT = 4_096
"""History items kept parsed, by their note's text: each missed sweep (and each status
page) reads the same notes again, and an item is immutable."""


@functools.lru_cache(maxsize=PARSED_ITEMS_KEPT)
def _parsed_item(text: str) -> HistoryItem:
    return HistoryItem(**HISTORY_ITEM.load(text))


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
        """The record, checked against :data:`~beatless.fleet._schema.MISSED_RECORD`; raises
        :class:`~beatless.fleet._schema.BadNote`."""
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
    if isinstance(trigger, At):
        return {"at_ms": trigger.instant_ms}
    if isinstance(trigger, Solar):
        return {"solar": trigger.event, "lat": trigger.lat, "lon": trigger.lon}
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
        if "at_ms" in spec:
            return At(int(spec["at_ms"]))
        if "solar" in spec:  # without ephem here: None, as for a trigger it cannot rebuild
            return Solar(str(spec["solar"]), float(spec["lat"]), float(spec["lon"]))
    except Exception:
        return None
    return None


def windowed_of(trigger: Trigger | None, note: Mapping[str, Any]) -> Trigger | None:
    """``trigger`` within the window an entry note publishes (``start_ms``, ``end_ms``)."""
    start, end = note.get("start_ms"), note.get("end_ms")
    if trigger is None or (start is None and end is None):
        return trigger
    try:
        return Windowed(trigger, start, end)
    except Exception:
        return None


TENANTS_PUBLISHED = 20
"""Of a fan-out's tenants, the entry note lists this many (and their count): a note is
small, and ``status`` shows the history of no more."""


BATCH_ITEM_LIMIT = 1_000
"""A tenant name longer than this many characters keeps a history of its own."""


def batch_head(entry: str, node: str, occurrence_ms: int, coalesced: object) -> str:
    """A batch note's value up to its ``at_ms`` and ``items``, which follow."""
    head = {"entry": entry, "node": node, "occurrence_ms": occurrence_ms, "coalesced": coalesced}
    return json_text(head)[:-1]


def item_start(tenant: str) -> str:
    return "[" + encode_basestring_ascii(tenant)  # as json.dumps(tenant)


BatchMember = tuple[str, str, str, int, int]
"""One firing of a batch note, as :func:`batch_chunks` takes it: its id, tenant, outcome,
lateness and when it was decided (``at_ms``)."""


def batch_chunks(members: list[BatchMember], room: int) -> Iterator[tuple[str, list[str]]]:
    """The batch items of ``members`` in chunks of at most ``room`` bytes (commas
    included), each with the id of its first member."""
    chunk: list[str] = []
    first, used = members[0][0], 0
    for id_, tenant, outcome, lateness_ms, _ in members:
        text = f'[{encode_basestring_ascii(tenant)},"{outcome}",{lateness_ms}]'  # item_start
        size = len(text) + 1  # ASCII only: as many bytes as characters
        if chunk and used + size > room:
            yield first, chunk
            chunk, first, used = [], id_, 0
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
    """:func:`batch_items`, checked against :data:`~beatless.fleet._schema.BATCH_NOTE`; raises
    :class:`~beatless.fleet._schema.BadNote`."""
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
        "describe": entry.describe(),
        "jitter_ms": entry.jitter_ms,
        "max_late_ms": entry.max_late_ms,
        "tenants": None if tenants is None else _published(listed),
        "tenant_count": None if listed is None else len(listed),
        "catch_up": entry.catch_up,
        "overlap": entry.overlap,
        "fingerprint": schedule.fingerprint,
        **_window(entry),
    }


def _window(entry: Entry) -> dict[str, Any]:
    """An entry note's window and ``enabled``: written only when the entry has them, so
    the note of an entry without is as it always was."""
    window: dict[str, Any] = {}
    if isinstance(entry.windowed, Windowed):
        window["start_ms"] = entry.windowed.start_ms
        window["end_ms"] = entry.windowed.end_ms
    if not entry.enabled:
        window["enabled"] = False
    return window


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
        ("ephem version", {r.node: r.ephem for r in records if r.ephem is not None}),
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
    overrides = sorted({name for r in records for name in (r.live_overrides or "").split(",")})
    for name in [name for name in overrides if name][:DRIFT_SHOWN]:
        problems.append(
            f"entry {shown(name)}: a live entry overrides the code's (written with "
            f"override=True): drift until the code catches up"
        )
    for record in records:
        if record.left_out:
            problems.append(
                f"node {shown(record.node, quoted=False)}: entries left out of its schedule, "
                f"each with a problem (`beatless check` lists them): "
                f"{shown(record.left_out, quoted=False)}"
            )
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
