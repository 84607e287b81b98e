"""The scheduler loop: one per node, no leader, no Celery or Dramatiq import.

Every node computes the same occurrences, derives the same firing ids and offsets, and
at each firing's release asks the claim store to decide. Only a won firing is enqueued.

* What is due when lives in the node's timeline (:mod:`beatless.node._timeline`):
  occurrences computed once per distinct trigger, caught up at start, late ones skipped
  in bulk and before any store call.
* The firings due at one wake go to one :class:`~beatless.node.dispatch.Dispatcher`, the
  loop's only seam to the store and the broker (two-phase or atomic); every firing it
  is handed comes back decided or retried through the node's wake
  (:mod:`beatless.node._wake`), and any error retries what it left.
* The loop never sleeps past the next release nor longer than one second, and re-reads
  the wall clock at every wake, so a corrected clock or a suspended VM is noticed. It
  wakes ``READY_AHEAD_MS`` before a release, readies its claims and sends them at the
  release.
* While it would sleep, a dispatcher that builds ahead builds what is due within a
  second (:mod:`beatless.node._ahead`).
* What it decided is counted and told in :mod:`beatless.node._tally`; readers see the
  node through :mod:`beatless.node._view`.
* The node measures its offset to the store's clock at start and every minute, and
  claims nothing while it is over the store's tolerance.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable

from beatless.core._bulk import paused_collection
from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import DurationLike
from beatless.errors import (
    ConfigError,
    StoreError,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
)
from beatless.fleet._notes import REGISTRY_EVERY_MS
from beatless.node._ahead import PREPARE_AHEAD_MS, BuildAhead
from beatless.node._board import Board
from beatless.node._clockwatch import ClockWatch
from beatless.node._drain import Stopping, drain
from beatless.node._inflight import InFlight
from beatless.node._judging import Judging
from beatless.node._live import LiveView
from beatless.node._prefer import CLAIM, DELEGATE, Preference, Ranked, fits
from beatless.node._reseed import Reseeder
from beatless.node._startup import check_store, live_enabled, say_ladder
from beatless.node._tally import SETTLE_MS, WARN_EVERY_MS, Tally
from beatless.node._timeline import Timeline
from beatless.node._wake import RETRY_MS, LoopWake
from beatless.node.dispatch import (
    DEFAULT_LEASE,
    Dispatcher,
    Enqueue,
    TwoPhase,
    lease_ms_of,
    send_deadline_s,
)
from beatless.schedule.entry import Schedule
from beatless.schedule.firing import Decision, Firing, iso
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import TOLERANCE_MS, ClaimStore

logger = logging.getLogger(__name__)
decisions_logger = logging.getLogger("beatless.decisions")
"""Each firing's decision (won, lost, held, late, ...), at DEBUG: turn it on with
``logging.getLogger("beatless.decisions").setLevel(logging.DEBUG)``."""

__all__ = ["DEFAULT_LEASE", "Decision", "Enqueue", "Scheduler", "send_deadline_s"]

MAX_SLEEP_MS = 1_000

READY_AHEAD_MS = 5
"""How long before a release the loop wakes to have that release's claims ready: it
takes the due firings, places them among the nodes and builds their claims as of the
release, then waits for it (:meth:`LoopWake.until_release
<beatless.node._wake.LoopWake.until_release>`) and sends. Nothing is sent before the
release; what a wake does first (about a millisecond for fifteen firings, more on a busy
machine) is off the firings' lateness."""


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
    :class:`~beatless.node.dispatch.Dispatcher` that claims and enqueues on its own (the
    atomic paths of the integrations), in which case ``enqueue`` is not used.

    Readers see a running scheduler through :class:`~beatless.node._view.NodeView`.
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
        live: bool = True,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.dispatcher = _dispatcher(store, enqueue, lease, monotonic)
        self.lease_ms: int = getattr(self.dispatcher, "lease_ms", lease_ms_of(lease))
        self.store: ClaimStore = self.dispatcher.store
        schedule = schedule.fitted(self.store.remembers)  # a one-off's default max_late
        self.schedule = schedule
        self.clock = clock
        # Readied ahead on a clock the loop can sleep on: the wall clock, or one given with
        # its ``sleep`` (a simulated clock without one wakes at each release).
        self._ready_ahead_ms = READY_AHEAD_MS if sleep is not None or clock is time.time else 0
        self.node = node or default_node_name()
        self.on_decision = on_decision
        check_store(schedule, self.dispatcher, self.lease_ms)
        with paused_collection():  # an object or two per entry (see core._bulk)
            self.tally = Tally(schedule, self.node, self.now_ms)
        """What this node decided, counted, and the trouble it tells (:mod:`._tally`)."""
        self.stats = self.tally.stats
        self.clockwatch = ClockWatch(self.store, clock, self.node)
        self._stop = threading.Event()
        self._stopping: Stopping | None = None
        self._alarm = threading.Event()
        """Cuts the loop's sleep short: set by :meth:`stop` and when the board reads a live
        revision the loop has not applied."""
        self.live = LiveView(
            self.store,
            schedule,
            enabled=live_enabled(live, self.store),
            now_ms=self.now_ms,
            offset_ms=lambda: self.clockwatch.offset_ms,
            arrived=self._alarm.set,
            refusing=lambda: self.clockwatch.refusing,
        )
        """The live entries this node knows, and which definition is in force when
        (:mod:`beatless.node._live`); ``live=False``: code entries only."""
        if self.live.enabled:
            try:
                self.live.read()  # a starting node schedules the live entries at once
            except StoreError as exc:
                logger.warning("live schedule's head not read at start (%s); retried", exc)
        self._decisions: list[Decision] = []
        self._thread: threading.Thread | None = None
        start_ms = self.now_ms()
        self.preference = Preference(
            self.node, schedule.fingerprint, schedule.namespace, enabled=preferred
        )
        """Which firings this node claims first, and which it leaves to others
        (:mod:`beatless.node._prefer`)."""
        self._ladder = {e.name: fits(e.jitter_ms, e.max_late_ms) for e in schedule.entries}
        if preferred:
            say_ladder(self._ladder)
        self.board = Board(self, framework=framework, loop_alive=self.loop_alive)
        """The registry record and history this node keeps in the store
        (:mod:`beatless.node._board`)."""
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
        (:mod:`beatless.node._reseed`)."""
        self.store.holds_off = self.reseeder.enabled
        self.flights = InFlight()
        """Each firing's state between its release and its decision (:mod:`._inflight`)."""
        with paused_collection():
            self.timeline = Timeline(
                schedule,
                start_ms=start_ms,
                now_ms=self.now_ms,
                tally=self.tally,
                flights=self.flights,
                preference=self.preference,
                ladder=self._ladder,
                live=self.live,
            )
        """What is due when (:mod:`beatless.node._timeline`)."""
        self.judging = Judging(self.store, self.node, self.lease_ms, self.tally)
        """The unjudged firings gone late, waiting for the store's word (:mod:`._judging`)."""
        self.ahead = BuildAhead(self.dispatcher, self.timeline, self._rank_at_release, self.now_ms)
        """What the dispatcher built ahead (:mod:`beatless.node._ahead`)."""
        self.wake = LoopWake(
            self.node,
            now_ms=self.now_ms,
            lease_ms=self.lease_ms,
            flights=self.flights,
            tally=self.tally,
            timeline=self.timeline,
            ahead=self.ahead,
            preference=self.preference,
            board=self.board,
            reseeder=self.reseeder,
            report=self._report,
            judging=self.judging,
            live=self.live,
            clock=clock,
            sleep=sleep or time.sleep,
        )
        """What the dispatcher reports to (:class:`~beatless.node.dispatch.Wake`)."""

    def now_ms(self) -> int:
        """The node's clock, in epoch milliseconds rounded down (never early)."""
        return math.floor(self.clock() * 1_000)

    def next_wake_ms(self) -> int | None:
        """When the next item of the timeline is due, in epoch milliseconds."""
        return self.timeline.next_wake_ms()

    # -- one wake -------------------------------------------------------------------

    def tick(self) -> list[Decision]:
        """One wake: claim and enqueue what is due now, then expand what is near. A wake
        within ``READY_AHEAD_MS`` of the next release is one of that release: it readies
        its claims now and sends them at the release."""
        now = self.now_ms()
        release = self.timeline.next_wake_ms()
        if release is not None and now < release <= now + self._ready_ahead_ms:
            now = self.wake.release_ms = release
        self.board.woke(now)
        self.preference.adopt(now)
        self.timeline.follow_view(now)
        self._follow_live(now)
        run_now = self.board.take_run_now()
        if run_now:
            self.timeline.run_now(run_now, now)
        skewed = self.clockwatch.refusing  # what the live view's confirms() went by
        due = self.timeline.pop_due(now, self.wake.decide)
        delegated: list[Firing] = []
        try:
            self._claim(self._drop_paused(self._prefer(due, now, delegated), now), now, skewed)
        finally:
            self.wake.until_release()  # the rest of the wake is at or after the release
            # What is not due to the store at this instant comes after its claims.
            for firing in delegated:
                self.wake.decide(firing, DecisionOutcome.DELEGATED)
        self.timeline.expand_reached(now)
        if self.reseeder.step(now):
            self.flights.forget_held()  # a node that sent one of them wrote it back
        self.judging.judge(now, self.wake.decide)
        self.timeline.say_catch_up()
        self.preference.advance(now, self.timeline.next_wake_ms())
        self.tally.tell(now, self.clockwatch.offset_ms)
        decisions, self._decisions = self._decisions, []
        return decisions

    def _claim(self, due: list[Firing], now: int, skewed: bool) -> None:
        """Hand the firings this node claims now to the dispatcher (none while its clock
        is off the store's); with none, settle what the dispatcher owes."""
        if due and (not self.clockwatch.check(now) or skewed):
            for firing in due:
                self.wake.decide(firing, DecisionOutcome.CLOCK_SKEW)
        elif due:
            self._dispatch(due)
        else:
            self.dispatcher.settle(self.wake)  # a failed commit is retried on every wake

    def _follow_live(self, now: int) -> None:
        """Apply the live revisions read and plan their new definitions; read the head
        here first when something is due and the board's last read is too old to claim
        it (:meth:`LiveView.confirms <beatless.node._live.LiveView.confirms>`)."""
        live = self.live
        if not live.enabled:
            return
        wake = self.timeline.next_wake_ms()
        if wake is not None and wake <= now and live.needs_read(now):
            if self.clockwatch.offset_ms is None:
                self.clockwatch.check(now)  # a read is placed on the store's clock by it
            try:
                live.read()
            except StoreError as exc:
                if self.tally.may_warn("live_read", WARN_EVERY_MS * 6):
                    logger.warning(
                        "node %s: the live schedule's head not read (%s): firings wait, and "
                        "are decided stale_schedule once late",
                        shown(self.node, quoted=False),
                        shown(str(exc), quoted=False, limit=ERROR_LIMIT),
                    )
        fresh = live.apply()
        if not fresh:
            return
        for entry, _fence in fresh:
            self._ladder[entry.name] = fits(entry.jitter_ms, entry.max_late_ms)
        self.timeline.plan_live(fresh)

    def _prefer(self, due: list[Firing], now: int, delegated: list[Firing]) -> list[Firing]:
        """The due firings this node claims now; the others are left to the node preferred
        for them (added to ``delegated``, decided so once the claims are sent), or looked
        at again later (:mod:`beatless.node._prefer`)."""
        if not due or not self.preference.enabled or len(self.preference.view.nodes) == 1:
            return due
        claimed = []
        for firing in due:
            ladder = self._ladder[firing.entry.name] and not firing.manual
            placed, ranked = self.preference.place(
                firing.id,
                firing.release_ms,
                now,
                ladder=ladder,
                plain=firing.tenant is None,
                ranked=self.flights.take_ranked(firing) or self.ahead.ranked(firing),
            )
            if placed == CLAIM:
                claimed.append(firing)
            elif placed == DELEGATE:
                delegated.append(firing)
            else:
                if ranked is not None:
                    self.flights.rank(firing, ranked)
                self.timeline.defer(placed, firing)
        return claimed

    def _rank_at_release(self, firing: Firing) -> Ranked | None:
        """Where this node ranks for ``firing`` under its view, as :meth:`Preference.place`
        ranks it at the release (0: it claims it then); ``None`` when it claims it at its
        release whatever the ranks (no preference, one node, an entry off the ladder, a
        manual firing)."""
        preference = self.preference
        if not preference.enabled or len(preference.view.nodes) == 1:
            return None
        if not self._ladder[firing.entry.name] or firing.manual:
            return None
        return preference.ranked(firing.id, firing.release_ms, plain=firing.tenant is None)

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
                self.wake.decide(firing, DecisionOutcome.PAUSED)
        return kept

    def _dispatch(self, firings: list[Firing]) -> None:
        """Hand the due firings to the dispatcher; retry whatever it did not decide and
        did not send. A sent firing is never retried: one the dispatcher sent and then
        failed to decide is decided as sent, and the failure counted."""
        self.flights.open(firings)
        try:
            if not self.dispatcher.waits_for_release:
                self.wake.until_release()
            self.dispatcher.dispatch(firings, self.wake)
        except (StoreFull, StoreRefused) as exc:
            self.flights.unjudged(self.now_ms())  # asked about if still so when late
            full = isinstance(exc, StoreFull)
            self._retry_open("store_full" if full else "store_refused", str(exc))
        except StoreUnavailable as exc:
            self._retry_open("unavailable", f"claim store unavailable ({exc})")
        except StoreError as exc:
            self._retry_open("error", f"claim store error ({exc})")
        except Exception as exc:
            if self.tally.may_warn("exception", 300_000):
                logger.exception("dispatch failed; its firings are retried until late")
            self._retry_open("error", f"dispatch failed ({type(exc).__name__}: {exc})")
        finally:
            sent = self.flights.left_sent()
            if sent:  # a step after their send raised: sent, so never tried again
                error = RuntimeError("the dispatcher raised before deciding them")
                self.wake.failed_after_send([f for f, _ in sent], "deciding", error)
                for firing, outcome in sent:
                    self.wake.decide(firing, outcome)
            self._retry_open("error", "dispatch returned without deciding")

    def _retry_open(self, outcome: str, why: str) -> None:
        """Retry the firings of this wake left open: neither decided nor sent."""
        left = self.flights.left_open()
        if not left:
            return
        if self.tally.may_warn(outcome, WARN_EVERY_MS):
            logger.warning(
                "node %s: %s: %d firing(s) retried every %dms until late",
                shown(self.node, quoted=False),
                shown(why, quoted=False, limit=ERROR_LIMIT),
                len(left),
                RETRY_MS,
            )
        for firing in left:
            self.wake.retry(firing, outcome)

    def _report(
        self, decision: Decision, coalesced: tuple[int, int] | None, recorded: bool
    ) -> None:
        """Tell one decision: the history (unless ``recorded`` already), the decisions
        log, the ``on_decision`` hook, and what :meth:`tick` returns."""
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

    # -- running --------------------------------------------------------------------

    def prepare_ahead(self) -> bool:
        """While the loop would sleep, have the dispatcher build what it needs for the
        firings due within ``PREPARE_AHEAD_MS`` (:mod:`beatless.node._ahead`); whether it
        built any, so the loop calls again at once."""
        return self.ahead.build(self.wake)

    def idle_s(self, cap_s: float = MAX_SLEEP_MS / 1_000) -> float:
        """Between two wakes: build a chunk of what is due within a second
        (:meth:`prepare_ahead`), and return 0 to be woken again at once; else the seconds
        to sleep (:meth:`sleep_s`). A loop that drives this node from outside (``celery
        beat``) calls it after each :meth:`tick`, as :meth:`run` does."""
        try:
            if self.prepare_ahead():
                return 0.0
        except Exception:
            if self.tally.may_warn("prepare", 300_000):
                logger.exception("building firings ahead failed; they are built when due")
        return self.sleep_s(cap_s)

    def run(self) -> None:
        """Wake, decide, sleep until the next release (at most a second, and no longer
        than until the board reads a new live revision); until stopped, and then decide
        what was released by the stop (:mod:`beatless.node._drain`)."""
        logger.info(
            "node %s scheduling %d entries of namespace %s through %s",
            shown(self.node, quoted=False),
            len(self.schedule.entries),
            shown(self.schedule.namespace),
            shown(repr(self.dispatcher), quoted=False),
        )
        try:
            while not self._stop.is_set():
                self._wake()
                self.board.start()  # after the first wake, so the first record shows it
                delay = self.idle_s()
                if delay > 0:
                    self._alarm.wait(delay)
                    self._alarm.clear()
            stopping = self._stopping or Stopping.at(self.now_ms(), None)
            drain(stopping, self.timeline, node=self.node, now_ms=self.now_ms, wake=self._wake)
        finally:
            if len(self.judging):  # asked once more; what is left is told as not judged
                self.judging.judge(self.now_ms(), self.wake.decide, last=True)
                self.tally.tell(self.now_ms() + SETTLE_MS, self.clockwatch.offset_ms)
            self.board.stop(timeout=5)
        logger.info("node %s stopped", shown(self.node, quoted=False))

    def _wake(self) -> None:
        """One wake of the loop: what fails is logged, and the loop goes on."""
        try:
            self.tick()
        except Exception:
            if self.tally.may_warn("tick", 300_000):
                logger.exception("scheduler wake failed; the loop goes on")

    def loop_alive(self) -> bool:
        """Whether the loop runs: its thread is alive, or (driven by another loop's
        :meth:`tick`, as under ``celery beat``) it was not stopped."""
        if self._thread is not None:
            return self._thread.is_alive()
        return not self._stop.is_set()

    def sleep_s(self, cap_s: float = MAX_SLEEP_MS / 1_000) -> float:
        """Seconds until the next wake: never past the next release, never over ``cap_s``
        (and never over a second, so the wall clock is re-read at least that often); for a
        dispatcher that builds ahead, ``PREPARE_AHEAD_MS`` before the next release, and
        then ``READY_AHEAD_MS`` before it."""
        cap_ms = min(cap_s * 1_000, MAX_SLEEP_MS)
        if self.dispatcher.settling:  # a commit is owed: try it again soon
            cap_ms = min(cap_ms, RETRY_MS)
        wake = self.next_wake_ms()
        if wake is None:
            return cap_ms / 1_000
        # From the clock itself: from now_ms(), rounded down, the loop would wake up to a
        # millisecond after the release.
        delay = wake - self.clock() * 1_000
        if self.dispatcher.prepares_ahead and delay > PREPARE_AHEAD_MS:
            delay -= PREPARE_AHEAD_MS  # wake in time to build what is due then
        else:
            delay -= self._ready_ahead_ms  # and to ready the claims of the release
        return min(max(delay, 0), cap_ms) / 1_000

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread and return it."""
        self._stop.clear()
        self._stopping = None
        self._thread = threading.Thread(target=self.run, name=f"beatless-{self.node}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to stop, and wait for its thread: it ends the wake in progress,
        then decides the firings released by now that it still has to try, for at most
        ``DRAIN_MS`` and half ``timeout`` (:mod:`beatless.node._drain`). A loop driven by
        another's :meth:`tick` (``celery beat``) is not waited for, nor drained."""
        self._stopping = Stopping.at(self.now_ms(), timeout)
        self._stop.set()
        self._alarm.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.board.stop(timeout)
