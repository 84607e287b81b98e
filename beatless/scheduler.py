"""The scheduler loop: one per node, no leader, no Celery or Dramatiq import.

Every node computes the same occurrences, derives the same firing ids and offsets, and
at each firing's release asks the claim store to decide. Only a won firing is enqueued.

* Occurrences are computed once per distinct trigger and shared by every entry and
  tenant that uses it; the firings waiting for their release live in one heap.
* The claims due at one wake go to the store in one batch.
* The loop never sleeps past the next release nor longer than one second, and re-reads
  the wall clock at every wake, so a corrected clock or a suspended VM is noticed.
* A firing more than ``max_late`` behind the node's clock is skipped and counted late.
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from beatless.durations import DurationLike, as_timedelta, to_ms
from beatless.entry import Entry, Schedule
from beatless.errors import ConfigError, ScheduleError, StoreError, StoreUnavailable
from beatless.firing import Firing, iso
from beatless.stats import EntryStats
from beatless.stores.base import AtomicStore, ClaimRequest, ClaimStore, Outcome
from beatless.triggers import Trigger

logger = logging.getLogger(__name__)

MAX_SLEEP_MS = 1_000
EXPAND_AHEAD_MS = 2_000
"""Occurrences are expanded into firings this long before they are due."""
RETRY_MS = 500
"""A firing whose claim or enqueue failed is tried again after this long, until late."""
MAX_BATCH = 5_000
"""At most this many firings go to the store in one wake; the rest follow at once."""

Enqueue = Callable[[Firing], object]


@dataclass(frozen=True, slots=True)
class Decision:
    """What this node decided for one firing, and how late after its release."""

    firing: Firing
    outcome: str
    """``won``, ``takeover``, ``lost``, ``late`` (node clock), ``late_store`` or
    ``enqueue_failed``."""
    node: str
    lateness_ms: int


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


def default_node_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def log_enqueue(firing: Firing) -> None:
    """The enqueue of a node with no broker: log what would have been sent."""
    logger.info(
        "enqueue %s task=%s args=%r kwargs=%r tenant=%s",
        firing.id,
        firing.entry.task,
        firing.entry.args,
        dict(firing.entry.kwargs),
        firing.tenant,
    )


def commit_enqueued(store: ClaimStore, firings: Sequence[Firing], node: str) -> None:
    """Commit the pending claims of firings just enqueued (the last step of two-phase).

    A failed or refused commit is logged, not raised: the messages are already in the
    broker, and the one way to a second copy (another node taking over a lease that ran
    out) carries the same message id, which a consumer can deduplicate.
    """
    try:
        kept = store.commit([f.id for f in firings], node=node)
    except StoreError as exc:
        logger.warning(
            "commit of %d enqueued firing(s) failed (%s): if their leases run out another "
            "node may enqueue them again under the same message id",
            len(firings),
            exc,
        )
        return
    for firing, ok in zip(firings, kept, strict=True):
        if not ok:
            logger.warning(
                "firing %s of entry %r: the lease ran out before commit and another node "
                "took it over; a consumer may see this message id twice",
                firing.id,
                firing.entry.name,
            )


class Scheduler:
    """The loop of one node. Drive it with :meth:`run` / :meth:`start`, or :meth:`tick`.

    ``enqueue`` is called with each won firing; raising means the enqueue failed, and
    the claim is released so that another node or the next wake retries it. A store
    that implements :class:`~beatless.stores.base.AtomicStore` claims and enqueues in
    one step and ``enqueue`` is not used.
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        store: ClaimStore | AtomicStore,
        enqueue: Enqueue | None = None,
        clock: Callable[[], float] = time.time,
        node: str | None = None,
        on_decision: Callable[[Decision], None] | None = None,
        lease: DurationLike = timedelta(seconds=30),
    ) -> None:
        self.schedule = schedule
        self.store = store
        self._atomic = store if isinstance(store, AtomicStore) else None
        self._store: ClaimStore | None = store if isinstance(store, ClaimStore) else None
        self.enqueue = enqueue or log_enqueue
        self.clock = clock
        self.node = node or default_node_name()
        self.on_decision = on_decision
        self.lease_ms = to_ms(as_timedelta(lease, name="lease"))
        self._check_store()
        self.stats = {entry.name: EntryStats() for entry in schedule.entries}
        self._heap: list[tuple[int, int, Any]] = []
        self._seq = itertools.count()
        self._tenants: dict[str, tuple[str, ...]] = {}
        self._held: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_ms = self._now_ms()
        self._plan(self._start_ms)

    def _check_store(self) -> None:
        if self.lease_ms <= 0:
            raise ConfigError("lease must be positive")
        if self._atomic is None and self._store is None:
            raise ConfigError(f"store must be a ClaimStore or an AtomicStore, got {self.store!r}")
        if self._store is not None:
            errors = self.schedule.check_store(self._store.remembers, self._store.name)
            if errors:
                raise ScheduleError("; ".join(errors), errors)
            self._warn_no_takeover()

    def _warn_no_takeover(self) -> None:
        """Two-phase: a winner that dies before commit is replaced when its lease runs out,
        but only while the firing is not late. Say so for entries where it never is."""
        for entry in self.schedule.entries:
            if entry.jitter_ms + self.lease_ms + RETRY_MS >= entry.max_late_ms:
                logger.warning(
                    "entry %r: jitter %dms + lease %dms leave no time within max_late %dms to "
                    "take over a firing whose winner died before commit; shorten the lease "
                    "or raise max_late",
                    entry.name,
                    entry.jitter_ms,
                    self.lease_ms,
                    entry.max_late_ms,
                )

    def _now_ms(self) -> int:
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

    def _queue_next(self, group: _Group) -> None:
        occurrence = next(group.occurrences, None)
        if occurrence is not None:
            self._push(occurrence - EXPAND_AHEAD_MS, (group, occurrence))

    def _push(self, at_ms: int, item: Any) -> None:
        heapq.heappush(self._heap, (at_ms, next(self._seq), item))

    def _expand(self, group: _Group, occurrence: int) -> None:
        """Turn one occurrence of a trigger into the firings of every entry and tenant."""
        self._queue_next(group)
        for entry in group.entries:
            if occurrence < self._start_ms - entry.max_late_ms:
                continue  # before this node's time: not ours to judge
            base = self.schedule.address(entry)
            tenants = self._tenants_of(entry)
            if tenants is None:
                self._push_firing(Firing.of(entry, None, base, occurrence))
                continue
            for tenant in tenants:
                self._push_firing(Firing.of(entry, tenant, f"{base}/{tenant}", occurrence))

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
                logger.warning(
                    "entry %r: %d occurrence(s) of %s were more than max_late behind the "
                    "clock (frozen node or clock jump) and were skipped as late",
                    entry.name,
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
            logger.exception(
                "entry %r: the tenants callable failed; using the last list it returned",
                entry.name,
            )
            return self._tenants.get(entry.name, ())
        self._tenants[entry.name] = tenants  # type: ignore[assignment]
        return tenants

    # -- one wake -------------------------------------------------------------------

    def tick(self) -> list[Decision]:
        """One wake: expand what is near, then claim and enqueue what is due now."""
        now = self._now_ms()
        due: list[Firing] = []
        while self._heap and self._heap[0][0] <= now and len(due) < MAX_BATCH:
            _, _, item = heapq.heappop(self._heap)
            if isinstance(item, Firing):
                due.append(item)
            else:
                group, occurrence = item
                occurrence = self._skip_late(group, occurrence, now)
                if occurrence is not None:
                    self._expand(group, occurrence)
        decisions = [self._late(f, now) for f in due if now - f.occurrence_ms > f.entry.max_late_ms]
        on_time = [f for f in due if now - f.occurrence_ms <= f.entry.max_late_ms]
        if on_time:
            decisions.extend(self._dispatch(on_time, now))
        for decision in decisions:
            self._report(decision)
        return decisions

    def _late(self, firing: Firing, now: int) -> Decision:
        self.stats[firing.entry.name].late_node += 1
        return Decision(firing, "late", self.node, now - firing.release_ms)

    def _dispatch(self, firings: list[Firing], now: int) -> list[Decision]:
        try:
            if self._atomic is not None:
                return self._claim_atomic(self._atomic, firings)
            return self._claim_two_phase(cast(ClaimStore, self._store), firings)
        except StoreUnavailable as exc:
            logger.warning(
                "claim store unavailable (%s): %d firing(s) retried in %dms until late",
                exc,
                len(firings),
                RETRY_MS,
            )
        except StoreError:
            logger.exception("claim store error: %d firing(s) retried until late", len(firings))
        for firing in firings:
            self._push(now + RETRY_MS, firing)
        return []

    def _claim_atomic(self, store: AtomicStore, firings: list[Firing]) -> list[Decision]:
        outcomes = store.claim_and_enqueue(firings, node=self.node)
        return [self._decide(f, o) for f, o in zip(firings, outcomes, strict=True)]

    def _claim_two_phase(self, store: ClaimStore, firings: list[Firing]) -> list[Decision]:
        requests = [ClaimRequest.of(f) for f in firings]
        outcomes = store.claim(requests, node=self.node, lease_ms=self.lease_ms)
        decisions, enqueued = [], []
        for firing, outcome in zip(firings, outcomes, strict=True):
            if outcome.is_won and not self._enqueue(firing):
                decisions.append(self._enqueue_failed(store, firing))
                continue
            if outcome.is_won:
                enqueued.append(firing)
            decisions.append(self._decide(firing, outcome))
        if enqueued:
            commit_enqueued(store, enqueued, self.node)
        return decisions

    def _enqueue(self, firing: Firing) -> bool:
        try:
            self.enqueue(firing)
        except Exception:
            logger.exception("firing %s of entry %r: enqueue failed", firing.id, firing.entry.name)
            return False
        return True

    def _enqueue_failed(self, store: ClaimStore, firing: Firing) -> Decision:
        now = self._now_ms()
        self.stats[firing.entry.name].enqueue_failures += 1
        try:
            store.release([firing.id], node=self.node)
        except StoreError:
            logger.warning(
                "firing %s: could not release the claim; its lease will run out", firing.id
            )
        self._push(now + RETRY_MS, firing)
        return Decision(firing, "enqueue_failed", self.node, now - firing.release_ms)

    def _decide(self, firing: Firing, outcome: Outcome) -> Decision:
        stats = self.stats[firing.entry.name]
        now = self._now_ms()
        if outcome.is_won:
            self._held.discard(firing.id)
            stats.won += 1
            stats.lateness.observe(now - firing.release_ms)
            if outcome is Outcome.TAKEOVER:
                stats.takeovers += 1
        elif outcome is Outcome.LATE:
            stats.late_store += 1
        else:
            if firing.id not in self._held:
                stats.lost += 1
            self._recheck_held(firing, outcome, now)
        name = "late_store" if outcome is Outcome.LATE else outcome.value
        return Decision(firing, name, self.node, now - firing.release_ms)

    def _recheck_held(self, firing: Firing, outcome: Outcome, now: int) -> None:
        """A firing another node holds pending may be ours to take over when its lease
        runs out uncommitted, while it is not late."""
        again = now + self.lease_ms + RETRY_MS
        if outcome is Outcome.HELD and again - firing.occurrence_ms <= firing.entry.max_late_ms:
            self._held.add(firing.id)
            self._push(again, firing)
        else:
            self._held.discard(firing.id)

    def _report(self, decision: Decision) -> None:
        firing = decision.firing
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "firing %s entry=%s tenant=%s occurrence=%s offset=%dms outcome=%s lateness=%dms",
                firing.id,
                firing.entry.name,
                firing.tenant,
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

    # -- running --------------------------------------------------------------------

    def next_wake_ms(self) -> int | None:
        """When the next item in the heap is due, in epoch milliseconds."""
        return self._heap[0][0] if self._heap else None

    def run(self) -> None:
        """Wake, decide, sleep until the next release (at most a second); until stopped."""
        logger.info(
            "node %s scheduling %d entries of namespace %r",
            self.node,
            len(self.schedule.entries),
            self.schedule.namespace,
        )
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                logger.exception("scheduler wake failed; the loop goes on")
            self._stop.wait(self.sleep_s())
        logger.info("node %s stopped", self.node)

    def sleep_s(self, cap_s: float = MAX_SLEEP_MS / 1_000) -> float:
        """Seconds until the next wake: never past the next release, never over ``cap_s``
        (and never over a second, so the wall clock is re-read at least that often)."""
        cap_ms = min(cap_s * 1_000, MAX_SLEEP_MS)
        wake = self.next_wake_ms()
        if wake is None:
            return cap_ms / 1_000
        return min(max(wake - self._now_ms(), 0), cap_ms) / 1_000

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
