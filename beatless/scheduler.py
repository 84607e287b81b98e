"""The scheduler loop: one per node, no leader, no Celery or Dramatiq import.

Every node computes the same occurrences, derives the same firing ids and offsets, and
at each firing's release asks the claim store to decide. Only a won firing is enqueued.

* Occurrences are computed once per distinct trigger and shared by every entry and
  tenant that uses it; the firings waiting for their release live in one heap.
* The firings due at one wake go to one :class:`~beatless.dispatch.Dispatcher`, the
  loop's only seam to the store and the broker (two-phase or atomic); every firing it
  is handed comes back decided or retried, and any error retries what it left.
* The loop never sleeps past the next release nor longer than one second, and re-reads
  the wall clock at every wake, so a corrected clock or a suspended VM is noticed.
* A firing more than ``max_late`` behind the node's clock is skipped and counted late,
  in bulk and before any store call, so an overloaded node drops old work first and
  keeps the next occurrences on time; one WARNING per occurrence says what was dropped.
* The node measures its offset to the store's clock at start and every minute, and
  claims nothing while it is over the store's tolerance.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from beatless._board import Board
from beatless._clockwatch import ClockWatch
from beatless._controls import manual_firing
from beatless._fanout import MAX_TENANTS, FanOut, prepare_ahead_ms
from beatless._logtext import ERROR_LIMIT, WarnEvery, shown
from beatless._notes import HISTORY_OUTCOMES, REGISTRY_EVERY_MS, SENT, HistoryItem
from beatless._prefer import CLAIM, DELEGATE, LADDER_MS, Preference, Ranked, fits
from beatless._reseed import Reseeder
from beatless.dispatch import (
    DEFAULT_LEASE,
    Dispatcher,
    Enqueue,
    TwoPhase,
    lease_ms_of,
    send_deadline_s,
)
from beatless.durations import DurationLike
from beatless.entry import Entry, Schedule
from beatless.errors import (
    ConfigError,
    ScheduleError,
    StoreError,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
)
from beatless.firing import Decision, Firing, iso
from beatless.problems import limits
from beatless.stats import EntryStats
from beatless.stores.base import TOLERANCE_MS, ClaimStore, Note, NoteItem, Verdict
from beatless.triggers import Trigger

logger = logging.getLogger(__name__)
decisions_logger = logging.getLogger("beatless.decisions")
"""Each firing's decision (won, lost, held, late, ...), at DEBUG: turn it on with
``logging.getLogger("beatless.decisions").setLevel(logging.DEBUG)``."""

__all__ = ["DEFAULT_LEASE", "Decision", "Enqueue", "Scheduler", "send_deadline_s"]

MAX_SLEEP_MS = 1_000
EXPAND_AHEAD_MS = 2_000
"""Occurrences are expanded into firings this long before they are due."""
RETRY_MS = 500
"""A firing whose claim or enqueue failed is tried again after this long, until late."""
FAN_OUT_STEP_MS = 20
"""A fan-out hands out its firings at most this often: a million tenants over ten minutes
release 1,667 firings a second, and one wake (one claim, one commit) per release would
make each round trip carry two or three of them."""
MAX_BATCH = 5_000
"""At most this many firings go to the dispatcher in one wake; the rest follow at once."""
PREPARE_AHEAD_MS = 1_000
"""A dispatcher that builds its messages ahead (:attr:`Dispatcher.prepares_ahead`) is
handed the firings due within this long, while the loop would sleep: at a burst, the
work left at the instant is the claim and the send."""
PREPARE_IDLE_MS = 20
"""Firings are prepared ahead only while the next wake is at least this far: a loop
with releases every few milliseconds has no burst to prepare for."""
PREPARE_CHUNK = 500
"""Firings prepared per call, so that the loop wakes on time (a few tens of ms)."""
PREPARED_MAX = 2 * MAX_BATCH
"""At most this many firings wait prepared."""
PREPARED_STALE_MS = 60_000
"""What was prepared for a firing released this long ago and not dispatched (decided
late, paused or delegated) is dropped."""
WARN_EVERY_MS = 10_000
"""One WARNING per kind of trouble, entry and occurrence at most this often."""
SETTLE_MS = 1_000
"""A count of trouble is told once no more of it came for this long."""
SUMMARY_EVERY_MS = 60_000
"""How often a node logs its counts at INFO."""
TENANTS_WARN_EVERY_MS = 60_000
"""One ERROR per entry at most this often while its tenants callable fails."""
FOREIGN_WARN_EVERY_MS = 600_000
"""One WARNING per entry at most this often for firings lost to a claim of another task."""

_WARNINGS = {
    "late": "more than max_late behind this node's clock, skipped (node overloaded, frozen, "
    "or its clock jumped)",
    "late_store": "refused by the store as late: the claim reached it more than max_late + "
    "10s after the occurrence (slow network, or this node's clock is behind)",
    "early": "refused by the store as early: released more than 10s ahead of the store's "
    "clock (this node's clock is ahead)",
    "forgotten": "not sent: the claim store lost its memory (restarted without persistence?) "
    "after they were released, so they may already have been enqueued",
    "corrupt": "not sent: the store holds a record for them that it cannot read",
    "missed": "missed: the claim store refused every claim of them until they were late "
    "(full, or its settings refused: see its WARNING), so this node could not judge them; "
    "not sent by this node",
}
"""Outcomes an operator must hear about, and what they mean."""


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A due firing this node left to a node ranked above it, to look at again."""

    firing: Firing


