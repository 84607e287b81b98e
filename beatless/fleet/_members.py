"""The fleet's membership: who is in it, read as a versioned snapshot, so that what a node
reads at each sync does not grow with the fleet.

The registry (:func:`~beatless.fleet._notes.nodes_kind`) holds every node's full record,
posted every ``REGISTRY_EVERY_MS``: ``status`` reads it, and nodes of the previous version
read it whole. A node of this version reads, at each sync, only:

* the **membership version** (kind ``beatless/{namespace}/membership``, key ``version``):
  one small note that a node writes anew whenever the members change (it joins, its
  member note changes, or it finds a member gone), with a **change note** (kind
  ``beatless/{namespace}/changes``, keyed by the version's nonce, living
  ``CHANGES_TTL_MS``) naming the node that changed and, when the node wrote it of itself,
  its member note. When the version it reads differs from the one its copy was read
  under (one sync after it first saw it, so that the notes posted with it are in place,
  and at most every ``MEMBERS_READ_EVERY_MS``), a node reads the change notes, and at its
  next sync the node kinds of the nodes they name: a node whose ``alive`` note ran out
  leaves its copy, one whose ``alive`` digest is that of a member note carried by a change
  takes it. So what a join or a leave costs each node is the changes of the last
  ``CHANGES_TTL_MS`` and a node kind or two, whatever the fleet's size. It reads the
  **members** (kind ``beatless/{namespace}/members``, one small :class:`Member` note per
  node, refreshed every ``REGISTRY_EVERY_MS`` and living ``REGISTRY_TTL_MS``) whole only
  when the changes cannot tell it: at its first sync, when it last read the changes more
  than half of ``CHANGES_TTL_MS`` ago (notes written since may have run out), when the
  version it reads has no change note (written by a node of the previous version, or by
  hand), when a change note cannot be read, when a round names more than ``SETTLE_MAX``
  nodes, or when a node's ``alive`` digest matches no member note it knows. Readers
  compare the version's text, never order it, and each change is a note of its own, so
  two nodes writing at once lose nothing: both writes make every node read again, and
  the node kinds read tell each node as it is now, whatever order the changes were
  written in;
* its **node kind** and a few others' (kind ``beatless/{namespace}/node/{node}``): each
  node keeps there an ``alive`` note (the digest of its member note, refreshed with it)
  and its ``progress`` note (:mod:`beatless.node._prefer`). A node reads the node kinds
  of the ``WATCHED`` members after it in the ring of member names: a member whose
  ``alive`` note ran out (it stopped posting ``REGISTRY_TTL_MS`` ago), or whose digest is
  not the one of the snapshot, makes it write a new version, so every node drops a dead
  member within ``REGISTRY_TTL_MS`` plus a few syncs, as the registry did. It also
  reads the node kinds of at most ``PROGRESS_READ_MAX`` nodes ranked first for firings
  it waits on: the progress it needs, not the whole fleet's.

A leave is found by any watcher. Each copy that drops a member closes its ring of names
over the gap, so a member whose watchers died with it is watched by the next ones and
found in turn: every member whose notes ran out is dropped, however many died together.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from beatless.fleet._controls import json_text
from beatless.fleet._notes import OFFSET_WARN_MS, NodeRecord
from beatless.fleet._schema import (
    INSTANT,
    NAME,
    SPAN,
    TEXT,
    Skipped,
    flag,
    nullable,
    optional,
    parse_each,
    schema,
)
from beatless.stores.base import NOTE_NAME_LIMIT

MEMBERS_READ_EVERY_MS = 2_000
"""A node reads the members (or the changes) at most this often, however often the
version changes."""
CHANGES_TTL_MS = 20_000
"""How long a change note lives: a node that read the changes less than half of this ago
finds every change written since still in place."""
SETTLE_MAX = 16
"""The most nodes a node reads the node kinds of to take a round of changes; more, and it
reads the members whole."""
MEMBERSHIP_TTL_MS = 24 * 3_600_000
"""How long the version note lives: written again at every change (a store that keeps
notes for less caps it; one that ran out only makes every node read the members once)."""
WATCHED = 2
"""How many members after it in the ring of names each node watches for leaving."""
PROGRESS_READ_MAX = 16
"""The most nodes whose progress a node reads at one sync (besides those it watches)."""
VERSION_KEY = "version"
OLDER_KEY = "older"
"""The key of the membership kind, beside the version, of the last check of the registry
for nodes of an earlier beatless (which post no member note, so no view holds them): the
first such node found live, or none (:class:`~beatless.node._membership.Membership`). No
such note (no check lately) counts as one found."""
LAYOUT_CHECK_EVERY_MS = 10_000
"""The fleet reads its whole registry for such nodes once in this long: one member, in
turn by the ring of names (each node once in ``members × LAYOUT_CHECK_EVERY_MS``, so a
node's bytes stay flat on average whatever the fleet's size)."""
LAYOUT_TTL_MS = 3 * LAYOUT_CHECK_EVERY_MS
"""How long a check's notes live: a fleet whose checkers stopped is taken as unchecked."""
ALIVE_KEY = "alive"
PROGRESS_KEY = "progress"


