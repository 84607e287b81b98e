"""Late firings this node could not judge alone: asked about before any of them is said
missed, or said nothing of.

Two kinds of firing wait here, and at each wake the node asks the store who holds the
waiting firings that are due, in one *judging claim*
(:func:`~beatless.stores.base.judging`) that never wins a firing nobody holds:

* a firing whose every claim the store refused as full or refusing (*unjudged*,
  :mod:`beatless.node._inflight`): another node may have claimed it just before the store
  filled, and sent it (its commit went through without room), so it is not decided
  ``missed`` on the spot when it goes late; it is asked about at the next wake;
* a firing this node saw held pending by another node (*held*) too late to take it over
  when the holder's lease runs out, or that went late before this node looked again: the
  holder may still commit it, or give it up unsent (release its claim, or let its lease
  run out). It is asked about once the holder's lease has run out
  (:meth:`Judging.recheck`), so that a firing nobody sends is never left ``held``.

What the judging claim answers decides:

* nobody holds it (``late``): ``missed``; the judging claim writes nothing, so the node
  writes the firing's ``missed`` note in the history at its next sync (as for any decision
  of its own), and the fleet's missed-firing sweep finds it counted;
* another node committed it (``lost``, or ``foreign`` for a claim of another task):
  decided so, as for any firing another node took; never missed, never sent;
* another node holds it pending (``held``): decided ``held`` again, and asked about again
  once that lease has run out (:meth:`beatless.node._wake.LoopWake.decide`);
* the store holds a record it cannot read: ``corrupt``, as a claim would be told;
* this node's own pending claim (a claim whose answer was lost, then refused as full
  until late, or a firing taken over and not sent in time): renewed by the judging claim
  as any claim of its holder is, then released; ``missed``, since this node never sent it.

A store that still refuses (full, refusing, unreachable) leaves the firings waiting,
asked again at the next wake, until their memory runs out (``memory_ms`` from the
occurrence, or from when it was last seen held: a commit made since is remembered that
long). Past that even the store may have forgotten a claim, so a claim's answer no longer
tells a sent firing from a missed one: the firings' history does (the sender writes a
sent firing's note with its commit, or at its next sync). Sent by another node: ``lost``.
Not sent: ``missed``, told at WARNING as firings that could not be judged, once the
history has said so for :data:`HISTORY_SETTLE_MS` (a sender whose store refused it too
posts its notes at its first sync after the store answers again). A history that cannot
be read either leaves them waiting up to :data:`HISTORY_WAIT_MS` more, read again at each
wake, then ``missed``. A node that stops asks once more and decides what is left so too:
a miss is never silent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from beatless.core._logtext import ERROR_LIMIT, shown
from beatless.errors import StoreError
from beatless.fleet._missed import sent_in_history
from beatless.fleet._notes import SYNC_EVERY_MS
from beatless.node._tally import WARN_EVERY_MS, Tally
from beatless.schedule.firing import Firing, claim_request
from beatless.stores.base import ClaimStore, Outcome, judging

logger = logging.getLogger("beatless.node.scheduler")

JUDGED = {
    Outcome.LATE: "missed",
    Outcome.HELD: "held",
    Outcome.LOST: "lost",
    Outcome.FOREIGN: "foreign",
    Outcome.CORRUPT: "corrupt",
}
"""The decision of a waiting firing, by what its judging claim was answered. Any other
answer (this node's own pending claim, won again) is ``missed``."""

HISTORY_WAIT_MS = 60_000
"""A firing past its memory whose history cannot be read waits this much longer for the
store to answer before it is decided ``missed`` without any word of the fleet."""
HISTORY_SETTLE_MS = 2 * SYNC_EVERY_MS
"""A firing past its memory is decided ``missed`` once its history has shown no send for
this long: two syncs of a sender that posts its notes late."""


class Decide(Protocol):
    """How a judged firing is decided: :meth:`beatless.node._wake.LoopWake.decide`."""

    def __call__(self, firing: Firing, outcome: str, *, recorded: bool = False) -> None: ...


@dataclass(slots=True)
class Waiting:
    """One firing waiting for the store's judgment."""

    firing: Firing
    ask_ms: int
    """Not asked about before this instant (node clock)."""
    until_ms: int
    """Past this instant even the store may have forgotten a claim: judged by the
    firing's history, not by a claim."""
    unsent_ms: int | None = None
    """When the history, past the memory, was first read without a send of the firing."""


class Judging:
    """The late firings waiting for the store's judgment, asked about with ``store``'s
    claims as ``node`` (its own pending claims renewed for ``lease_ms``, then released)."""

    def __init__(self, store: ClaimStore, node: str, lease_ms: int, tally: Tally) -> None:
        self._store = store
        self._node = node
        self._lease_ms = lease_ms
        self._tally = tally
        self._waiting: dict[str, Waiting] = {}

    def add(self, firing: Firing) -> None:
        """``firing``, unjudged or seen held, went late: ask the store about it at the next
        wake, until its memory from the occurrence runs out."""
        until = firing.occurrence_ms + firing.entry.memory_ms
        self._waiting[firing.id] = Waiting(firing, 0, until)

    def recheck(self, firing: Firing, seen_ms: int, after_ms: int) -> None:
        """``firing``, seen held by another node at ``seen_ms``, would be late by the time
        the holder's lease runs out: ask the store about it ``after_ms`` later, once that
        lease has run out (at the latest half-way through the memory of a commit made
        since ``seen_ms``, so that a commit is still remembered when asked)."""
        memory = firing.entry.memory_ms
        ask = seen_ms + min(after_ms, memory // 2)
        self._waiting[firing.id] = Waiting(firing, ask, seen_ms + memory)

    def __len__(self) -> int:
        return len(self._waiting)

    def judge(self, now: int, decide: Decide, *, last: bool = False) -> None:
        """Ask the store who holds each waiting firing due to be asked, in one judging
        claim, and decide those it answers; those past their memory first, unjudged. With
        ``last`` (the node stops), every waiting firing is asked now, and what the store
        does not answer is decided unjudged too."""
        if not self._waiting:
            return
        forgotten = [w for w in self._waiting.values() if now > w.until_ms]
        if forgotten:  # even the store may have forgotten who held them
            self._by_history(forgotten, now, decide, last=last)
        firings = [
            w.firing
            for w in self._waiting.values()
            if (last or w.ask_ms <= now) and now <= w.until_ms
        ]
        if not firings:
            return
        try:
            outcomes = self._store.claim(
                [judging(claim_request(f)) for f in firings],
                node=self._node,
                lease_ms=self._lease_ms,
            )
        except Exception as exc:
            self._still_unjudged(firings, exc, now, decide, last=last)
            return
        own = [f for f, o in zip(firings, outcomes, strict=True) if o.is_won]
        self._release(own)
        for firing, outcome in zip(firings, outcomes, strict=True):
            del self._waiting[firing.id]  # before its decision: held, it waits again
            decide(firing, JUDGED.get(outcome, "missed"))

    def _by_history(self, waiting: list[Waiting], now: int, decide: Decide, *, last: bool) -> None:
        """Decide the firings past their memory by their history: sent by another node,
        ``lost``; shown unsent for :data:`HISTORY_SETTLE_MS`, ``missed``. A history that
        cannot be read keeps them waiting, up to :data:`HISTORY_WAIT_MS` past the memory
        (``last``: the node stops, so they are decided now)."""
        try:
            sent = sent_in_history(self._store, [w.firing for w in waiting])
        except Exception as exc:  # a bug is told, and the history taken as unreadable
            if not isinstance(exc, StoreError):
                logger.exception("reading the history of %d late firing(s) failed", len(waiting))
            for w in waiting:
                if last or now > w.until_ms + HISTORY_WAIT_MS:
                    self._unjudged(w.firing, now, decide)
            return
        for w in waiting:
            if w.firing.id in sent:
                del self._waiting[w.firing.id]
                decide(w.firing, "lost")
                continue
            if w.unsent_ms is None:
                w.unsent_ms = now
            if last or now - w.unsent_ms >= HISTORY_SETTLE_MS:
                self._unjudged(w.firing, now, decide)

    def _still_unjudged(
        self, firings: list[Firing], exc: Exception, now: int, decide: Decide, *, last: bool
    ) -> None:
        """The store did not answer: the firings wait for the next wake, unless the node
        stops or the error is not the store's (a bug is not retried)."""
        if isinstance(exc, StoreError) and not last:
            return
        if not isinstance(exc, StoreError):
            logger.exception("judging %d late firing(s) failed", len(firings))
        for firing in firings:
            self._unjudged(firing, now, decide)

    def _unjudged(self, firing: Firing, now: int, decide: Decide) -> None:
        """Decide ``firing`` missed without the store's word, and say so."""
        del self._waiting[firing.id]
        self._tally.unjudged(firing, now)
        decide(firing, "missed")

    def _release(self, firings: list[Firing]) -> None:
        """Release this node's own pending claims that judging claims renewed."""
        if not firings:
            return
        try:
            self._store.release([f.id for f in firings], node=self._node)
        except StoreError as exc:
            if self._tally.may_warn("judging release", WARN_EVERY_MS):
                logger.warning(
                    "could not release %d claim(s) of late firings (%s); their leases run "
                    "out instead",
                    len(firings),
                    shown(exc, quoted=False, limit=ERROR_LIMIT),
                )
