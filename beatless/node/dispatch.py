"""The one seam between the loop and a claim store: claim the due firings, enqueue the won.

The loop hands each wake's due firings to a :class:`Dispatcher` and learns the outcome of
every one of them through the :class:`Wake` it passes along. Two implementations:

* :class:`TwoPhase`, for any broker: claim *pending* with a short lease, enqueue through
  the framework, *commit*. A claim is acted on only while it is provably ours and on
  time: firings are claimed in sub-batches sized from the measured send rate so that a
  sub-batch is sent within a third of the lease, and right before every send the claim
  must be younger than half its lease (monotonic clock) and the firing not late (node
  clock). Each sub-batch is committed as soon as it is sent. A commit that fails stops
  the sends: nothing more is sent until a commit succeeds again.
* an atomic dispatcher, where the claim store is the broker's own Redis and one script
  claims and enqueues (``beatless.celery`` and ``beatless.dramatiq`` provide them):
  they implement :meth:`Dispatcher.dispatch` over ``claim_and_push``.

A dispatcher may raise: the loop then retries every firing of the wake it was not told
about, until it is late, so no firing leaves the loop uncounted. A firing it was told is
:meth:`Wake.sent` is never retried: whatever is done after a send (the commit, the
history note, the counters) may fail, and is counted, but never sends it again.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Protocol

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.core.durations import DurationLike, as_timedelta, to_ms
from beatless.errors import ConfigError, StoreError, StoreFull
from beatless.schedule.firing import Firing, claim_request
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import ClaimStore, Note, NoteItem, Outcome

from ._recorder import Recorder
from ._send_rate import SendRate

logger = logging.getLogger(__name__)

DEFAULT_LEASE = timedelta(seconds=30)
"""How long a two-phase claim stays pending while its message is sent."""

SEND_DEADLINE_SHARE = 0.4
"""A two-phase send must finish within this share of the lease: a send starts only while
the claim is younger than half the lease, so it ends before the lease does."""

COMMIT_EVERY_S = 0.05
"""Sent firings are committed at the latest this long after the first of them began:
a node that freezes or dies mid-sub-batch leaves at most this much of sends (and the one
in flight) uncommitted, the only firings another node may send again."""

SENDING = "firing %s of entry %s: checked, sending (claim %.0f ms old)"
"""Logged at DEBUG when a firing passes its last checks: from here on, a freeze or a
broker that holds the bytes is the residual window (docs/reliability.md)."""

LATE_COMMIT = (
    "firing %s of entry %s: its claim ran out before commit (or the store lost its memory) "
    "and another node may send it too; the workers' once-only check refuses such a second copy"
)
"""The WARNING of a sent firing whose commit the store refused (the two-phase window)."""

NOT_COMMITTED_IN_TIME = (
    "firing %s of entry %s: sent, but its commit has failed until its %d ms lease ran out; "
    "another node may claim and send it too, under the same message id (the two-phase "
    "window); the workers' once-only check refuses such a second copy"
)
"""The WARNING, once per firing, of a sent firing still uncommitted when its lease ended."""

COMMIT_FAILED = (
    "commit of %d sent firing(s) failed (%s): this node sends nothing more until a commit "
    "succeeds (it commits them again first); if their leases run out meanwhile another "
    "node may send them too, under the same message id (the two-phase window): %s"
)
"""The WARNING of a failed commit, naming the firings it leaves in the two-phase window."""

FAILURE_WARN_S = 10.0
"""Failed sends are told in one WARNING at most this often, with their count."""

Enqueue = Callable[[Firing], object]

# An Enum class's attribute is a slow look-up on Python 3.11 (EnumType.__getattr__): the
# path of every claim names these through module names.
_WON = Outcome.WON
_TRIED_AGAIN = frozenset({Outcome.RESEEDING, Outcome.STALE})
_of_claim = DecisionOutcome.of_claim

RECORDED = frozenset(
    o for o in Outcome if DecisionOutcome.of_claim(o) in DecisionOutcome.CLAIM_DECIDED
)
"""The store outcomes whose history note a claim script writes (the atomic path): those
of the history a claim decides (``won``, ``takeover``, ``skipped_overlap``,
``forgotten``)."""


def send_deadline_s(lease_ms: int) -> float:
    """Seconds a broker publish may take on the two-phase path, for a lease of ``lease_ms``.

    Integrations give their broker clients this deadline (socket and publish timeouts),
    so that a send that began while its claim was young ends before the lease does.
    """
    return lease_ms * SEND_DEADLINE_SHARE / 1_000


def lease_ms_of(lease: DurationLike) -> int:
    """A lease in milliseconds, refused unless positive."""
    lease_ms = to_ms(as_timedelta(lease, name="lease"))
    if lease_ms <= 0:
        raise ConfigError(f"lease must be positive, got {lease!r}")
    return lease_ms


class Wake(Protocol):
    """What a dispatcher tells the loop, for one wake. Every firing handed to
    :meth:`Dispatcher.dispatch` gets exactly one :meth:`decide` or :meth:`retry`."""

    node: str

    @property
    def live_revision(self) -> int | None:
        """The live revision applied, which claims carry (``None``: no live entries)."""
        ...

    def now_ms(self) -> int:
        """The node's clock."""
        ...

    def is_late(self, firing: Firing, ahead_ms: int = 0) -> bool:
        """Whether the firing is (or will be in ``ahead_ms``) more than ``max_late`` behind
        the node's clock."""
        ...

    def until_release(self) -> None:
        """Wait until the release of the firings handed over: a wake the loop began a few
        milliseconds before it (to have its claims ready then) sends nothing earlier.
        Returns at once on any other wake, and once waited."""
        ...

    def was_held(self, firing: Firing) -> bool:
        """Whether this node saw the firing held pending by another node before."""
        ...

    def decide(self, firing: Firing, outcome: DecisionOutcome, *, recorded: bool = False) -> None:
        """The firing is done on this node: ``won``, ``lost``, ``late``, ...; ``recorded``
        when its history note was written with the store call that decided it."""
        ...

    def retry(self, firing: Firing, outcome: DecisionOutcome, *, requeue: bool = True) -> None:
        """The firing was not enqueued here and may be tried again until it is late;
        ``requeue`` false: counted and told only, the dispatcher tries it again itself,
        at once, in this wake (it stays the dispatcher's to decide)."""
        ...

    def sent(self, firing: Firing, outcome: DecisionOutcome) -> None:
        """The firing's message was handed to the broker (``outcome``: ``won`` or
        ``takeover``), told before any step after the send runs: from now on it is never
        retried, whatever raises. The dispatcher still decides it; a firing it leaves
        undecided, the loop decides ``outcome``."""
        ...

    def failed_after_send(self, firings: Sequence[Firing], step: str, exc: Exception) -> None:
        """A step after the send of ``firings`` (``step``: their history notes, the
        commit) raised ``exc``: counted and logged; they are not sent again."""
        ...

    def in_window(self, firings: Sequence[Firing]) -> None:
        """These sent firings were not committed while their claims were ours (the commit
        came after another node took them over): another node may have sent them too,
        under the same message id (the two-phase window). Counted, and shown in status."""
        ...

    def prepared(self, firing: Firing) -> object | None:
        """What :meth:`Dispatcher.prepare` built for ``firing``, handed back once;
        ``None`` when nothing was."""
        ...

    def history_notes(self, decided: Sequence[tuple[Firing, str]]) -> list[Note]:
        """The notes that record these outcomes in their addresses' history (or their
        fan-out occurrence's), to write with the commit that makes them so."""
        ...

    def history_template(self, firing: Firing) -> Note | NoteItem | None:
        """The history note of ``firing`` for a claim script to fill in and write when it
        wins (or skips) the firing: ``{{outcome}}``, ``{{at_ms}}`` and ``{{lateness_ms}}``
        in its value stand for what the script decides; or its item in a batch note (see
        :meth:`beatless.stores.redis.store.RedisStore.claim_and_push`)."""
        ...