def members_kind(namespace: str) -> str:
    """The kind of the member notes (key: the node name)."""
    return f"beatless/{namespace}/members"


def changes_kind(namespace: str) -> str:
    """The kind of the change notes (key: the nonce of the version written with each)."""
    return f"beatless/{namespace}/changes"


def membership_kind(namespace: str) -> str:
    """The kind of the membership version note (key ``version``)."""
    return f"beatless/{namespace}/membership"


def node_kind(namespace: str, node: str) -> str:
    """The kind of one node's own notes (``alive``, ``progress``): the node's name, or the
    digest of a name too long for a kind."""
    kind = f"beatless/{namespace}/node/{node}"
    if len(kind) <= NOTE_NAME_LIMIT:
        return kind
    return f"beatless/{namespace}/node/#{hashlib.sha256(node.encode()).hexdigest()}"


MEMBER = schema(
    "member note",
    node=NAME,
    started_ms=INSTANT,
    version=TEXT,
    fingerprint=NAME,
    tzdata=NAME,
    healthy=flag,
    ephem=optional(nullable(NAME)),
    clock_offset_ms=optional(nullable(SPAN)),
    left_out=optional(nullable(TEXT)),
    live_overrides=optional(nullable(TEXT)),
    reads_logs=optional(flag),
)
"""A member note (:class:`Member`)."""
ALIVE = schema("alive note", member=NAME)
"""A node's ``alive`` note: the digest of its member note."""


def _member(value: object) -> Member:
    return Member(**MEMBER.check(value))


CHANGE = schema("change note", node=NAME, member=optional(nullable(_member)))
"""A change note (:class:`Change`)."""


@dataclass(frozen=True, slots=True)
class Member:
    """What the fleet must know of a node at every sync: what the views rank by (its
    schedule fingerprint, whether its loop is healthy) and what the drift warnings
    compare. It changes only when one of these does: a clock offset is in it only while
    over ``OFFSET_WARN_MS``, and moves only by more than half of that."""

    node: str
    started_ms: int
    version: str
    fingerprint: str
    tzdata: str
    healthy: bool
    ephem: str | None = None
    clock_offset_ms: int | None = None
    left_out: str | None = None
    live_overrides: str | None = None
    reads_logs: bool = False
    """Whether the node reads logged history (:attr:`NodeRecord.reads_logs`)."""

    def to_json(self) -> str:
        return json_text(asdict(self))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def parse(cls, text: str) -> Member:
        """The member, checked against :data:`MEMBER`; raises
        :class:`~beatless.fleet._schema.BadNote`."""
        return cls(**MEMBER.load(text))

    def record(self) -> NodeRecord:
        """The registry record as far as this note tells it, for the readers of a node's
        registry (views, drift, metrics): host, pid, counters and wakes are not in it
        (``status`` reads the registry itself for them). Its ``health()`` is ``None``
        exactly when the member is healthy."""
        return NodeRecord(
            node=self.node,
            host="",
            pid=0,
            version=self.version,
            framework="",
            store="",
            fingerprint=self.fingerprint,
            tzdata=self.tzdata,
            clock_offset_ms=self.clock_offset_ms,
            last_wake_ms=None,
            posted_ms=self.started_ms,
            started_ms=self.started_ms,
            loop_alive=self.healthy,
            entries=0,
            ephem=self.ephem,
            left_out=self.left_out,
            live_overrides=self.live_overrides,
            reads_logs=self.reads_logs,
        )


