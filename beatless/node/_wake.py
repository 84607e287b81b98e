"""What the dispatchers report to the loop: the :class:`~beatless.node.dispatch.Wake` of a
node, one object for its whole life.

Every firing handed to a dispatcher comes back decided (:meth:`LoopWake.decide`) or to be
tried again (:meth:`LoopWake.retry`); one sent to the broker is told first
(:meth:`LoopWake.sent`), so that nothing after the send can make it go again. A decision
is counted (:mod:`beatless.node._tally`), settled with the preferred claimer, and told
(history, the decisions log, the ``on_decision`` hook) through the loop's ``report``; a
retry goes back into the timeline. What each firing is meanwhile is kept in its
:class:`~beatless.node._inflight.Flight`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from beatless.node._ahead import BuildAhead
from beatless.node._board import Board
from beatless.node._inflight import InFlight
from beatless.node._judging import Judging
from beatless.node._live import LiveView
from beatless.node._prefer import Preference
from beatless.node._reseed import Reseeder
from beatless.node._tally import Tally
from beatless.node._timeline import Timeline
from beatless.schedule.firing import Decision, Firing
from beatless.schedule.outcomes import DecisionOutcome
from beatless.stores.base import Note, NoteItem

# An Enum class's attribute is a slow look-up on Python 3.11 (EnumType.__getattr__): the
# path of every claim names these through module names.
_SENT = DecisionOutcome.SENT

RETRY_MS = 500
"""A firing whose claim or enqueue failed is tried again after this long, until late."""
AT_ONCE = frozenset({DecisionOutcome.STALE_CLAIM})
"""Retries that wait for nothing: the store answered, only too slowly to send on that
answer. A claim found too old to send (a call that took half the lease: a slow or
starved node, or a link that delivered it late) is claimed again at once, while the firing
may still be sent in time; a wait of ``RETRY_MS`` only brings it closer to late."""

Report = Callable[[Decision, "tuple[int, int] | None", bool], None]
"""How a decision is told: with the occurrences it coalesced, and whether its history
note was written already."""


class LoopWake:
    """The loop's side of every dispatch, for the node ``node`` whose clock is ``now_ms``:
    ``flights`` keeps each firing's state,
    ``tally`` counts, ``timeline`` takes retries, ``ahead`` hands back what was built,
    ``board`` writes history notes, ``report`` tells each decision, ``judging`` takes the
    late firings this node cannot judge alone (unjudged, or seen held), ``live`` is the
    node's view of its live entries (the revision its claims carry)."""

    def __init__(
        self,
        node: str,
        *,
        now_ms: Callable[[], int],
        lease_ms: int,
        flights: InFlight,
        tally: Tally,
        timeline: Timeline,
        ahead: BuildAhead,
        preference: Preference,
        board: Board,
        reseeder: Reseeder,
        report: Report,
        judging: Judging,
        live: LiveView,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.node = node
        self.now_ms = now_ms
        """The node's clock, in epoch milliseconds rounded down (never early)."""
        self.lease_ms = lease_ms
        self.flights = flights
        self._tally = tally
        self._timeline = timeline
        self._ahead = ahead
        self._preference = preference
        self._board = board
        self._reseeder = reseeder
        self._report = report
        self._judging = judging
        self._live = live
        self._clock = clock
        self._sleep = sleep
        self.release_ms: int | None = None
        """The release a wake begun ahead of it waits for before it sends (``None``: the
        wake is at or past the release of what it dispatches)."""

    @property
    def live_revision(self) -> int | None:
        """The live revision the loop applied, which its claims carry (``None``: off)."""
        return self._live.revision if self._live.enabled else None

    def is_late(self, firing: Firing, ahead_ms: int = 0) -> bool:
        return self.now_ms() + ahead_ms - firing.occurrence_ms > firing.entry.max_late_ms

    def until_release(self) -> None:
        """Sleep until the node's clock reaches :attr:`release_ms`, if set, and clear it."""
        release, self.release_ms = self.release_ms, None
        if release is None:
            return
        while (left_ms := release - self._clock() * 1_000) > 0:
            self._sleep(left_ms / 1_000)

    def was_held(self, firing: Firing) -> bool:
        flight = self.flights.get(firing)
        return flight is not None and flight.held

    def decide(self, firing: Firing, outcome: str, *, recorded: bool = False) -> None:
        """Record this node's final decision for ``firing``; ``recorded`` when its history
        note was written with the store call that decided it. The firing leaves the wake
        first: what fails after that (counters, history, hooks) is counted and logged,
        never a reason to try the firing again. An unjudged firing gone ``late``, or one
        this node saw held by another node, is not decided yet: the store is asked who
        holds it first (:mod:`._judging`)."""
        if outcome == "late" and self.flights.judging(firing):
            self._judging.add(firing)
            return
        flight, sent_as = self.flights.finish(firing)
        if flight is not None and flight.reseeding and outcome == DecisionOutcome.LATE:
            # held off until late: the fleet could not re-seed it
            outcome = DecisionOutcome.FORGOTTEN
        if outcome in _SENT and not sent_as:
            self._reseeder.sent(firing)  # won without a send told (:meth:`sent` was not)
        try:  # count, settle and report it
            now = self.now_ms()
            self._tally.count(firing, outcome, now, seen_held=flight is not None and flight.held)
            self._settle(firing, outcome)
            coalesced = None if flight is None else flight.coalesced
            if outcome == "held":
                self._recheck_held(firing, now, coalesced)
                coalesced = None
            self._report(
                Decision(firing, outcome, self.node, now - firing.release_ms), coalesced, recorded
            )
        except Exception as exc:
            self._tally.failed_step([firing], f"recording its outcome '{outcome}'", exc)

    def _recheck_held(self, firing: Firing, now: int, coalesced: tuple[int, int] | None) -> None:
        """A firing another node holds pending is looked at again once the holder's lease
        has run out: claimed, and taken over if it ran out uncommitted, while it is not
        late; else the store is asked who holds it then (:mod:`._judging`), so that a
        firing the holder gives up unsent is decided ``missed``, never left ``held``."""
        self.flights.hold(firing, coalesced)
        again = now + self.lease_ms + RETRY_MS
        if again - firing.occurrence_ms <= firing.entry.max_late_ms:
            self._timeline.add(again, firing)
        else:
            self._judging.recheck(firing, now, self.lease_ms + RETRY_MS)

    def retry(self, firing: Firing, outcome: str, *, requeue: bool = True) -> None:
        """``firing`` was not enqueued: count why, and try it again soon, until late;
        ``requeue`` false: count and tell why only, since the dispatcher tries it again
        itself in this wake (it stays open, so a dispatch that raises leaves it retried)."""
        now = self.now_ms()
        if requeue:
            if not self.flights.retried(firing):
                return  # sent already: never tried again (the dispatcher decides it)
            if outcome == DecisionOutcome.RESEEDING:
                self.flights.held_off(firing)
            again = now + RETRY_MS
            if outcome == DecisionOutcome.STALE_REVISION and self._live.stale():
                again = now  # the loop reads the live head first, then claims under it
            elif outcome in AT_ONCE:
                again = now
            self._timeline.add(again, firing)
        try:
            self._tally.count(firing, outcome, now, seen_held=self.flights.was_held(firing))
            self._settle(firing, outcome)
            self._report(Decision(firing, outcome, self.node, now - firing.release_ms), None, False)
        except Exception as exc:
            self._tally.failed_step([firing], f"recording its retry '{outcome}'", exc)

    def sent(self, firing: Firing, outcome: str) -> None:
        """``firing`` was handed to the broker: it leaves the firings to retry at once,
        before any step after the send can fail."""
        self.flights.sent(firing, outcome)
        self._reseeder.sent(firing)  # before any step after the send

    def in_window(self, firings: Sequence[Firing]) -> None:
        """Sent firings found taken over at their commit: counted per entry
        (``two_phase_window``, in the registry's counters and so in status)."""
        self._tally.in_window(firings)

    def failed_after_send(self, firings: Sequence[Firing], step: str, exc: Exception) -> None:
        """A step after a decision or a send failed: counted per entry
        (``post_send_errors``) and logged, one WARNING per minute; never retried."""
        self._tally.failed_step(firings, step, exc)

    def prepared(self, firing: Firing) -> object | None:
        """What the dispatcher built ahead for ``firing``, once; ``None`` if nothing."""
        return self._ahead.take(firing)

    def history_notes(self, decided: Sequence[tuple[Firing, str]]) -> list[Note]:
        """The history notes of this node's outcomes for ``decided``, written with the
        commit that makes them so (the two-phase path)."""
        history, sent, flights = DecisionOutcome.HISTORY, DecisionOutcome.SENT, self.flights
        written = [
            (firing, outcome, flights.coalesced(firing) if outcome in sent else None)
            for firing, outcome in decided
            if outcome in history
        ]
        return self._board.decision_notes(written, self.now_ms())

    def history_template(self, firing: Firing) -> Note | NoteItem | None:
        """The history note of ``firing`` for the atomic path's claim script to complete."""
        return self._board.history_template(firing, self.now_ms(), self.flights.coalesced(firing))

    def _settle(self, firing: Firing, outcome: str) -> None:
        if self._preference.enabled and not firing.manual:
            late_ms = firing.occurrence_ms + firing.entry.max_late_ms
            plain = firing.tenant is None
            self._preference.decided(firing.id, firing.release_ms, late_ms, outcome, plain=plain)