class Dispatcher(ABC):
    """Claims due firings and enqueues the won ones: the loop's one seam to a store."""

    store: ClaimStore
    """The claim store behind the dispatcher (for rule 5, the clock and the epoch)."""

    prepares_ahead = False
    """Whether :meth:`prepare` builds anything: the loop calls it only then."""

    waits_for_release = False
    """Whether :meth:`dispatch` calls :meth:`Wake.until_release` itself, as late as it
    can (right before its first claim is sent); else the loop waits before calling it."""

    @abstractmethod
    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        """Claim and enqueue ``firings`` (due now, in release order); report each to ``wake``."""

    def prepare(self, firings: Sequence[Firing], wake: Wake) -> Sequence[object]:
        """Build now what :meth:`dispatch` will need for ``firings``, due within a
        second, one object (or ``None``) each: the loop keeps them and :meth:`dispatch`
        takes them back with :meth:`Wake.prepared`. Nothing it builds may depend on the
        instant of the send; without it, :meth:`dispatch` builds the same."""
        return [None] * len(firings)

    @property
    def settling(self) -> bool:
        """Whether a step after a send is still owed (a commit that failed): the loop
        then wakes at least every retry interval and calls :meth:`settle`."""
        return False

    def settle(self, wake: Wake) -> None:  # noqa: B027 - most dispatchers owe nothing
        """Do now what is owed from earlier sends (commit what failed to commit), on a
        wake with nothing to dispatch; never raises."""

    def close(self) -> None:  # noqa: B027 - most dispatchers have nothing to close
        """Close what the dispatcher opened itself."""


