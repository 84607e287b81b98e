"""One node's side of the membership (:mod:`beatless.fleet._members`): what its board posts
of it, what it reads at each sync, and the members as it last read them.

It makes no store call: the board (:mod:`beatless.node._board`) asks it which notes to
post (:meth:`Membership.own_notes`) and which kinds to read (:meth:`Membership.kinds`),
makes the calls, and hands back what it read (:meth:`Membership.took`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence

from beatless.fleet._controls import json_text
from beatless.fleet._members import (
    ALIVE_KEY,
    LAYOUT_CHECK_EVERY_MS,
    LAYOUT_TTL_MS,
    MEMBERS_READ_EVERY_MS,
    OLDER_KEY,
    PROGRESS_KEY,
    SETTLE_MAX,
    VERSION_KEY,
    WATCHED,
    Change,
    Member,
    alive_digest,
    alive_json,
    change_json,
    changes_kind,
    member_of,
    members_kind,
    membership_kind,
    node_kind,
    read_members,
    version_json,
    version_nonce,
    watched,
)
from beatless.fleet._notes import (
    REGISTRY_EVERY_MS,
    SYNC_EVERY_MS,
    NodeRecord,
    read_registry,
)
from beatless.fleet._schema import Skipped, parse_each
from beatless.stores.base import Note


class Membership:
    """The members as this node last read them, and what it posts of itself."""

    def __init__(
        self,
        namespace: str,
        node: str,
        ttl_ms: int,
        version_ttl_ms: int,
        changes_ttl_ms: int,
    ) -> None:
        self.namespace = namespace
        self.node = node
        self.ttl = ttl_ms
        self.version_ttl = version_ttl_ms
        self.changes_ttl = changes_ttl_ms
        self.own_kind = node_kind(namespace, node)
        self.members: dict[str, Member] = {}
        """The members as last read, by node."""
        self.changed = False
        """Whether the members were read since the board last took them."""
        self._version: str | None = None
        """The version the members were read under (``None``: not known yet)."""
        self._seen: str | None = None
        self._seen_ms: int | None = None
        self._members_ms: int | None = None
        self._basis: str | None = None
        self._reading: str | None = None
        """What this sync reads of the members: ``"members"`` (whole), ``"changes"``, or
        nothing."""
        self._whole = True
        """Whether the next read of the members is whole (the changes cannot tell them)."""
        self._current_ms: int | None = None
        """The last sync at which this node read the changes, or found its copy of the
        version it read: every change written since is still in place while this is less
        than half of ``changes_ttl`` ago."""
        self._taken: dict[str, int] = {}
        """The keys of the change notes taken, with when they were read."""
        self._carried: dict[str, Member] = {}
        """The member notes the changes being settled carry, by digest."""
        self._settling: dict[str, str] = {}
        """The node kinds to read at this sync to settle the changes taken, with nodes."""
        self._asked: dict[str, str] = {}
        """The node kinds asked at this sync, with their nodes."""
        self._watched: list[str] = []
        self._bumped: dict[str, int] = {}
        self._posted: Member | None = None
        self._posted_ms: int | None = None
        self._posting: tuple[Member, bool] | None = None
        self._rejoin = False
        self.checked = False
        """Whether a member checked the registry for nodes of an earlier beatless lately."""
        self.older: tuple[str, str] | None = None
        """A live node of an earlier beatless the last check found, and its version
        (``None``: none)."""
        self._checked_slot: int | None = None
        self._ring = [node]
        """The members' names and this node's, sorted: read with the members."""

    # -- posting --------------------------------------------------------------------

    def own_notes(self, record: NodeRecord, now: int, *, refresh: bool) -> list[Note]:
        """The notes to post of this node: its member note and ``alive`` note when
        ``refresh`` or when the member changed, and a new version when it changed, when
        this node joins, or when its notes may have run out meanwhile (no post went
        through for ``ttl``)."""
        member = member_of(record, self._posted)
        lapsed = self._posted_ms is None or now - self._posted_ms > self.ttl - SYNC_EVERY_MS
        bump = member != self._posted or lapsed or self._rejoin
        if not (refresh or bump):
            self._posting = None
            return []
        self._posting = (member, bump)
        notes = [
            Note(members_kind(self.namespace), self.node, member.to_json(), self.ttl),
            Note(self.own_kind, ALIVE_KEY, alive_json(member), self.ttl),
        ]
        if bump:
            notes += self.version_notes(now, self.node, member)
        return notes

    def posted(self, now: int) -> None:
        """The notes of :meth:`own_notes` went through."""
        if self._posting is not None:
            self._posted, bumped = self._posting
            self._posted_ms = now
            self._rejoin = self._rejoin and not bumped
            self._posting = None

    def version_notes(self, now: int, node: str, member: Member | None) -> list[Note]:
        """A new version, and the change note telling what it changed: ``node``, whose
        member note is ``member`` (``None``: found gone, or not as read, by a watcher)."""
        nonce = uuid.uuid4().hex[:12]
        return [
            Note(
                membership_kind(self.namespace),
                VERSION_KEY,
                version_json(self.node, now, nonce),
                self.version_ttl,
            ),
            Note(changes_kind(self.namespace), nonce, change_json(node, member), self.changes_ttl),
        ]

    # -- reading --------------------------------------------------------------------

    def kinds(self, now: int, wanted: Sequence[str]) -> list[str]:
        """The kinds to read at this sync: the version; the changes (or the members whole)
        when due; the node kinds of the nodes the changes taken at the last sync name,
        of the watched members and of the ``wanted`` nodes."""
        kinds = [membership_kind(self.namespace)]
        seen_ms, read_ms = self._seen_ms, self._members_ms
        due = read_ms is None or (
            self._seen != self._version
            and seen_ms is not None
            and now - seen_ms >= SYNC_EVERY_MS
            and now - read_ms >= MEMBERS_READ_EVERY_MS
        )
        self._reading = None
        if due and not self._settling:
            self._basis = self._seen  # seen a sync ago at least: its notes are in place
            lapsed = self._current_ms is None or now - self._current_ms > self.changes_ttl // 2
            self._reading = "members" if self._whole or lapsed else "changes"
            kinds.append(changes_kind(self.namespace))
            if self._reading == "members":
                kinds.append(members_kind(self.namespace))
        self._asked = {}
        for node in [*self._watched, *wanted]:
            if node != self.node:
                self._asked.setdefault(node_kind(self.namespace, node), node)
        settling = [kind for kind in self._settling if kind not in self._asked]
        return kinds + list(self._asked) + settling

    def took(
        self, notes: Mapping[str, Mapping[str, str]], now: int, skipped: Skipped | None
    ) -> tuple[dict[str, str], list[Note]]:
        """Take what the kinds of :meth:`kinds` read: the progress notes read, by node,
        and the notes to post at once (a new version and its change note, when a watched
        member left or its note is not the one read)."""
        membership = notes.get(membership_kind(self.namespace), {})
        version = membership.get(VERSION_KEY, "")
        self.checked = OLDER_KEY in membership
        self.older = older_node(membership.get(OLDER_KEY))
        if version != self._seen:
            self._seen, self._seen_ms = version, now
        if self._settling:
            self._settle(notes, skipped)
        if self._reading is not None:
            self._take_changes(notes.get(changes_kind(self.namespace), {}), now, skipped)
        if self._reading == "members":
            self._take_members(notes.get(members_kind(self.namespace), {}), skipped)
        progress: dict[str, str] = {}
        stale: list[Note] = []
        current = self._seen == self._version  # else a read of the members is on its way
        for kind, node in self._asked.items():
            found = notes.get(kind, {})
            if PROGRESS_KEY in found:
                progress[node] = found[PROGRESS_KEY]
            if current and node in self._watched and node in self.members:
                digest = alive_digest(kind, found, skipped)
                if digest != self.members[node].digest and self._may_bump(node, now):
                    stale += self.version_notes(now, node, None)
        if current:
            self._current_ms = now
        return progress, stale

    def check_due(self, now: int) -> bool:
        """Whether this node reads the whole registry now, for live nodes of an earlier
        beatless: once per ``LAYOUT_CHECK_EVERY_MS`` one member does, in turn by the ring of
        names, so that each node's bytes stay flat whatever the fleet's size."""
        ring = self._ring
        slot = now // LAYOUT_CHECK_EVERY_MS
        return slot != self._checked_slot and ring[slot % len(ring)] == self.node

    def check(self, notes: Mapping[str, str], now: int, skipped: Skipped | None) -> list[Note]:
        """Take the registry read for :meth:`check_due`: the note telling the fleet whether
        a live node of an earlier beatless (one that does not read logged history) is in
        it, to post."""
        registry = read_registry(notes, self.namespace, skipped)
        older = next((r for r in registry if not r.reads_logs), None)
        self._checked_slot, self.checked = now // LAYOUT_CHECK_EVERY_MS, True
        kind = membership_kind(self.namespace)
        self.older = None if older is None else (older.node, older.version)
        found = {"node": older and older.node, "version": older and older.version}
        # A store that keeps notes a shorter time: a lapsed check counts as one finding one.
        return [Note(kind, OLDER_KEY, json_text(found), min(LAYOUT_TTL_MS, self.version_ttl))]

    def _take_members(self, notes: Mapping[str, str], skipped: Skipped | None) -> None:
        self._whole = False
        self._update(read_members(notes, self.namespace, skipped))

    def _take_changes(self, notes: Mapping[str, str], now: int, skipped: Skipped | None) -> None:
        """Take the change notes read: every one of them when the members are read whole
        with them; else the new ones, whose nodes' kinds are read at the next sync
        (:meth:`_settle`), or the members whole at the next read when they cannot tell."""
        kind = changes_kind(self.namespace)
        self._taken = {k: at for k, at in self._taken.items() if now - at <= self.changes_ttl}
        new = {key for key in notes if key not in self._taken}
        # Only the new ones are parsed (one that cannot be read is told once): while many
        # nodes join (a rolling restart of a thousand), the notes read hold every change
        # of the last minutes.
        changes = dict(parse_each(kind, {k: notes[k] for k in new}, Change.parse, skipped))
        covered = version_nonce(self._basis) in notes
        self._taken.update(dict.fromkeys(new, now))
        self._members_ms = self._current_ms = now  # every change written before is taken
        if self._reading == "members":
            return
        nodes = {changes[key].node for key in new if key in changes}
        if not covered or len(nodes) > SETTLE_MAX or any(key not in changes for key in new):
            self._whole = True  # the changes cannot tell them
            return
        self._carried = {
            member.digest: member for key in new if (member := changes[key].member) is not None
        }
        self._settling = {node_kind(self.namespace, node): node for node in sorted(nodes)}
        if not self._settling:
            self._update(dict(self.members))

    def _settle(self, notes: Mapping[str, Mapping[str, str]], skipped: Skipped | None) -> None:
        """Take the node kinds of the nodes the changes named: as they are now, whatever
        order the changes were written in."""
        members = dict(self.members)
        unknown = False
        for kind, node in self._settling.items():
            digest = alive_digest(kind, notes.get(kind, {}), skipped)
            if digest is None:
                members.pop(node, None)  # its notes ran out: it left
            elif digest in self._carried:
                members[node] = self._carried[digest]
            elif node not in members or members[node].digest != digest:
                unknown = True  # changed again since, or a note of its lost
        self._settling, self._carried = {}, {}
        if unknown:
            self._whole = True  # the changes do not tell it: read the members whole
        else:
            self._update(members)

    def _update(self, members: dict[str, Member]) -> None:
        """The members as read under the version :attr:`_basis`."""
        self.members = members
        self._version = self._basis
        self.changed = True
        self._watched = watched(list(self.members), self.node, WATCHED)
        self._ring = sorted(set(self.members) | {self.node})
        mine = self.members.get(self.node)
        if self._posted is not None and (mine is None or mine != self._posted):
            self._rejoin = True  # dropped (its notes ran out): post again, and a version

    def _may_bump(self, node: str, now: int) -> bool:
        """A version for ``node`` at most every ``REGISTRY_EVERY_MS``: the members read
        after it drop it (or show its note as it is now)."""
        for other in [n for n, at in self._bumped.items() if now - at >= REGISTRY_EVERY_MS]:
            del self._bumped[other]
        if node in self._bumped:
            return False
        self._bumped[node] = now
        return True

    def kind_of(self, node: str) -> str:
        return node_kind(self.namespace, node)

    def records(self) -> list[NodeRecord]:
        """The members as registry records, by name."""
        return [self.members[node].record() for node in sorted(self.members)]


def older_node(text: str | None) -> tuple[str, str] | None:
    """The node an ``older`` note names, and its version (``None``: the check found none);
    one that cannot be read is taken as naming one."""
    if text is None:
        return None
    try:
        data = json.loads(text)
        node, version = data["node"], data["version"]
    except (ValueError, KeyError, TypeError):
        return ("?", "?")
    return None if node is None else (str(node), str(version))