def shown_offset(offset_ms: int | None, posted: int | None) -> int | None:
    """The clock offset a member note shows: none while within ``OFFSET_WARN_MS``, and the
    one ``posted`` until the offset moves more than half of that from it (so the note,
    and with it the membership, does not change at every measure)."""
    if offset_ms is None or abs(offset_ms) <= OFFSET_WARN_MS:
        return None
    if posted is not None and abs(offset_ms - posted) <= OFFSET_WARN_MS // 2:
        return posted
    return offset_ms


def member_of(record: NodeRecord, posted: Member | None) -> Member:
    """The member note of a node whose registry record is ``record``; ``posted`` is the
    one it posted last."""
    return Member(
        node=record.node,
        started_ms=record.started_ms,
        version=record.version,
        fingerprint=record.fingerprint,
        tzdata=record.tzdata,
        healthy=record.health() is None,
        ephem=record.ephem,
        clock_offset_ms=shown_offset(
            record.clock_offset_ms, None if posted is None else posted.clock_offset_ms
        ),
        left_out=record.left_out,
        live_overrides=record.live_overrides,
        reads_logs=record.reads_logs,
    )


def read_members(
    notes: Mapping[str, str], namespace: str, skipped: Skipped | None = None
) -> dict[str, Member]:
    """The members of ``namespace``'s member notes that fit their schema, by node; the
    others are told to ``skipped``."""
    kind = members_kind(namespace)
    return {m.node: m for _, m in parse_each(kind, notes, Member.parse, skipped)}


def alive_digest(kind: str, notes: Mapping[str, str], skipped: Skipped | None = None) -> str | None:
    """The member digest a node kind's ``alive`` note holds; ``None`` when it has none
    (the node left) or one that does not fit its schema."""
    found = {k: v for k, v in notes.items() if k == ALIVE_KEY}
    for _, data in parse_each(kind, found, ALIVE.load, skipped):
        return str(data["member"])
    return None


def alive_json(member: Member) -> str:
    return json_text({"member": member.digest})


def version_json(node: str, now_ms: int, nonce: str) -> str:
    """A new membership version: any text unlike the last one would do."""
    return json_text({"by": node, "at_ms": now_ms, "nonce": nonce})


def version_nonce(text: str | None) -> str | None:
    """The nonce of a version's text (``None``: a version written without one, by a node
    of an earlier beatless or by hand, which no change note covers)."""
    try:
        nonce = json.loads(text or "")["nonce"]
    except (ValueError, KeyError, TypeError):
        return None
    return nonce if isinstance(nonce, str) else None


def change_json(node: str, member: Member | None) -> str:
    """A change note: the node whose membership changed, and its member note when the
    node wrote it of itself (``None``: a watcher found its notes gone or not as read)."""
    return json_text({"node": node, "member": None if member is None else asdict(member)})


@dataclass(frozen=True, slots=True)
class Change:
    """A change note: what one version changed (:func:`change_json`)."""

    node: str
    member: Member | None

    @classmethod
    def parse(cls, text: str) -> Change:
        fields = CHANGE.load(text)
        return cls(fields["node"], fields.get("member"))


def watched(names: Sequence[str], me: str, count: int = WATCHED) -> list[str]:
    """The ``count`` names after ``me`` in the ring of ``names`` (``me`` placed in it if it
    is not there yet)."""
    ring = sorted(set(names) | {me})
    at = ring.index(me)
    return [ring[(at + i) % len(ring)] for i in range(1, min(count, len(ring) - 1) + 1)]
