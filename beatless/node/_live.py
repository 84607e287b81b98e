"""The node's view of live entries (issue 24): which entry is in force at each occurrence.

The effective schedule for an occurrence ``o`` is the code entries plus the live entries
of the revision in force at ``o`` (the latest whose fence is at or before ``o``:
:func:`beatless.live.in_force`), all by the nominal occurrence, never by the jittered
release. For each name, this view keeps the *spans* of its definitions: from a fence on,
the entry a revision put (or, after a delete, nothing, or the code's entry when the live
one overrode it). The timeline asks it:

* :meth:`LiveView.current` — is this entry the one in force at this occurrence? A firing
  built under an older definition is dropped (rules 1, 3, 5); a definition's own
  occurrences start at its fence (rule 2); an occurrence present in both has the same
  address and occurrence, so the same firing id, claimed once (rule 4);
* :meth:`LiveView.confirms` — may this node claim the occurrence yet? Only after a read
  of the head that began later than ``o - PROPAGATION_MS + READ_SLACK_MS`` on the store's
  clock (node clock + the measured offset): every revision in force at ``o`` had been
  committed by then, since no fence is sooner than its commit + ``PROPAGATION_MS``. A
  node that could not read the head waits, and decides ``stale_schedule`` when the
  firing goes late (rule 6).

Reading: the board reads the head and the revision after the last one known in the same
call as its other notes (:meth:`~beatless.stores.base.ClaimStore.read_synced`, one round
trip on memory, SQLite, Redis and PostgreSQL) and fetches only the revisions it lacks:
work per change, not per entry. Revisions are handed to the loop, which applies them
(:meth:`LiveView.apply`) and plans the new definitions in its timeline; only the loop
reads the spans.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from beatless.core._logtext import shown
from beatless.errors import BeatlessError
from beatless.live._ledger import PROPAGATION_MS, READ_SLACK_MS, Ledger
from beatless.live.codec import entry_from_json
from beatless.live.revisions import Revision, canonical_json
from beatless.schedule.entry import Entry, Schedule
from beatless.stores.base import ClaimStore

logger = logging.getLogger("beatless.node.scheduler")

CONFIRM_MS = PROPAGATION_MS - READ_SLACK_MS
"""A node claims an occurrence ``o`` only after a read of the head that began later than
``o - CONFIRM_MS`` on the store's clock."""
WAIT_MS = 250
"""A firing waiting for a fresher read of the head is looked at again this often."""
BEFORE_ALL = -(2**62)
HASH_SHOWN = 12
"""Hex digits of the live state's hash in a registry record and the fingerprint."""


@dataclass(frozen=True, slots=True)
class Span:
    """From ``start_ms`` (a fence) on, ``entry`` is the definition of a name (``None``:
    it has none), as revision ``revision`` left it."""

    start_ms: int
    entry: Entry | None
    revision: int


class StateDigest:
    """A hash of the live entries kept up to date per change (work per change, not per
    entry): the sum, modulo 2**256, of the SHA-256 of each name with its entry JSON."""

    def __init__(self) -> None:
        self._each: dict[str, int] = {}
        self._sum = 0

    def change(self, name: str, entry: Mapping[str, Any] | None) -> None:
        self._sum -= self._each.pop(name, 0)
        if entry is not None:
            text = canonical_json([name, dict(entry)]).encode()
            self._each[name] = int.from_bytes(hashlib.sha256(text).digest(), "big")
            self._sum += self._each[name]

    def hexdigest(self) -> str:
        return f"{self._sum % 2**256:064x}"