def decide_claimed(wake: Wake, firing: Firing, outcome: Outcome, *, recorded: bool = False) -> None:
    """Report a store outcome that needs no further step (lost, held, late, early, ...);
    a firing held off while the nodes re-seed, or claimed stale, is tried again."""
    if outcome in _TRIED_AGAIN:
        wake.retry(firing, _of_claim(outcome))
        return
    wake.decide(firing, _of_claim(outcome), recorded=recorded)


class TwoPhase(Dispatcher):
    """Claim pending, enqueue, commit, for any broker. See the module docstring.

    ``enqueue(firing)`` sends the firing's message; raising means it failed, and the claim
    is released so that another node or the next wake retries it. It should give up
    within :func:`send_deadline_s` of the lease (the integrations configure their broker
    clients so); a send that takes longer is logged, since its claim may have run out.

    Once ``enqueue`` returns, the firing is :meth:`Wake.sent`, and every later step runs
    in :meth:`_after_send`, where nothing raises. A commit that fails leaves its firings
    *uncommitted*: no firing is sent again until they are committed, on a later sub-batch
    or wake (the firings due meanwhile are retried ``commit_failed`` while not late), so
    the sends another node may repeat are those in flight when the store failed.
    """

    def __init__(
        self,
        store: ClaimStore,
        enqueue: Enqueue,
        *,
        lease: DurationLike = DEFAULT_LEASE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(store, ClaimStore):
            raise ConfigError(f"two-phase dispatch needs a ClaimStore, got {store!r}")
        self.store = store
        self.enqueue = enqueue
        self.lease_ms = lease_ms_of(lease)
        self.monotonic = monotonic
        self.rate = SendRate()
        self._failures = 0
        self._failure_warned: float | None = None
        self.uncommitted: list[Firing] = []
        """Sent firings whose commit failed: committed before anything more is sent."""
        self._lease_ends: dict[str, float] = {}
        """When the claim of each uncommitted firing runs out (monotonic clock), until it
        is told as not committed in time."""

    def __repr__(self) -> str:
        return f"TwoPhase({self.store!r}, lease={self.lease_ms}ms)"

    @property
    def settling(self) -> bool:
        return bool(self.uncommitted)

    def settle(self, wake: Wake) -> None:
        """Commit the :attr:`uncommitted` firings again, at once: a loop calls it on every
        wake while they wait (at least every retry interval), so a commit that failed on
        a cut connection is made on the next one before the lease runs out, even on a
        node with nothing due."""
        if self.uncommitted:
            self._commit_again(wake)

    def dispatch(self, firings: Sequence[Firing], wake: Wake) -> None:
        start = 0
        while start < len(firings):
            size = self.rate.sub_batch(self.lease_ms)
            fresh = _not_late(firings[start : start + size], wake)
            start += size
            if not fresh:
                continue
            if self.uncommitted and not self._commit_again(wake):
                for firing in fresh:  # nothing is claimed, so nothing is to release
                    wake.retry(firing, DecisionOutcome.COMMIT_FAILED)
                continue
            self._sub_batch(fresh, wake)

    def _sub_batch(self, firings: list[Firing], wake: Wake, *, again: bool = True) -> None:
        """Claim ``firings``, send the won, commit the sent, release the unsent. Won claims
        found too old to send are released and, with ``again``, claimed once more at once
        (:meth:`_claim_stale_again`)."""
        claimed_at = self.monotonic()
        revision = wake.live_revision
        requests = [claim_request(f, revision) for f in firings]
        outcomes = self.store.claim(requests, node=wake.node, lease_ms=self.lease_ms)
        sent: list[tuple[Firing, DecisionOutcome]] = []
        unsent: list[Firing] = []
        forgotten: list[Firing] = []
        stale: list[Firing] = []
        first_sent = 0.0
        for firing, outcome in zip(firings, outcomes, strict=True):
            if not outcome.is_won:
                decide_claimed(wake, firing, outcome)
            elif outcome is _WON and wake.was_held(firing):
                forgotten.append(firing)  # held by another node, now new: the store forgot
            elif self.uncommitted:  # a commit of this sub-batch failed: send nothing more
                wake.retry(firing, DecisionOutcome.COMMIT_FAILED)
                unsent.append(firing)
            elif again and self._is_stale(claimed_at):
                wake.retry(firing, DecisionOutcome.STALE_CLAIM, requeue=False)
                stale.append(firing)
                unsent.append(firing)
            elif self._send_one(
                firing,
                decided := _of_claim(outcome),
                claimed_at,
                wake,
                began := self.monotonic(),
            ):
                first_sent = first_sent if sent else began
                sent.append((firing, decided))
                if self.monotonic() - first_sent >= COMMIT_EVERY_S:
                    self._after_send(sent, wake, claimed_at)  # what is sent is soon committed
                    sent = []
            else:
                unsent.append(firing)
        if sent:  # most sub-batches of a fleet send nothing more here, or lose every claim
            self._after_send(sent, wake, claimed_at)
        if forgotten:
            self._forget(forgotten, wake)
        if unsent:
            self._release(unsent, wake.node)
        if stale:
            self._claim_stale_again(stale, wake)

    def _is_stale(self, claimed_at: float) -> bool:
        """Whether a claim made at ``claimed_at`` is too old to send on: half its lease."""
        return (self.monotonic() - claimed_at) * 1_000 >= self.lease_ms / 2

    def _claim_stale_again(self, firings: list[Firing], wake: Wake) -> None:
        """Claim again at once the firings whose won claims were too old to send (a claim
        answered late: a starved node, a link that held it), before the rest of the wake:
        the store answered, only too slowly, and these were released before the firings
        that follow, so they are the nearest to late. Once only: a claim again too old is
        retried as any other."""
        fresh = _not_late(firings, wake)
        size = self.rate.sub_batch(self.lease_ms)
        for start in range(0, len(fresh), size):
            self._sub_batch(fresh[start : start + size], wake, again=False)

    def _send_one(
        self, firing: Firing, outcome: DecisionOutcome, claimed_at: float, wake: Wake, now: float
    ) -> bool:
        """Send one won firing (``outcome``: ``won`` or ``takeover``) if its claim is still
        young and it is not late; once sent, it is :meth:`Wake.sent` before anything else."""
        age_ms = (now - claimed_at) * 1_000
        if age_ms >= self.lease_ms / 2:
            wake.retry(firing, DecisionOutcome.STALE_CLAIM)
            return False
        if wake.is_late(firing, ahead_ms=self.rate.expected_ms()):
            wake.decide(firing, DecisionOutcome.LATE)  # it would reach the broker late
            return False
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(SENDING, firing.id, shown(firing.entry.name), age_ms)
        began = self.monotonic()
        try:
            self.enqueue(firing)
        except Exception as exc:
            self._warn_failed(firing, exc)
            wake.retry(firing, DecisionOutcome.ENQUEUE_FAILED)
            return False
        wake.sent(firing, outcome)
        took = self.monotonic() - began
        self.rate.observe(took)
        if took > send_deadline_s(self.lease_ms):
            logger.warning(
                "firing %s of entry %s: the send took %.1fs, over its %.1fs deadline; if its "
                "claim ran out meanwhile another node may send it too, under the same id",
                firing.id,
                shown(firing.entry.name),
                took,
                send_deadline_s(self.lease_ms),
            )
        return True

    def _warn_failed(self, firing: Firing, exc: Exception) -> None:
        """One WARNING per ``FAILURE_WARN_S`` for failed sends, with the count since the
        last one: a dead broker under a big fan-out is a line every few seconds."""
        self._failures += 1
        now = self.monotonic()
        if self._failure_warned is not None and now - self._failure_warned < FAILURE_WARN_S:
            return
        logger.warning(
            "firing %s of entry %s: enqueue failed (%s: %s); %d failed send(s) since the last "
            "warning; their claims are released and the firings retried while not late",
            firing.id,
            shown(firing.entry.name),
            type(exc).__name__,
            shown(exc, quoted=False, limit=ERROR_LIMIT),
            self._failures,
            exc_info=logger.isEnabledFor(logging.DEBUG),
        )
        self._failure_warned, self._failures = now, 0

    def _after_send(
        self, sent: list[tuple[Firing, DecisionOutcome]], wake: Wake, claimed_at: float
    ) -> None:
        """Every step after a send, in one place that never raises: commit the sent
        firings with their history notes, and decide each. A step that fails is counted
        and logged (:meth:`Wake.failed_after_send`); a commit that fails keeps the
        firings :attr:`uncommitted`, which stops the sends until one succeeds."""
        if not sent:
            return
        firings = [f for f, _ in sent]
        notes = self._history(wake, sent)
        kept, recorded = self._commit(firings, wake, notes, claimed_at)
        self._tell_taken_over(firings, kept, wake)
        for firing, outcome in sent:  # won or takeover: decided as is (decide_claimed)
            wake.decide(firing, outcome, recorded=recorded)

    def _tell_taken_over(self, firings: list[Firing], kept: list[bool], wake: Wake) -> None:
        """Sent firings whose commit found them taken over: each said at WARNING, and
        counted as the two-phase window (:meth:`Wake.in_window`)."""
        taken = [f for f, ok in zip(firings, kept, strict=True) if not ok]
        for firing in taken:
            logger.warning(LATE_COMMIT, firing.id, shown(firing.entry.name))
        if taken:
            wake.in_window(taken)

    def _commit(
        self, firings: list[Firing], wake: Wake, notes: Sequence[Note], claimed_at: float
    ) -> tuple[list[bool], bool]:
        """Commit the sent ``firings`` with ``notes``: per firing, whether it was kept, and
        whether the notes were written. A commit that fails (a store error, or anything a
        store raises) is told once, and its firings are kept to be committed again."""
        try:
            kept = self.store.commit([f.id for f in firings], node=wake.node, notes=notes)
        except StoreFull as exc:
            if exc.kept is None:
                return self._commit_failed(firings, wake, exc, claimed_at)
            return exc.kept, False  # committed without room; the notes follow at a sync
        except Exception as exc:
            return self._commit_failed(firings, wake, exc, claimed_at)
        return kept, self.store.commits_notes

    def _commit_failed(
        self, firings: list[Firing], wake: Wake, exc: Exception, claimed_at: float
    ) -> tuple[list[bool], bool]:
        """A commit that failed: told once, its firings kept to be committed again."""
        wake.failed_after_send(firings, "commit", exc)
        self.uncommitted += firings
        lease_end = claimed_at + self.lease_ms / 1_000
        self._lease_ends.update((f.id, lease_end) for f in firings)
        logger.warning(
            COMMIT_FAILED,
            len(firings),
            shown(exc, quoted=False, limit=ERROR_LIMIT),
            ", ".join(f.id for f in firings[:5]) + (", ..." if len(firings) > 5 else ""),
        )
        return [True] * len(firings), False

    def _commit_again(self, wake: Wake) -> bool:
        """Commit the :attr:`uncommitted` firings (without their notes: their history is
        posted at the node's next sync); whether it succeeded, so sends may go on. One
        whose claim another node took meanwhile is told as the two-phase window."""
        firings = self.uncommitted
        try:
            kept = self.store.commit([f.id for f in firings], node=wake.node)
        except Exception:
            self._tell_run_out()
            return False
        self.uncommitted = []
        self._lease_ends.clear()
        logger.info(
            "commit of %d sent firing(s) succeeded again (%d had been taken over); sending goes on",
            len(firings),
            kept.count(False),
        )
        self._tell_taken_over(firings, kept, wake)
        return True

    def _tell_run_out(self) -> None:
        """Say, once per firing, which uncommitted firings' leases have run out: from now
        on another node may claim and send them too (committed later, one found taken
        over is counted as the two-phase window)."""
        now = self.monotonic()
        ran_out = [f for f in self.uncommitted if self._lease_ends.get(f.id, now) <= now]
        for firing in ran_out:
            if self._lease_ends.pop(firing.id, None) is not None:
                logger.warning(
                    NOT_COMMITTED_IN_TIME, firing.id, shown(firing.entry.name), self.lease_ms
                )

    def _forget(self, firings: list[Firing], wake: Wake) -> None:
        """Firings the store forgot: keep them committed, unsent, so no node sends them."""
        if not firings:
            return
        notes = self._history(wake, [(f, DecisionOutcome.FORGOTTEN) for f in firings])
        try:
            self.store.commit([f.id for f in firings], node=wake.node, notes=notes)
            recorded = self.store.commits_notes
        except StoreError as exc:
            recorded = False
            logger.warning(
                "could not commit %d forgotten firing(s) (%s): when their leases run out, "
                "another node may send them",
                len(firings),
                shown(exc, quoted=False, limit=ERROR_LIMIT),
            )
        for firing in firings:
            wake.decide(firing, DecisionOutcome.FORGOTTEN, recorded=recorded)

    def _history(self, wake: Wake, decided: Sequence[tuple[Firing, str]]) -> list[Note]:
        """The history notes to write with a commit: on a store that writes them in the
        commit's own operation; elsewhere the node posts them at its next sync, off the
        loop, since nothing would be gained by waiting for them here. Notes that cannot
        be built are told and left out: the commit goes on without them."""
        if not self.store.commits_notes:
            return []
        try:
            return wake.history_notes(decided)
        except Exception as exc:
            wake.failed_after_send([f for f, _ in decided], "history notes", exc)
            return []

    def _release(self, firings: list[Firing], node: str) -> None:
        if not firings:
            return
        try:
            self.store.release([f.id for f in firings], node=node)
        except StoreError as exc:
            logger.warning(
                "could not release %d claim(s) (%s); their leases run out instead",
                len(firings),
                shown(exc, quoted=False, limit=ERROR_LIMIT),
            )


def _not_late(firings: Sequence[Firing], wake: Wake) -> list[Firing]:
    """``firings`` but the late ones, which are decided ``late`` here."""
    fresh = []
    for firing in firings:
        if wake.is_late(firing):
            wake.decide(firing, DecisionOutcome.LATE)
        else:
            fresh.append(firing)
    return fresh


def dispatch_now(dispatcher: Dispatcher, firings: Sequence[Firing], *, node: str) -> list[str]:
    """Dispatch ``firings`` once, outside the loop; the outcome name of each, in order."""
    recorder = Recorder(node)
    dispatcher.dispatch(firings, recorder)
    return [recorder.outcomes.get(f.id, "undecided") for f in firings]
