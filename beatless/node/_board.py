"""The node's thread that keeps its notes in the claim store (:mod:`beatless.fleet._notes`).

Every second it posts the history waiting (written by :mod:`beatless.node._history`), the
registry record and member note, the entries' notes when it is their poster
(:mod:`beatless.node._entries`), reads the controls, the run-now requests, the membership
version and a few nodes' own notes (the members it watches, the preferred claimers whose
progress it waits on), the members when their version changed
(:mod:`beatless.node._membership`), and sweeps the history for missed firings.
It WARNs (rate-limited) when live nodes disagree on the schedule fingerprint or the tzdata
version, or when a node's clock is more than ``OFFSET_WARN_MS`` from the store's.

The board reads its node through :class:`~beatless.node._view.LoopView`, a small view of
the scheduler loop, not the loop's class: the loop owns a board, and the board imports
nothing of the loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from beatless._version import __version__
from beatless.core._logtext import ERROR_LIMIT, WarnEvery, shown
from beatless.core.solar import ephem_version
from beatless.core.triggers import tzdata_version
from beatless.errors import StoreError
from beatless.fleet._controls import (
    RUN_NOW_TTL_MS,
    Control,
    controls_kind,
    json_text,
    read_controls,
    read_requests,
    refreshed,
    run_now_kind,
)
from beatless.fleet._members import CHANGES_TTL_MS, MEMBERSHIP_TTL_MS, PROGRESS_KEY
from beatless.fleet._missed import sweep_missed, sweep_part
from beatless.fleet._notes import (
    ENTRIES_TTL_MS,
    REGISTRY_EVERY_MS,
    REGISTRY_TTL_MS,
    SYNC_EVERY_MS,
    HistoryItem,
    NodeRecord,
    drift,
    entries_kind,
    entry_note,
    nodes_kind,
)
from beatless.fleet._schema import family
from beatless.node._entries import EntriesPoster
from beatless.node._history import HistoryWriter
from beatless.node._membership import Membership
from beatless.node._prefer import salt
from beatless.node._reseed import reseeded_kind
from beatless.node._view import LoopView
from beatless.node.stats import SkippedNotes, total_counts
from beatless.schedule.firing import Decision, Firing, iso
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import Note, StoreFacts

logger = logging.getLogger("beatless.fleet")


FACTS_EVERY_MS = 10_000
"""How often a node reads all of the store's settings (:meth:`ClaimStore.facts
<beatless.stores.base.ClaimStore.facts>`); at the other syncs it reads only those that can
make a running store lose claims (:meth:`~beatless.stores.base.ClaimStore.quick_facts`)."""
SEEN_KEPT_MS = 3_600_000
"""How long a node read in the registry is remembered (for re-seeding, :mod:`beatless._reseed`)."""
MISSED_SWEEP_EVERY_MS = 30_000
"""How often a node looks for missed firings in the history of its entries, in a fleet of
at most ``MISSED_SWEEPERS`` live nodes."""
MISSED_SWEEPERS = 3
MISSED_SWEEP_MAX_MS = 120_000
"""But never less often than this: a missed firing is found within two minutes, in a
fleet of any size (past 12 nodes the fleet reads each history more often than three times
in 30 s; each node's reads stay flat)."""
"""In a larger fleet each node sweeps less often (:meth:`Board.sweep_every_ms`): the fleet
reads each entry's history this many times per ``MISSED_SWEEP_EVERY_MS``, whatever its size."""
DRIFT_WARN_EVERY_MS = 300_000
SKIPPED_WARN_EVERY_MS = 300_000
"""A note skipped for not fitting its schema is told at most this often per kind and key."""


class Board(HistoryWriter):
    """One node's side of the notes: registry, entries, history (written by
    :class:`~beatless.node._history.HistoryWriter`), drift warnings.

    :meth:`sync` does what is due; :meth:`start` runs it every second in a thread of its
    own, so that the registry shows a node whose loop died or hangs as such.
    """

    def __init__(
        self,
        loop: LoopView,
        *,
        framework: str = "standalone",
        loop_alive: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(loop)
        self.framework = framework
        self.namespace = loop.schedule.namespace
        self._loop_alive = loop_alive or (lambda: True)
        self._registry_ms: int | None = None
        self._swept_ms: int | None = None
        self._sweep_phase = salt(loop.node)
        self.entries = EntriesPoster(loop.node, self._entry_notes)
        """The posts of the entries' notes (:mod:`beatless.node._entries`)."""
        self._warned = WarnEvery()
        self.skipped = SkippedNotes()
        """The notes read that did not fit their schema (:meth:`skip`)."""
        self.last_wake_ms: int | None = None
        self.restarts = 0
        self.last_failure: str | None = None
        self.last_failure_ms: int | None = None
        self.registry: list[NodeRecord] = []
        """The members as this node last read them, as registry records
        (:meth:`Member.record <beatless.fleet._members.Member.record>`)."""
        self._seen: dict[tuple[str, int], int] = {}
        """Each node (name, start) read in the registry, with when it was last read there."""
        self.reseeded: Mapping[str, str] = {}
        """The nodes' notes that they re-seeded the store (:mod:`beatless._reseed`), as
        last read (every sync)."""
        self.controls: dict[str, Control] = {}
        """The controls of this namespace by entry, as last read (every sync)."""
        self._run_now: list[Control] = []
        self._seen_requests: dict[str, int] = {}
        """Run-now requests already taken, with when they were first seen."""
        self.host = socket.gethostname()
        self.started_ms = loop.now_ms()
        self.version = __version__
        self.tzdata = tzdata_version()
        self.ephem = ephem_version()
        self.left_out: tuple[str, ...] = ()
        """Entries of the schedule this node does not run, each with a problem."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.store_facts: StoreFacts | None = None
        """The store's settings as the last sync read them (:meth:`watch_store`)."""
        self._facts_ms: int | None = None
        self._full_seen = 0
        self.members = Membership(
            self.namespace,
            loop.node,
            self._ttl(REGISTRY_TTL_MS),
            self._ttl(MEMBERSHIP_TTL_MS),
            self._ttl(CHANGES_TTL_MS),
        )
        """The fleet's members as this node last read them (:mod:`beatless.fleet._members`)."""

    def leave_out(self, names: Sequence[str]) -> None:
        """Told which entries of the schedule this node leaves out, each for a problem;
        shown in the registry record, so that ``beatless status`` names them."""
        self.left_out = tuple(names)

    def restarted(self, count: int, last: str | None, last_ms: int | None) -> None:
        """Told by the supervisor that started this node's process again: how often, and
        why and when it last died; shown in the registry record."""
        self.restarts, self.last_failure, self.last_failure_ms = count, last, last_ms

    def woke(self, now_ms: int) -> None:
        """The loop calls this at every wake."""
        self.last_wake_ms = now_ms

    def node_record(self, now_ms: int, *, counted: bool = True) -> NodeRecord:
        """The registry record at ``now_ms``; without ``counted``, no counters (what the
        member note needs, at every sync)."""
        loop = self.loop
        counters = total_counts(list(loop.stats.values())) if counted else {}
        if counted:
            counters["skipped_notes"] = self.skipped.total
        # Before the first sync judged them, the settings as the node's start read them.
        facts = self.store.watched if self.store_facts is None else self.store_facts
        return NodeRecord(
            node=loop.node,
            host=self.host,
            pid=os.getpid(),
            version=self.version,
            framework=self.framework,
            store=self.store.name,
            fingerprint=loop.schedule.fingerprint,
            tzdata=self.tzdata,
            ephem=self.ephem,
            left_out=",".join(self.left_out) or None,
            reads_logs=True,
            clock_offset_ms=loop.clockwatch.offset_ms,
            last_wake_ms=self.last_wake_ms,
            posted_ms=now_ms,
            started_ms=self.started_ms,
            loop_alive=self._loop_alive(),
            entries=len(loop.schedule.entries),
            counters=counters,
            restarts=self.restarts,
            last_failure=self.last_failure,
            last_failure_ms=self.last_failure_ms,
            store_verdict=None if facts is None else facts.summary(),
            **loop.live.record(),
        )

    def sync(self, now_ms: int | None = None) -> None:
        """Post the history waiting, and the registry record and entries when due; read
        the registry and warn about drift. A store error is logged (rate-limited) and the
        history kept for the next sync."""
        now = self.loop.now_ms() if now_ms is None else now_ms
        history, missed = self.take_pending()
        notes = self.history_notes(history) + missed
        registry_due = self._registry_ms is None or now - self._registry_ms >= REGISTRY_EVERY_MS
        record = self.node_record(now, counted=registry_due)
        if registry_due:
            notes.append(
                Note(
                    nodes_kind(self.namespace),
                    record.node,
                    record.to_json(),
                    self._ttl(REGISTRY_TTL_MS),
                )
            )
        notes.extend(self.members.own_notes(record, now, refresh=registry_due))
        progress = self.loop.preference.note(refresh=registry_due)
        if progress is not None:
            _, _, value = progress
            notes.append(Note(self.members.own_kind, PROGRESS_KEY, value, self.members.ttl))
        try:
            try:
                self._read(now, registry_due, notes)
            finally:
                self.watch_store(now)  # after the read, which carries the quick settings
            self.entries.sync(self.store, now, self.registry, self.loop.schedule.fingerprint)
            if self.sweep_due(now):
                self._swept_ms = now
                self._sweep_missed(now)
        except StoreError as exc:
            self.requeue(history, missed)
            if self._may_warn("store", 60_000, now):
                logger.warning(
                    "node %s: registry and history not written to the claim store (%s); "
                    "retried every second",
                    shown(self.loop.node, quoted=False),
                    exc,
                )

    def watch_store(self, now: int) -> None:
        """Read the store's settings again (:meth:`ClaimStore.watch
        <beatless.stores.base.ClaimStore.watch>`): all of them every ``FACTS_EVERY_MS``
        and at once after a claim or commit was refused as full, the quick ones at the
        other syncs. A refused one stops the claims until it is fixed, said at WARNING
        once a minute while it holds."""
        was = None if self.store_facts is None else self.store.refusal
        full = sum(stats.store_full for stats in list(self.loop.stats.values()))
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
                "node %s: claims stopped: %s", shown(self.loop.node, quoted=False), refusal
            )
        elif refusal is None and was is not None:
            logger.warning(
                "node %s: claims resumed: the store's settings are %s",
                shown(self.loop.node, quoted=False),
                self.store_facts.summary(),
            )

    def _entry_notes(self) -> list[Note]:
        schedule = self.loop.schedule
        kind = entries_kind(self.namespace)
        return [
            Note(
                kind, entry.name, json_text(entry_note(schedule, entry)), self._ttl(ENTRIES_TTL_MS)
            )
            for entry in schedule.entries
        ]

    def _read(self, now: int, registry_due: bool, posted: list[Note]) -> None:
        """Post ``posted``, then read the controls, the membership version and the node
        kinds of the members watched and of the nodes whose progress is wanted (every
        sync), and the members when their version changed, in one call
        (:meth:`ClaimStore.post_and_read <beatless.stores.base.ClaimStore.post_and_read>`,
        :mod:`beatless.fleet._members`)."""
        preference = self.loop.preference
        kinds = [controls_kind(self.namespace), run_now_kind(self.namespace)]
        kinds.append(reseeded_kind(self.namespace))
        wanted = preference.wanted(now) if preference.enabled else []
        kinds.extend(self.members.kinds(now, wanted))
        live = self.loop.live
        began = self.loop.now_ms()
        notes, kept = self.store.post_and_read(posted, kinds, live.wanted() if live.enabled else {})
        if posted:
            self.members.posted(now)
        if live.enabled:
            live.took(kept, began)
        self.controls = read_controls(notes[kinds[0]], self.namespace, self)
        again = [
            note
            for control in self.controls.values()
            if (note := refreshed(self.namespace, control, now, self.store.notes_live_ms))
        ]
        if again:
            self.store.post(again)
        self._take_requests(notes[kinds[1]], now)
        self.reseeded = notes[kinds[2]]
        progress, bump = self.members.took(notes, now, self)
        if self.members.check_due(now):
            kind = nodes_kind(self.namespace)
            bump += self.members.check(self.store.read_notes([kind])[kind], now, self)
        if bump:
            self.store.post(bump)
        if preference.enabled:
            for node, text in progress.items():
                preference.read({node: text}, self, self.members.kind_of(node))
        if self.members.changed:
            self.members.changed = False
            self.registry = self.members.records()
            preference.registry = self.registry
            self._drift(now)
        self._log_history(self.registry)
        if registry_due:
            self._registry_ms = now
            self._saw(self.registry, now)
            self._drift(now)

    def _drift(self, now: int) -> None:
        for problem in drift(self.registry):
            if self._may_warn(problem, DRIFT_WARN_EVERY_MS, now):
                logger.warning("namespace %s: %s", shown(self.namespace), problem)

    def _log_history(self, registry: Sequence[NodeRecord]) -> None:
        """Log the history while every live node reads logs (:meth:`fleet_reads_logs`):
        every member, and no node of an earlier beatless (which posts no member note) in
        the registry at its last check (:mod:`beatless.fleet._members`), a check made
        lately; a change, or history in place from the start, is told at INFO, naming a
        node that does not read logs."""
        members = self.members
        others_read = members.checked and members.older is None
        if not self.fleet_reads_logs(registry, others_read=others_read):
            return
        if self.logs_history:
            logger.info(
                "node %s: every live node reads logs: history written as logs",
                shown(self.loop.node, quoted=False),
            )
            return
        older = [(r.node, r.version) for r in registry if not r.reads_logs]
        if members.older is not None:
            older.append(members.older)
        if older:
            logger.info(
                "node %s: node %s (beatless %s) does not read logs: history written in place",
                shown(self.loop.node, quoted=False),
                shown(older[0][0], quoted=False),
                shown(older[0][1], quoted=False),
            )

    def _saw(self, registry: Sequence[NodeRecord], now: int) -> None:
        """Keep when each node was last read in the registry, for an hour."""
        with self._lock:
            self._seen.update(((r.node, r.started_ms), now) for r in registry)
            for node in [n for n, at in self._seen.items() if now - at > SEEN_KEPT_MS]:
                del self._seen[node]

    def known_since(self, since_ms: int) -> set[tuple[str, int]]:
        """The nodes (name, start) read in the registry at or after ``since_ms``."""
        with self._lock:
            return {node for node, at in self._seen.items() if at >= since_ms}

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
        counted by one node in the fleet (:func:`beatless.fleet._missed.sweep_missed`)."""
        loop = self.loop
        schedule = loop.schedule
        part = sweep_part(now, self.sweep_every_ms(), self._sweep_phase, loop.node, self._peers())
        swept = sweep_missed(self.store, schedule, loop.node, now, self, part=part)
        for view, occurrences in swept:
            entry = schedule.entry(view.name)
            for occurrence in occurrences:
                firing = Firing.of(entry, None, view.address, occurrence)
                decision = Decision(
                    firing, DecisionOutcome.MISSED, loop.node, now - firing.release_ms
                )
                self.record_item(firing.address, HistoryItem.of(decision))
            # Counted apart from the history, which keeps only its last firings: posted
            # with these items at the next sync.
            with self._lock:
                self._pending_missed.extend(self.missed_notes(view.address, occurrences, now))
            loop.stats[entry.name].missed += len(occurrences)
            logger.warning(
                "entry %s: %d firing(s) from %s to %s missed: no node claimed them within "
                "max_late (every node down, frozen or cut off from the store?); counted once "
                "in the fleet, by this node",
                shown(entry.name),
                len(occurrences),
                iso(min(occurrences)),
                iso(max(occurrences)),
            )

    def sweep_due(self, now: int) -> bool:
        """Whether this node sweeps for missed firings now: at its first sync, then once
        in each period of :meth:`sweep_every_ms` as placed on the clock by a phase
        derived from the node's name, so that the fleet's sweeps are spread over the
        period rather than falling together (a fleet started at once would otherwise
        sweep at once, every period). Never more than a period after the last sweep."""
        swept = self._swept_ms
        if swept is None:
            return True
        every = self.sweep_every_ms()
        phase = self._sweep_phase % every
        return (now + phase) // every != (swept + phase) // every

    def sweep_every_ms(self) -> int:
        """How often this node sweeps for missed firings: every ``MISSED_SWEEP_EVERY_MS``
        with up to ``MISSED_SWEEPERS`` live nodes running its schedule, proportionally less
        often with more (10 nodes: every 100 s), so that the history reads of the fleet's
        sweeps stay as they are with three nodes, and at least every
        ``MISSED_SWEEP_MAX_MS``; each missed firing is still counted once, by its marker.

        Only the members with this node's schedule (its fingerprint) count, as in
        :func:`~beatless.fleet._missed.sweep_part`: they share its schedule's parts. Nodes
        running another schedule in the namespace (the old one, in a rolling deploy)
        sweep theirs, and do not slow this schedule's."""
        nodes = max(len(self._peers()), MISSED_SWEEPERS)
        return min(MISSED_SWEEP_EVERY_MS * nodes // MISSED_SWEEPERS, MISSED_SWEEP_MAX_MS)

    def _peers(self) -> set[str]:
        """The members running this node's schedule, this node among them."""
        fingerprint = self.loop.schedule.fingerprint
        peers = {r.node for r in self.registry if r.fingerprint == fingerprint}
        return peers | {self.loop.node}

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
        """A note read does not fit its schema (:class:`~beatless.fleet._schema.Skipped`): count
        it once, and warn once per kind and key (at most every ``SKIPPED_WARN_EVERY_MS``)."""
        if not self.skipped.add(family(kind), kind, key, text):
            return
        if self._may_warn(f"skipped\0{kind}\0{key}", SKIPPED_WARN_EVERY_MS, self.loop.now_ms()):
            logger.warning(
                "node %s: note %s of kind %s in the claim store skipped: %s; it is not a "
                "record this version can read (written by hand, by another version or a "
                "bug?): delete it, or let its writer post it again",
                shown(self.loop.node, quoted=False),
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
            target=self._run, name=f"beatless-board-{self.loop.node}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.sync()
            except Exception:
                if self._may_warn("exception", 300_000, self.loop.now_ms()):
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