class LiveView:
    """One node's live revisions and the spans they make (see the module docstring).

    ``offset_ms`` gives the node's measured offset to the store's clock (``None``: not
    measured yet; a read made then is not placed on the store's clock, so it confirms no
    occurrence: a node whose clock is ahead would otherwise take an old read for a fresh
    one, and claim an occurrence past a fence it has not read). With ``enabled`` false,
    every entry is current and every occurrence confirmed: the node runs its code entries
    only."""

    def __init__(
        self,
        store: ClaimStore,
        schedule: Schedule,
        *,
        enabled: bool,
        now_ms: Callable[[], int],
        offset_ms: Callable[[], int | None],
        arrived: Callable[[], None] = lambda: None,
        refusing: Callable[[], bool] = lambda: False,
    ) -> None:
        self.enabled = enabled
        self._refusing = refusing
        """Whether the node claims nothing (its clock is off the store's): its firings are
        decided ``clock_skew``, not held for a read."""
        self._arrived = arrived
        """Called when a read finds a revision the loop has not applied: it wakes the
        loop, so a revision is applied within a read of its commit, not a read and a
        sleep."""
        self._schedule = schedule
        self._ledger = Ledger(store, schedule.namespace)
        self._store = store
        self._now_ms = now_ms
        self._offset_ms = offset_ms
        self._code = {e.name: e for e in schedule.entries}
        self._spans: dict[str, list[Span]] = {}
        self._starts: dict[str, list[int]] = {}
        self._names: set[str] = set()
        """The names of the live entries now (their JSON is not kept: the spans hold their
        entries, the digest their hashes)."""
        self._overridden: set[str] = set()
        self._digests = StateDigest()
        self._lock = threading.Lock()
        self._pending: dict[int, Revision] = {}
        self._read_ms: int | None = None
        """Store clock at the start of the last successful read (board or loop)."""
        self.confirmed_ms: int | None = None
        """Store clock at the start of the last read whose revisions are applied."""
        self.revision = 0
        """The last revision applied by the loop."""
        self._refuted: int | None = None
        """The revision of the last claim the store answered stale."""
        self.fence_ms: int | None = None
        self.committed_ms: int | None = None
        self.applied_lag_ms: int | None = None
        """Store-clock milliseconds from the last revision's commit to its application."""
        self.state_hash = self._digests.hexdigest()
        self.overrides: tuple[str, ...] = ()
        """Live entries that override a code entry's name (reported as drift)."""

    # -- reading (board thread, or the loop when its read is too old) ---------------------

    def wanted(self) -> dict[str, list[str]]:
        """The kept notes a sync reads: the head and the revision after the last known."""
        known = max(self.revision, max(self._pending, default=0))
        return {self._ledger.head_kind: ["head"], self._ledger.revisions_kind: [str(known + 1)]}

    def took(self, kept: Mapping[str, Mapping[str, str]], began_node_ms: int) -> None:
        """Take what a sync read (:meth:`wanted`), read at ``began_node_ms`` on the node's
        clock; fetch the revisions it lacks. A store error leaves the last read standing."""
        known = max(self.revision, max(self._pending, default=0))
        head_text = kept.get(self._ledger.head_kind, {}).get("head")
        head = int(json.loads(head_text)["number"]) if head_text else 0
        found: dict[int, Revision] = {}
        following = kept.get(self._ledger.revisions_kind, {}).get(str(known + 1))
        if following is not None:
            data = json.loads(following)
            if int(data.get("parts", 1)) == 1:
                found[known + 1] = Revision.from_json(data)
        last = max(head, known + 1 if following is not None else known)
        missing = [n for n in range(known + 1, last + 1) if n not in found]
        for revision in self._ledger.read(missing):
            found[revision.number] = revision
        offset = self._offset_ms()
        with self._lock:
            self._pending.update(found)
            if offset is not None:  # else the read's instant on the store's clock is unknown
                self._read_ms = began_node_ms + offset
        if found:
            self._arrived()

    def read(self) -> None:
        """Read the head now (one call): the loop's own read, when the board's is older
        than a due occurrence allows."""
        began = self._now_ms()
        _, kept = self._store.read_synced([], self.wanted())
        self.took(kept, began)

    # -- applying (the loop) -------------------------------------------------------------

    def apply(self) -> list[tuple[Entry, int]]:
        """Apply the revisions read, in number order and without a gap; the new live
        definitions the timeline must plan (each from its fence)."""
        if not self.enabled:
            return []
        if not self._pending and self._read_ms in (None, self.confirmed_ms):
            return []  # nothing read since the last wake (the board's next read waits)
        with self._lock:
            pending, read_ms = self._pending, self._read_ms
            self._pending = {}
        pending = {n: r for n, r in pending.items() if n > self.revision}
        fresh: list[tuple[Entry, int]] = []
        number = self.revision + 1
        while number in pending:
            fresh += self._apply(pending.pop(number))
            number += 1
        # A read made while this apply ran (the board's, which saw neither the revisions
        # taken out above nor the new number yet) may have read them again: applied, they
        # are no gap, and kept they would hold the confirmation back for good.
        pending = {n: r for n, r in pending.items() if n > self.revision}
        if pending:  # a gap: kept for the next read to fill
            with self._lock:
                self._pending.update(pending)
        elif read_ms is not None:
            self.confirmed_ms = read_ms
        return fresh

    def _apply(self, revision: Revision) -> list[tuple[Entry, int]]:
        fresh = []
        for change in revision.changes:
            entry = None if change.entry is None else self._bind(change.name, change.entry)
            if entry is None:
                entry = self._code.get(change.name)  # a delete hands the name back to code
            elif entry.name not in self._code or entry is not self._code[entry.name]:
                fresh.append((entry, revision.fence_ms))
            spans = self._spans.setdefault(change.name, self._first_spans(change.name))
            spans.append(Span(revision.fence_ms, entry, revision.number))
            self._starts.setdefault(change.name, [s.start_ms for s in spans[:-1]])
            self._starts[change.name].append(revision.fence_ms)
        for change in revision.changes:  # work per change, not per entry
            self._digests.change(change.name, change.entry)
            if change.entry is None:
                self._names.discard(change.name)
                self._overridden.discard(change.name)
            else:
                self._names.add(change.name)
                if change.name in self._code:
                    self._overridden.add(change.name)
        self.revision = revision.number
        self.fence_ms, self.committed_ms = revision.fence_ms, revision.committed_ms
        now = self._now_ms() + (self._offset_ms() or 0)
        self.applied_lag_ms = max(now - revision.committed_ms, 0)
        self.state_hash = self._digests.hexdigest()
        self.overrides = tuple(sorted(self._overridden))
        logger.debug("live revision %d applied (fence %d)", revision.number, revision.fence_ms)
        return fresh

    def _first_spans(self, name: str) -> list[Span]:
        code = self._code.get(name)
        return [] if code is None else [Span(BEFORE_ALL, code, 0)]

    def _bind(self, name: str, data: Mapping[str, Any]) -> Entry | None:
        """The entry of ``data``, bound to the schedule's time zone and checked as code
        entries are; a bad one is logged and treated as absent."""
        try:
            entry = entry_from_json(dict(data))
            bound = Schedule(
                [entry], namespace=self._schedule.namespace, timezone=self._schedule.timezone
            )
            return bound.fitted(self._store.remembers).entries[0]
        except BeatlessError as exc:
            logger.error("live entry %s not scheduled: %s", shown(name), exc)  # noqa: TRY400 - the reason is the message
            return None

    # -- what the timeline asks -----------------------------------------------------------

    def entry_at(self, name: str, occurrence_ms: int) -> Entry | None:
        """The definition of ``name`` in force at ``occurrence_ms`` (``None``: none)."""
        spans = self._spans.get(name)
        if spans is None:
            return self._code.get(name)
        index = bisect.bisect_right(self._starts[name], occurrence_ms) - 1
        return spans[index].entry if index >= 0 else None

    def revision_at(self, entry: Entry, occurrence_ms: int) -> int | None:
        """The live revision that made ``entry`` the definition in force at
        ``occurrence_ms`` (``None``: a code entry no revision touched, or ``entry`` is not
        the one in force then)."""
        spans = self._spans.get(entry.name)
        if spans is None:
            return None
        index = bisect.bisect_right(self._starts[entry.name], occurrence_ms) - 1
        if index < 0 or spans[index].entry is not entry or spans[index].revision == 0:
            return None
        return spans[index].revision

    def current(self, entry: Entry, occurrence_ms: int) -> bool:
        """Whether ``entry`` is the definition in force at ``occurrence_ms``."""
        if entry.name not in self._spans:
            return True
        return self.entry_at(entry.name, occurrence_ms) is entry

    def ended(self, entry: Entry, occurrence_ms: int) -> bool:
        """Whether a live definition is over at ``occurrence_ms`` (a later revision took
        its place at or before it): its occurrences from then on are not looked at."""
        spans = self._spans.get(entry.name, ())
        mine = [i for i, span in enumerate(spans) if span.entry is entry]
        if not mine or mine[-1] + 1 >= len(spans):
            return False
        return spans[mine[-1] + 1].start_ms <= occurrence_ms

    def confirms(self, occurrence_ms: int) -> bool:
        """Whether this node knows every revision in force at ``occurrence_ms``."""
        if not self.enabled or self._refusing():
            return True
        return self.confirmed_ms is not None and self.confirmed_ms > occurrence_ms - CONFIRM_MS

    def stale(self) -> bool:
        """The store answered a claim of this node stale: it knows a revision newer than
        :attr:`revision`, in force at the claim's occurrence (rule 6, in the claim). No
        occurrence is confirmed until a read of the head is applied (the loop reads at
        its next wake). Whether to claim again at once: not when a claim of the same
        revision was answered so before (a read since brought nothing newer), so that a
        head this node cannot follow is not asked in a loop."""
        again = self._refuted != self.revision
        self._refuted = self.revision
        self.confirmed_ms = None
        return again

    def needs_read(self, now_ms: int) -> bool:
        """Whether the last read is too old for an occurrence due now: the loop reads."""
        if not self.enabled:
            return False
        store_now = now_ms + (self._offset_ms() or 0)
        return self.confirmed_ms is None or self.confirmed_ms <= store_now - CONFIRM_MS

    def record(self) -> dict[str, Any]:
        """What the node's registry record says of its live entries
        (:class:`~beatless.fleet._notes.NodeRecord`: ``live_revision`` ...)."""
        if not self.enabled:
            return {}
        return {
            "live_revision": self.revision,
            "live_hash": self.state_hash[:HASH_SHOWN],
            "live_lag_ms": self.applied_lag_ms,
            "live_overrides": ",".join(self.overrides) or None,
        }

    def live_entries(self) -> Sequence[str]:
        """The names of the live entries now."""
        return tuple(sorted(self._names))