@dataclass(slots=True)
class _Group:
    """The entries that share one trigger, and where that trigger has got to."""

    trigger: Trigger
    entries: list[Entry]
    occurrences: Iterator[int]

    @property
    def reach_ms(self) -> int:
        """How far back an occurrence of this trigger may still be claimable."""
        return max(entry.max_late_ms for entry in self.entries)


def _known(tenants: object) -> tuple[str, ...]:
    return tenants if isinstance(tenants, tuple) else ()


def default_node_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def log_enqueue(firing: Firing) -> None:
    """The enqueue of a node with no broker: log what would have been sent."""
    logger.info(
        "enqueue %s entry=%s tenant=%s task=%s",
        firing.id,
        shown(firing.entry.name),
        shown(firing.tenant),
        shown(firing.entry.task, quoted=False),
    )


class _Trouble:
    """Counts of the outcomes an operator must hear about, per (outcome, entry name,
    occurrence): told in one WARNING once no more came for a second (or after
    ``WARN_EVERY_MS``, for trouble that goes on), so that one dropped occurrence is
    one line with its whole count."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, int], list[int]] = {}

    def add(self, key: tuple[str, str, int], count: int, now: int) -> None:
        held = self._counts.setdefault(key, [0, now, now])
        held[0] += count
        held[2] = now

    def settled(self, now: int) -> list[tuple[tuple[str, str, int], int]]:
        """The counts to tell now, each forgotten once told."""
        ready = [
            key
            for key, (_, first, last) in self._counts.items()
            if now - last >= SETTLE_MS or now - first >= WARN_EVERY_MS
        ]
        return [(key, self._counts.pop(key)[0]) for key in ready]


def _dispatcher(
    store: ClaimStore | Dispatcher,
    enqueue: Enqueue | None,
    lease: DurationLike,
    monotonic: Callable[[], float],
) -> Dispatcher:
    """The dispatcher a scheduler calls: ``store`` when it is one, else the two-phase one
    over the claim store ``store``."""
    if isinstance(store, Dispatcher):
        return store
    if isinstance(store, ClaimStore):
        return TwoPhase(store, enqueue or log_enqueue, lease=lease, monotonic=monotonic)
    raise ConfigError(f"store must be a ClaimStore or a Dispatcher, got {store!r}")


class Scheduler:
    """The loop of one node. Drive it with :meth:`run` / :meth:`start`, or :meth:`tick`.

    ``store`` is a :class:`~beatless.stores.base.ClaimStore`, used two-phase with
    ``enqueue`` (called with each won firing; raising means the enqueue failed, and the
    claim is released so that another node or the next wake retries it), or a
    :class:`~beatless.dispatch.Dispatcher` that claims and enqueues on its own (the
    atomic paths of the integrations), in which case ``enqueue`` is not used.
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        store: ClaimStore | Dispatcher,
        enqueue: Enqueue | None = None,
        clock: Callable[[], float] = time.time,
        node: str | None = None,
        on_decision: Callable[[Decision], None] | None = None,
        lease: DurationLike = DEFAULT_LEASE,
        monotonic: Callable[[], float] = time.monotonic,
        framework: str = "standalone",
        preferred: bool = True,
    ) -> None:
        self.schedule = schedule
        self.dispatcher = _dispatcher(store, enqueue, lease, monotonic)
        self.lease_ms = getattr(self.dispatcher, "lease_ms", lease_ms_of(lease))
        self.store: ClaimStore = self.dispatcher.store
        self.clock = clock
        self.node = node or default_node_name()
        self.on_decision = on_decision
        self._check_store()
        self.stats = {entry.name: EntryStats() for entry in schedule.entries}
        self._entries = {entry.name: entry for entry in schedule.entries}
        self._caught_up: dict[str, list[int]] = {}
        """Per entry: occurrences left by the catch-up policy, first and last, not said yet."""
        self._coalesced: dict[str, tuple[int, int]] = {}
        """Per catch-up firing: the first and last occurrence ``latest`` coalesced into it,
        told in its history item (so they are not taken for missed)."""
        self.clockwatch = ClockWatch(self.store, clock, self.node)
        self._heap: list[tuple[int, int, Any]] = []
        self._seq = itertools.count()
        self._tenants: dict[str, tuple[str, ...]] = {}
        self._held: set[str] = set()
        self._open: dict[str, Firing] = {}
        self._sent: dict[str, tuple[Firing, str]] = {}
        """Firings of the wake whose message was sent and that are not decided yet."""
        self._unjudged: set[str] = set()
        """Firings whose claim the store refused (full, or its settings refused): decided
        ``missed`` rather than ``late`` if never claimed (:meth:`decide`)."""
        self._decisions: list[Decision] = []
        self._trouble = _Trouble()
        self._warned = WarnEvery()
        self._summary = Counter[str]()
        self._summary_ms: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_ms = self.now_ms()
        self.preference = Preference(
            self.node, schedule.fingerprint, schedule.namespace, enabled=preferred
        )
        """Which firings this node claims first, and which it leaves to others
        (:mod:`beatless._prefer`)."""
        self._ranked: dict[str, Ranked] = {}
        """Where this node ranks for each firing it left to others, to look at again."""
        self._prepared: dict[str, tuple[int, object]] = {}
        """What the dispatcher built ahead, by firing id, with the firing's release."""
        self._prepared_swept_ms = 0
        self._ladder = {e.name: fits(e.jitter_ms, e.max_late_ms) for e in schedule.entries}
        if preferred:
            self._say_ladder()
        self.board = Board(self, framework=framework, loop_alive=self.loop_alive)
        """The registry record and history this node keeps in the store (:mod:`beatless._board`)."""
        self.reseeder = Reseeder(
            self.store,
            node=(self.node, self.board.started_ms),
            namespace=schedule.namespace,
            lease_ms=self.lease_ms,
            reach_ms=max((e.max_late_ms for e in schedule.entries), default=0)
            + TOLERANCE_MS
            + REGISTRY_EVERY_MS,
            known_since=self.board.known_since,
            notes=lambda: self.board.reseeded,
        )
        """What this node sent, written back when the store loses its memory
        (:mod:`beatless._reseed`)."""
        self.store.holds_off = self.reseeder.enabled
        self._reseeding: set[str] = set()
        """Firings the store held off while the nodes re-seed it: ``forgotten`` if late."""
        self._plan(self._start_ms)

    def _say_ladder(self) -> None:
        """Name the entries every node claims, since the preferred claimer's ladder does not
        fit within their max_late."""
        every = [name for name, fit in self._ladder.items() if not fit]
        if every:
            logger.info(
                "%d entries claimed by every node, not by a preferred one: their jitter + "
                "%dms (the preferred claimer's ladder) exceed their max_late: %s",
                len(every),
                LADDER_MS,
                ", ".join(shown(name) for name in every[:10]) + (", ..." * (len(every) > 10)),
            )

    def _check_store(self) -> None:
        errors = limits(self.schedule) + self.schedule.check_store(
            self.store.remembers,
            self.store.name,
            run_leases=self.store.holds_run_leases,
            lengthen=self.store.lengthen_memory,
        )
        if errors:
            raise ScheduleError("; ".join(errors), errors)
        facts = self.store.watch()  # read again at every sync (beatless._board)
        if self.store.refusal is not None:
            raise StoreRefused(self.store.refusal)
        # What a fault would cost is said once per start, at INFO: a Redis kept without
        # persistence on purpose must not be a WARNING at every worker's start. The
        # verdict stays in the registry record, `status` and `check --store`.
        for fact in facts.facts:
            if fact.verdict is not Verdict.OK:
                logger.info(
                    "%s: %s %s: %s",
                    shown(facts.store, quoted=False),
                    shown(fact.name, quoted=False),
                    fact.value,
                    fact.why,
                )
        if isinstance(self.dispatcher, TwoPhase):
            self._warn_no_takeover()

    def _warn_no_takeover(self) -> None:
        """Two-phase: a winner that dies before commit is replaced when its lease runs out,
        but only while the firing is not late. Say so for entries where it never is."""
        for entry in self.schedule.entries:
            if entry.jitter_ms + self.lease_ms + RETRY_MS >= entry.max_late_ms:
                logger.warning(
                    "entry %s: jitter %dms + lease %dms leave no time within max_late %dms to "
                    "take over a firing whose winner died before commit; shorten the lease "
                    "or raise max_late",
                    shown(entry.name),
                    entry.jitter_ms,
                    self.lease_ms,
                    entry.max_late_ms,
                )

    def now_ms(self) -> int:
        """The node's clock, in epoch milliseconds rounded down (never early)."""
        return math.floor(self.clock() * 1_000)

    # -- planning -------------------------------------------------------------------

    def _plan(self, now_ms: int) -> None:
        """Group entries by trigger and queue each trigger's first claimable occurrence."""
        groups: dict[Trigger, _Group] = {}
        for entry in self.schedule.entries:
            group = groups.get(entry.trigger)
            if group is None:
                group = groups[entry.trigger] = _Group(entry.trigger, [], iter(()))
            group.entries.append(entry)
        for group in groups.values():
            group.occurrences = group.trigger.after(now_ms - group.reach_ms)
            self._queue_next(group)

    def _queue_next(self, group: _Group) -> int | None:
        """Queue the group's next occurrence, and return it."""
        occurrence = next(group.occurrences, None)
        if occurrence is not None:
            self._push(occurrence - self._expand_ahead_ms(group), (group, occurrence))
        return occurrence

    def _expand_ahead_ms(self, group: _Group) -> int:
        """Big fan-outs start preparing early enough to be ready at their occurrence."""
        widest = max(len(self._tenants.get(e.name) or _known(e.tenants)) for e in group.entries)
        return EXPAND_AHEAD_MS + prepare_ahead_ms(widest)

    def _push(self, at_ms: int, item: Any) -> None:
        heapq.heappush(self._heap, (at_ms, next(self._seq), item))

    def _expand(self, group: _Group, occurrence: int) -> None:
        """Turn one occurrence of a trigger into the firings of every entry and tenant."""
        following = self._queue_next(group)
        for entry in group.entries:
            if occurrence < self._start_ms - entry.max_late_ms:
                continue  # before this node's time: not ours to judge
            if occurrence < self._start_ms and self._not_caught_up(entry, occurrence, following):
                continue
            base = self.schedule.address(entry)
            tenants = self._tenants_of(entry)
            if tenants is None:
                firing = Firing.of(entry, None, base, occurrence)
                left = self._caught_up.get(entry.name)
                if occurrence < self._start_ms and left is not None:
                    self._coalesced[firing.id] = (left[1], left[2])
                self._push_firing(firing)
            elif len(tenants) > MAX_TENANTS:
                logger.error(
                    "entry %s: %d tenants, over the %d one fan-out can hold; occurrence %s skipped",
                    shown(entry.name),
                    len(tenants),
                    MAX_TENANTS,
                    iso(occurrence),
                )
            elif tenants:
                self._push(self.now_ms(), FanOut(entry, base, occurrence, tenants))

    def _not_caught_up(self, entry: Entry, occurrence: int, following: int | None) -> bool:
        """Whether the entry's catch-up policy leaves this occurrence, from before the
        node's start, unclaimed: ``none`` leaves every such occurrence, ``latest`` all but
        the last of them (the others are coalesced into it), ``all`` none. Counted as
        ``catch_up_skipped`` and said once per entry (:meth:`_say_catch_up`)."""
        policy = entry.catch_up
        if policy == "all":
            return False
        if policy == "latest" and (following is None or following >= self._start_ms):
            return False
        known = entry.tenants if isinstance(entry.tenants, tuple) else None
        count = len(known or self._tenants.get(entry.name) or (None,))
        self.stats[entry.name].catch_up_skipped += count
        self._summary["catch_up_skipped"] += count
        skipped = self._caught_up.setdefault(entry.name, [0, occurrence, occurrence])
        skipped[0] += 1
        skipped[2] = occurrence
        return True

    def _say_catch_up(self) -> None:
        """One INFO line per entry whose catch-up policy left occurrences unclaimed."""
        for name, (count, first, last) in self._caught_up.items():
            entry = self._entries[name]
            kept = "the latest is claimed" if entry.catch_up == "latest" else "none is claimed"
            logger.info(
                "entry %s: %d occurrence(s) from %s to %s, before this node started, left "
                "unclaimed by catch_up=%r (%s); counted as catch_up_skipped",
                shown(name),
                count,
                iso(first),
                iso(last),
                entry.catch_up,
                kept,
            )
        self._caught_up.clear()

    def _skip_late(self, group: _Group, occurrence: int | None, now: int) -> int | None:
        """After a clock jump or a long freeze, skip in one step all but the last of the
        occurrences that are late for every entry of the group; count them, say so once."""
        horizon = now - group.reach_ms
        skipped = 0
        while occurrence is not None and occurrence <= horizon:
            following = next(group.occurrences, None)
            if following is None or following > horizon:
                # The last late one is expanded and reported firing by firing.
                if following is not None:
                    group.occurrences = itertools.chain((following,), group.occurrences)
                break
            skipped += 1
            occurrence = following
        if skipped:
            for entry in group.entries:
                known = entry.tenants if isinstance(entry.tenants, tuple) else None
                fanout = len(known or self._tenants.get(entry.name) or (None,))
                self.stats[entry.name].late_node += skipped * fanout
                self._summary["late"] += skipped * fanout
                logger.warning(
                    "entry %s: %d occurrence(s) of %s were more than max_late behind the "
                    "clock (frozen node or clock jump) and were skipped as late",
                    shown(entry.name),
                    skipped,
                    group.trigger.describe(),
                )
        return occurrence

    def _push_firing(self, firing: Firing) -> None:
        self._push(firing.release_ms, firing)

    def _tenants_of(self, entry: Entry) -> tuple[str, ...] | None:
        if entry.tenants is None:
            return None
        try:
            tenants = entry.tenant_list()
        except Exception:
            if self._may_warn(f"tenants {entry.name}", TENANTS_WARN_EVERY_MS):
                logger.exception(
                    "entry %s: the tenants callable failed; using the last list it returned "
                    "(said at most once a minute while it fails)",
                    shown(entry.name),
                )
            return self._tenants.get(entry.name, ())
        self._tenants[entry.name] = tenants  # type: ignore[assignment]
        return tenants

    # -- one wake -------------------------------------------------------------------

    def tick(self) -> list[Decision]:
        """One wake: expand what is near, then claim and enqueue what is due now."""
        now = self.now_ms()
        self.board.woke(now)
        self.preference.adopt(now)
        self._take_run_now(now)
        due = self._drop_paused(self._prefer(self._pop_due(now), now), now)
        if due and not self.clockwatch.check(now):
            for firing in due:
                self.decide(firing, "clock_skew")
        elif due:
            self._dispatch(due)
        else:
            self.dispatcher.settle(self)  # a failed commit is retried on every wake
        if self.reseeder.step(now):
            self._held.clear()  # a node that sent one of them wrote it back
        if self._caught_up:
            self._say_catch_up()
        self.preference.advance(now, self.next_wake_ms())
        self._warn_trouble(now)
        self._log_summary(now)
        decisions, self._decisions = self._decisions, []
        return decisions

    def _prefer(self, due: list[Firing], now: int) -> list[Firing]:
        """The due firings this node claims now; the others are left to the node preferred
        for them, or looked at again later (:mod:`beatless._prefer`)."""
        if not due or not self.preference.enabled or len(self.preference.view.nodes) == 1:
            return due
        claimed = []
        for firing in due:
            ranked = self._ranked.pop(firing.id, None)
            ladder = self._ladder[firing.entry.name] and not firing.manual
            placed, ranked = self.preference.place(
                firing.id, firing.release_ms, now, ladder=ladder, ranked=ranked
            )
            if placed == CLAIM:
                claimed.append(firing)
            elif placed == DELEGATE:
                self.decide(firing, "delegated")
            else:
                if ranked is not None:
                    self._ranked[firing.id] = ranked
                self._push(placed, _Deferred(firing))
        return claimed

    def _pop_due(self, now: int) -> list[Firing]:
        """The firings due now, at most ``MAX_BATCH``; the late ones are dropped at once,
        without a store call, however many there are."""
        due: list[Firing] = []
        later: list[tuple[int, Any]] = []  # back into the heap after this wake
        while self._heap and self._heap[0][0] <= now and len(due) < MAX_BATCH:
            _, _, item = heapq.heappop(self._heap)
            if isinstance(item, _Deferred):
                if now - item.firing.occurrence_ms > item.firing.entry.max_late_ms:
                    self._ranked.pop(item.firing.id, None)
                    self.decide(item.firing, "delegated")  # left to others; missed if not
                else:
                    due.append(item.firing)
            elif isinstance(item, Firing):
                if now - item.occurrence_ms > item.entry.max_late_ms:
                    self.decide(item, "late")
                else:
                    due.append(item)
            elif isinstance(item, FanOut):
                self._take_fan_out(item, now, due, later)
            else:
                group, occurrence = item
                occurrence = self._skip_late(group, occurrence, now)
                if occurrence is not None:
                    self._expand(group, occurrence)
        for at_ms, item in later:
            self._push(at_ms, item)
        return due

    def _drop_paused(self, due: list[Firing], now: int) -> list[Firing]:
        """Decide the firings of paused entries ``paused``: not claimed, not missed.

        Only firings this node would claim now get here (after :meth:`_prefer`): a firing
        left to the node preferred for it is looked at again at this node's rung, and
        delegated if that node's progress shows it dealt with it (sent it, or found it
        paused too), so a firing another node won is not recorded paused by this one. A
        paused note never replaces a sent firing's in any case (``history_key``)."""
        if not self.board.controls:
            return due
        kept = []
        for firing in due:
            if self.board.paused(firing.entry.name, now) is None:
                kept.append(firing)
            else:
                self.decide(firing, "paused")
        return kept

    def _take_run_now(self, now: int) -> None:
        """Queue a manual firing of each run-now request the board read: claimed like
        any other, so exactly one node sends it."""
        for control in self.board.take_run_now():
            entry = self._entries.get(control.entry)
            if entry is None:
                logger.warning(
                    "run-now of entry %s by %s on %s ignored: this node's schedule has no "
                    "such entry",
                    shown(control.entry),
                    shown(control.by),
                    shown(control.host),
                )
                continue
            tenants: tuple[str | None, ...] = (
                (control.tenant,)
                if control.tenant is not None or entry.tenants is None
                else (self._tenants_of(entry) or ())
            )
            for tenant in tenants:
                address = self.schedule.address(entry, tenant)
                scheduled = Firing.of(entry, tenant, address, control.at_ms)
                self._push(now, manual_firing(scheduled, control.request))
            logger.info(
                "run-now of entry %s (tenant %s) by %s on %s: %d manual firing(s) queued",
                shown(entry.name),
                shown(control.tenant),
                shown(control.by),
                shown(control.host),
                len(tenants),
            )

    def _take_fan_out(
        self, fan: FanOut, now: int, due: list[Firing], later: list[tuple[int, Any]]
    ) -> None:
        """Prepare one chunk of a fan-out, or take the firings it has released by now."""
        if now - fan.occurrence_ms > fan.entry.max_late_ms:
            self._drop_late(fan.entry, fan.occurrence_ms, fan.drop())
            return
        ranking = self.preference.ranking(self._ladder[fan.entry.name])
        if fan.view is not None and (ranking is None or ranking.digest != fan.view):
            fan.unrank()  # the view changed: place every firing at its release
        if not fan.is_prepared:
            fan.prepare(ranking)
            if not fan.is_prepared:
                later.append((now, fan))  # one chunk per wake: the loop stays on time
                return
        due.extend(fan.take(now, MAX_BATCH - len(due)))
        if not fan.remaining:
            return
        next_ms = fan.next_release_ms()
        if next_ms <= now:
            # Due firings left over from a full wake: they follow at once, and the
            # cursor's place in the heap holds this node's progress back until then.
            later.append((next_ms, fan))
        else:
            self._push(max(next_ms, now + FAN_OUT_STEP_MS), fan)

    # -- building ahead -------------------------------------------------------------

    def prepare_ahead(self) -> bool:
        """While the loop would sleep, have the dispatcher build what it needs for the
        firings due within ``PREPARE_AHEAD_MS`` (``PREPARE_CHUNK`` at a time, so the loop
        wakes on time); whether it built any, so the loop calls again at once."""
        if not self.dispatcher.prepares_ahead:
            return False
        now = self.now_ms()
        wake = self.next_wake_ms()
        if wake is None or wake - now < PREPARE_IDLE_MS:
            return False
        if now - self._prepared_swept_ms >= MAX_SLEEP_MS:
            self._prepared_swept_ms = now
            stale = now - PREPARED_STALE_MS
            self._prepared = {k: v for k, v in self._prepared.items() if v[0] >= stale}
        room = min(PREPARE_CHUNK, PREPARED_MAX - len(self._prepared))
        firings = self._upcoming(now + PREPARE_AHEAD_MS, room) if room > 0 else []
        if not firings:
            return False
        try:
            built: Sequence[object] = self.dispatcher.prepare(firings, self)
        except Exception:
            built = [None] * len(firings)  # built when due, where a failure is told
        for firing, payload in zip(firings, built, strict=True):
            self._prepared[firing.id] = (firing.release_ms, payload)
        return True

    def _upcoming(self, until_ms: int, limit: int) -> list[Firing]:
        """At most ``limit`` firings of the heap due by ``until_ms`` that were not
        prepared yet: the heap's items up to then are a subtree at its top."""
        heap, below = self._heap, [0]
        found: list[Firing] = []
        while below and len(found) < limit:
            i = below.pop()
            if i >= len(heap) or heap[i][0] > until_ms:
                continue
            item = heap[i][2]
            if isinstance(item, Firing) and item.id not in self._prepared:
                if self._claims_at_release(item):
                    found.append(item)
                else:  # most likely left to the node preferred for it: nothing to build
                    self._prepared[item.id] = (item.release_ms, None)
            elif isinstance(item, FanOut) and item.is_prepared:
                found += item.stage(until_ms, limit - len(found))
            below += (2 * i + 2, 2 * i + 1)
        return found

    def _claims_at_release(self, firing: Firing) -> bool:
        """Whether this node will claim ``firing`` at its release (it is preferred for
        it, or there is no preference): as :meth:`Preference.place` decides it then."""
        preference = self.preference
        if not preference.enabled or len(preference.view.nodes) == 1:
            return True
        if not self._ladder[firing.entry.name] or firing.manual:
            return True
        return preference.view.rank(firing.id, self.node)[0] == 0

    def prepared(self, firing: Firing) -> object | None:
        """What the dispatcher built ahead for ``firing``, once; ``None`` if nothing."""
        built = self._prepared.pop(firing.id, None)
        return None if built is None else built[1]

    def _drop_late(self, entry: Entry, occurrence: int, count: int) -> None:
        """Count the firings of a fan-out occurrence dropped whole as late, in one step:
        no store call, no decision per firing, one WARNING with the count."""
        if count <= 0:
            return
        self.stats[entry.name].late_node += count
        self._summary["late"] += count
        self._trouble.add(("late", entry.name, occurrence), count, self.now_ms())

    def _dispatch(self, firings: list[Firing]) -> None:
        """Hand the due firings to the dispatcher; retry whatever it did not decide and
        did not send. A sent firing is never retried: one the dispatcher sent and then
        failed to decide is decided as sent, and the failure counted."""
        self._open = {f.id: f for f in firings}
        self._sent = {}
        try:
            self.dispatcher.dispatch(firings, self)
        except (StoreFull, StoreRefused) as exc:
            self._unjudged.update(self._open)  # counted missed if still so when late
            full = isinstance(exc, StoreFull)
            self._retry_open("store_full" if full else "store_refused", str(exc))
        except StoreUnavailable as exc:
            self._retry_open("unavailable", f"claim store unavailable ({exc})")
        except StoreError as exc:
            self._retry_open("error", f"claim store error ({exc})")
        except Exception as exc:
            if self._may_warn("exception", 300_000):
                logger.exception("dispatch failed; its firings are retried until late")
            self._retry_open("error", f"dispatch failed ({type(exc).__name__}: {exc})")
        finally:
            self._decide_sent()
            self._retry_open("error", "dispatch returned without deciding")

    def _decide_sent(self) -> None:
        """Decide the firings the dispatcher sent but left undecided (a step after their
        send raised): they are sent, so they are never tried again."""
        if not self._sent:
            return
        sent = list(self._sent.values())
        error = RuntimeError("the dispatcher raised before deciding them")
        self.failed_after_send([f for f, _ in sent], "deciding", error)
        for firing, outcome in sent:
            self.decide(firing, outcome)

    def _retry_open(self, outcome: str, why: str) -> None:
        if not self._open:
            return
        if self._may_warn(outcome, WARN_EVERY_MS):
            logger.warning(
                "node %s: %s: %d firing(s) retried every %dms until late",
                shown(self.node, quoted=False),
                shown(why, quoted=False, limit=ERROR_LIMIT),
                len(self._open),
                RETRY_MS,
            )
        for firing in list(self._open.values()):
            self.retry(firing, outcome)

    # -- the Wake protocol: what the dispatcher reports -----------------------------

    def is_late(self, firing: Firing, ahead_ms: int = 0) -> bool:
        return self.now_ms() + ahead_ms - firing.occurrence_ms > firing.entry.max_late_ms

    def was_held(self, firing: Firing) -> bool:
        return firing.id in self._held

    def decide(self, firing: Firing, outcome: str, *, recorded: bool = False) -> None:
        """Record this node's final decision for ``firing``; ``recorded`` when its history
        note was written with the store call that decided it. The firing leaves the wake
        first: what fails after that (counters, history, hooks) is counted and logged,
        never a reason to try the firing again."""
        self._open.pop(firing.id, None)
        if firing.id in self._unjudged:
            self._unjudged.discard(firing.id)
            if outcome == "late":  # never claimed: the store refused every claim of it
                outcome, recorded = "missed", True
        if firing.id in self._reseeding:
            self._reseeding.discard(firing.id)
            if outcome == "late":  # held off until late: the fleet could not re-seed it
                outcome = "forgotten"
        if outcome in ("won", "takeover"):
            self.reseeder.sent(firing)
        self._sent.pop(firing.id, None)
        try:
            self._record(firing, outcome, recorded=recorded)
        except Exception as exc:
            self.failed_after_send([firing], f"recording its outcome {outcome!r}", exc)

    def _record(self, firing: Firing, outcome: str, *, recorded: bool) -> None:
        """Count, settle and report one decision."""
        now = self.now_ms()
        self._count(firing, outcome, now)
        self._settle(firing, outcome)
        if outcome == "held":
            self._recheck_held(firing, now)
        else:
            self._held.discard(firing.id)
        coalesced = self._coalesced.pop(firing.id, None) if outcome != "held" else None
        decision = Decision(firing, outcome, self.node, now - firing.release_ms)
        self._report(decision, coalesced, recorded=recorded)

    def history_notes(self, decided: Sequence[tuple[Firing, str]]) -> list[Note]:
        """The history notes of this node's outcomes for ``decided``, written with the
        commit that makes them so (the two-phase path)."""
        now = self.now_ms()
        items = []
        for firing, outcome in decided:
            if outcome not in HISTORY_OUTCOMES:
                continue
            decision = Decision(firing, outcome, self.node, now - firing.release_ms)
            coalesced = self._coalesced.get(firing.id) if outcome in SENT else None
            items.append((firing.address, HistoryItem.of(decision, coalesced)))
        return self.board.history_notes(items)

    def history_template(self, firing: Firing) -> Note | NoteItem | None:
        """The history note of ``firing`` for the atomic path's claim script to complete."""
        return self.board.history_template(firing, self.now_ms(), self._coalesced.get(firing.id))

    def retry(self, firing: Firing, outcome: str) -> None:
        """``firing`` was not enqueued: count why, and try it again soon, until late."""
        self._open.pop(firing.id, None)
        if firing.id in self._sent:
            return  # sent already: never tried again (the dispatcher decides it)
        if outcome == "reseeding":
            self._reseeding.add(firing.id)
        now = self.now_ms()
        self._push(now + RETRY_MS, firing)
        try:
            self._count(firing, outcome, now)
            self._settle(firing, outcome)
            self._report(Decision(firing, outcome, self.node, now - firing.release_ms))
        except Exception as exc:
            self._step_failed([firing], f"recording its retry {outcome!r}", exc)

    def sent(self, firing: Firing, outcome: str) -> None:
        """``firing`` was handed to the broker: it leaves the firings to retry at once,
        before any step after the send can fail."""
        self._open.pop(firing.id, None)
        self._sent[firing.id] = (firing, outcome)
        self.reseeder.sent(firing)  # before any step after the send

    def in_window(self, firings: Sequence[Firing]) -> None:
        """Sent firings found taken over at their commit: counted per entry
        (``two_phase_window``, in the registry's counters and so in status)."""
        for firing in firings:
            self.stats[firing.entry.name].two_phase_window += 1

    def failed_after_send(self, firings: Sequence[Firing], step: str, exc: Exception) -> None:
        """A step after a decision or a send failed: counted per entry
        (``post_send_errors``) and logged, one WARNING per minute; never retried."""
        self._step_failed(firings, step, exc)

    def _step_failed(self, firings: Sequence[Firing], step: str, exc: Exception) -> None:
        for firing in firings:
            self.stats[firing.entry.name].post_send_errors += 1
        self._summary["post_send_error"] += len(firings)
        if not firings or not self._may_warn("post_send", WARN_EVERY_MS):
            return
        first = firings[0]
        logger.warning(
            "firing %s of entry %s (and %d more): a step after its send or decision failed "
            "(%s: %s: %s); counted in post_send_errors, and it is not tried again",
            first.id,
            shown(first.entry.name),
            len(firings) - 1,
            step,
            type(exc).__name__,
            shown(exc, quoted=False, limit=ERROR_LIMIT),
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )

    def _settle(self, firing: Firing, outcome: str) -> None:
        if self.preference.enabled and not firing.manual:
            late_ms = firing.occurrence_ms + firing.entry.max_late_ms
            self.preference.decided(firing.id, firing.release_ms, late_ms, outcome)

    def _count(self, firing: Firing, outcome: str, now: int) -> None:
        stats = self.stats[firing.entry.name]
        if outcome in ("won", "takeover"):
            stats.lateness.observe(now - firing.release_ms)
        if outcome in ("lost", "held", "foreign") and firing.id not in self._held:
            stats.lost += 1  # once, when first seen held, lost or foreign
        if outcome not in ("lost", "held"):
            stats.count(outcome)
        self._summary[outcome] += 1
        if outcome == "foreign":
            self._warn_foreign(firing)
        elif outcome == "skipped_overlap":
            logger.info(
                "firing %s of %s (occurrence %s) not sent: a run of it is in progress and "
                "its overlap policy is 'skip'",
                firing.id,
                shown(firing.address),
                iso(firing.occurrence_ms),
            )
        elif outcome in _WARNINGS:
            self._trouble.add((outcome, firing.entry.name, firing.occurrence_ms), 1, now)
            if outcome == "corrupt":
                logger.warning(
                    "firing %s of entry %s: the claim store holds a record for it that this "
                    "version cannot read; the firing is not sent",
                    firing.id,
                    shown(firing.entry.name),
                )

    def _recheck_held(self, firing: Firing, now: int) -> None:
        """A firing another node holds pending may be ours to take over when its lease
        runs out uncommitted, while it is not late."""
        again = now + self.lease_ms + RETRY_MS
        if again - firing.occurrence_ms <= firing.entry.max_late_ms:
            self._held.add(firing.id)
            self._push(again, firing)
        else:
            self._held.discard(firing.id)

    # -- telling the operator -------------------------------------------------------

    def _warn_foreign(self, firing: Firing) -> None:
        """A claim of another task holds this firing's address: two apps (or two
        schedules) share one namespace in this store. One WARNING per entry per
        ``FOREIGN_WARN_EVERY_MS``."""
        entry = firing.entry
        if not self._may_warn(f"foreign {entry.name}", FOREIGN_WARN_EVERY_MS):
            return
        logger.warning(
            "entry %s: address %s is held by a claim of another task (its task tag is not "
            "%s, the tag of %s): two apps share namespace %s in this store and take each "
            "other's firings; give each its own namespace (or, if a rollout renamed the "
            "task, run one schedule on every node); %d firing(s) lost to it on this node",
            shown(entry.name),
            shown(firing.address),
            entry.task_tag,
            shown(entry.task),
            shown(self.schedule.namespace),
            self.stats[entry.name].foreign,
        )

    def _report(
        self,
        decision: Decision,
        coalesced: tuple[int, int] | None = None,
        *,
        recorded: bool = False,
    ) -> None:
        self._decisions.append(decision)
        if not recorded:
            self.board.record(decision, coalesced)
        firing = decision.firing
        # Every decision is one DEBUG line of its own logger, so that an operator can turn
        # them on alone; INFO has one summary per minute, and what needs acting on is a
        # WARNING with counts.
        if decisions_logger.isEnabledFor(logging.DEBUG):
            decisions_logger.debug(
                "firing %s entry=%s tenant=%s occurrence=%s offset=%dms outcome=%s lateness=%dms",
                firing.id,
                shown(firing.entry.name),
                shown(firing.tenant),
                iso(firing.occurrence_ms),
                firing.offset_ms,
                decision.outcome,
                decision.lateness_ms,
            )
        if self.on_decision is not None:
            try:
                self.on_decision(decision)
            except Exception:
                logger.exception("on_decision hook failed for firing %s", firing.id)

    def _warn_trouble(self, now: int) -> None:
        """One WARNING per kind of trouble, entry and occurrence, once its count settles."""
        for (outcome, name, occurrence), count in self._trouble.settled(now):
            logger.warning(
                "entry %s, occurrence %s: %d firing(s) %s",
                shown(name),
                iso(occurrence),
                count,
                _WARNINGS[outcome],
            )

    def _may_warn(self, kind: str, every_ms: int) -> bool:
        return self._warned.allows(kind, every_ms, self.now_ms())

    def _log_summary(self, now: int) -> None:
        if self._summary_ms is None:
            self._summary_ms = now
        if now - self._summary_ms < SUMMARY_EVERY_MS:
            return
        counts, self._summary = self._summary, Counter()
        self._summary_ms = now
        offset = self.clockwatch.offset_ms
        logger.info(
            "node %s, last %ds: %s; clock offset to the store %s",
            shown(self.node, quoted=False),
            SUMMARY_EVERY_MS // 1_000,
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing due",
            "unknown" if offset is None else f"{offset:+d}ms",
        )

    # -- running --------------------------------------------------------------------

    def next_wake_ms(self) -> int | None:
        """When the next item in the heap is due, in epoch milliseconds."""
        return self._heap[0][0] if self._heap else None

    def run(self) -> None:
        """Wake, decide, sleep until the next release (at most a second); until stopped."""
        logger.info(
            "node %s scheduling %d entries of namespace %s through %s",
            shown(self.node, quoted=False),
            len(self.schedule.entries),
            shown(self.schedule.namespace),
            shown(repr(self.dispatcher), quoted=False),
        )
        try:
            while not self._stop.is_set():
                try:
                    self.tick()
                except Exception:
                    if self._may_warn("tick", 300_000):
                        logger.exception("scheduler wake failed; the loop goes on")
                self.board.start()  # after the first wake, so the first record shows it
                try:
                    prepared = self.prepare_ahead()
                except Exception:
                    prepared = False
                    if self._may_warn("prepare", 300_000):
                        logger.exception("building firings ahead failed; they are built when due")
                if not prepared:
                    self._stop.wait(self.sleep_s())
        finally:
            self.board.stop(timeout=5)
        logger.info("node %s stopped", shown(self.node, quoted=False))

    def loop_alive(self) -> bool:
        """Whether the loop runs: its thread is alive, or (driven by another loop's
        :meth:`tick`, as under ``celery beat``) it was not stopped."""
        if self._thread is not None:
            return self._thread.is_alive()
        return not self._stop.is_set()

    def sleep_s(self, cap_s: float = MAX_SLEEP_MS / 1_000) -> float:
        """Seconds until the next wake: never past the next release, never over ``cap_s``
        (and never over a second, so the wall clock is re-read at least that often); for a
        dispatcher that builds ahead, ``PREPARE_AHEAD_MS`` before the next release."""
        cap_ms = min(cap_s * 1_000, MAX_SLEEP_MS)
        if self.dispatcher.settling:  # a commit is owed: try it again soon
            cap_ms = min(cap_ms, RETRY_MS)
        wake = self.next_wake_ms()
        if wake is None:
            return cap_ms / 1_000
        delay = wake - self.now_ms()
        if self.dispatcher.prepares_ahead and delay > PREPARE_AHEAD_MS:
            delay -= PREPARE_AHEAD_MS  # wake in time to build what is due then
        return min(max(delay, 0), cap_ms) / 1_000

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread and return it."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"beatless-{self.node}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to stop after the wake in progress, and wait for its thread."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.board.stop(timeout)
